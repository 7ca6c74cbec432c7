//! Input pull: backends reading batches of inputs one-sided from a frontend's
//! region, the shape of the paper's incast benchmark (Symphony, Appendix B), over
//! loopback TCP, in the clear and through the cluster's secure channel (a
//! transport with a cluster key: every byte sealed and opened), with one or more
//! connections per peer, and, for comparison, the in-process transport and the
//! link itself in the same run.
//!
//! ```text
//! cargo bench --bench input_pull                        # full run, about a minute
//! cargo bench --bench input_pull -- --backends 8 --batches 1,8,32,64 --secs 1 --repeats 3
//! cargo bench --bench input_pull -- --backends 1 --batches 64 --inputs 128 --input-bytes 602112
//! cargo bench --bench input_pull -- --backends 1 --batches 32 --inputs 128 --input-bytes 602112 --streams 1 --into gather,rows
//! FERMATA_BACKENDS=2 cargo bench --bench input_pull
//! ```
//!
//! Under `cargo test --all-targets` cargo runs this binary without `--bench`; it then
//! does a tiny run (a smoke test that it still builds and works, well under 3 s).
//!
//! # Setup
//! One frontend region server holds `--inputs` (default 256) inputs of
//! `--input-bytes` (default 150528: 224 x 224 x 3, one ImageNet image as u8), each
//! in a slot with its 16-byte header. `--backends` threads (default 4, or
//! `FERMATA_BACKENDS`), each with its own [`RegionReader`] as a backend process
//! would have, pull batches of N inputs with one `read_many_into` each (N consecutive
//! slots from a random start, into the buffers of the batch before, as a backend
//! recycles them) as fast as they can for `--secs` seconds; every slot's header is
//! checked. In the paper eight servers each serve eight 150 KB
//! objects to one reader (many-to-one); here B readers share one server, which on
//! one machine puts the same pressure on the one server and the loopback device.
//! The TCP rows come once per `--streams` count K (default 1,2): the readers'
//! connections per peer, over which a large `read_many` is split.
//!
//! `--into` (default `buffers`) says where a batch's inputs land, one set of
//! rows per mode: `buffers`, the recycled buffers above (an emulated GPU's
//! pull); `gather`, those buffers and then each payload copied into its row
//! of the batch's tensor (an executor's batch pulled without staging);
//! `rows`, straight into the rows of the tensor
//! (`RegionReader::read_many_rows`, an executor that stages the model), so
//! `rows` against `gather` is what reading into the rows saves.
//! The `link` row is one plain loopback connection and one reader asking for a
//! batch's bytes and getting them from memory: what one connection carries.
//!
//! # Figures (medians over `--repeats` runs)
//! * inputs/s and GB/s (10^9 bytes of slots) over all backends;
//! * batch latency p50 / p99: one `read_many` of N inputs, issue to last answer;
//! * input latency p50 / p99: batch latency / N, the pull cost per input a backend
//!   (the backend reports its pull cost per batch, not per input: `core::pull`);
//! * CPU ms per GB: the process's CPU time (readers and server, user and system)
//!   per GB pulled, what the bytes cost whatever else runs on the machine;
//! * per K, the channel's figures against TCP in the clear (`channel/tcp xK`) and
//!   against the link (`channel/link xK`).

use fermata::transport::inproc::InProc;
use fermata::transport::tcp::Tcp;
use fermata::transport::{ReadReq, Region, RegionServer, SlotHeader, Transport};
use hdrhistogram::Histogram;
use rand::{Rng, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const INPUT_BYTES: usize = 224 * 224 * 3;

struct Cfg {
    backends: usize,
    batches: Vec<usize>,
    inputs: usize,
    input_bytes: usize,
    /// The region reader's connections per peer, one pair of TCP rows each.
    streams: Vec<usize>,
    secs: f64,
    repeats: usize,
    /// Where the inputs land, one set of rows each.
    into: Vec<Land>,
}

/// Where a pull's inputs land (`--into`).
#[derive(Clone, Copy, PartialEq)]
enum Land {
    Buffers,
    Gather,
    Rows,
}

impl Land {
    fn parse(list: &str) -> Vec<Land> {
        list.split(',')
            .map(|m| match m.trim() {
                "buffers" => Land::Buffers,
                "gather" => Land::Gather,
                "rows" => Land::Rows,
                other => panic!("--into: `{other}` is not buffers, gather or rows"),
            })
            .collect()
    }
    /// The suffix of its rows' names.
    fn suffix(self) -> &'static str {
        match self {
            Land::Buffers => "",
            Land::Gather => " gather",
            Land::Rows => " rows",
        }
    }
}

impl Cfg {
    fn from_args() -> Cfg {
        let args: Vec<String> = std::env::args().collect();
        let full = args.iter().any(|a| a == "--bench");
        let mut cfg = if full {
            Cfg {
                backends: 4,
                batches: vec![1, 8, 32],
                inputs: 256,
                input_bytes: INPUT_BYTES,
                streams: vec![1, 2],
                secs: 1.0,
                repeats: 3,
                into: vec![Land::Buffers],
            }
        } else {
            Cfg {
                backends: 2,
                batches: vec![1, 8],
                inputs: 32,
                input_bytes: INPUT_BYTES,
                streams: vec![1, 2],
                secs: 0.05,
                repeats: 1,
                into: vec![Land::Buffers, Land::Rows],
            }
        };
        if let Ok(v) = std::env::var("FERMATA_BACKENDS") {
            cfg.backends = v.parse().expect("FERMATA_BACKENDS: a number");
        }
        let mut it = args.iter().skip(1);
        while let Some(a) = it.next() {
            let mut val = |name: &str| -> String {
                it.next()
                    .unwrap_or_else(|| panic!("{name} needs a value"))
                    .clone()
            };
            match a.as_str() {
                "--backends" => cfg.backends = val(a).parse().expect("--backends N"),
                "--batches" => cfg.batches = counts(&val(a), "--batches N,N,..."),
                "--inputs" => cfg.inputs = val(a).parse().expect("--inputs N"),
                "--input-bytes" => cfg.input_bytes = val(a).parse().expect("--input-bytes B"),
                "--streams" => cfg.streams = counts(&val(a), "--streams K,K,..."),
                "--secs" => cfg.secs = val(a).parse().expect("--secs S"),
                "--repeats" => cfg.repeats = val(a).parse().expect("--repeats N"),
                "--into" => cfg.into = Land::parse(&val(a)),
                _ => {} // --bench and cargo's own flags
            }
        }
        assert!(cfg.backends > 0 && cfg.inputs > 0 && cfg.repeats > 0);
        assert!(cfg.input_bytes > 0 && !cfg.streams.is_empty() && !cfg.into.is_empty());
        cfg
    }
}

/// A comma-separated list of counts (`usage` when one is not a count).
fn counts(list: &str, usage: &str) -> Vec<usize> {
    list.split(',')
        .map(|s| s.trim().parse().expect(usage))
        .collect()
}

#[derive(Clone, Copy, Default)]
struct Stats {
    inputs_per_s: f64,
    gb_per_s: f64,
    batch_p50_us: f64,
    batch_p99_us: f64,
    input_p50_us: f64,
    input_p99_us: f64,
    /// CPU time of the whole process (readers and server) per GB pulled, in
    /// ms: what the bytes cost, less sensitive than the rate to other work on
    /// the machine.
    cpu_ms_per_gb: f64,
}

impl Stats {
    fn fields(&self) -> [f64; 7] {
        [
            self.inputs_per_s,
            self.gb_per_s,
            self.batch_p50_us,
            self.batch_p99_us,
            self.input_p50_us,
            self.input_p99_us,
            self.cpu_ms_per_gb,
        ]
    }
    fn from_fields(f: [f64; 7]) -> Stats {
        Stats {
            inputs_per_s: f[0],
            gb_per_s: f[1],
            batch_p50_us: f[2],
            batch_p99_us: f[3],
            input_p50_us: f[4],
            input_p99_us: f[5],
            cpu_ms_per_gb: f[6],
        }
    }
    /// The figures of `inputs` inputs of `slot_bytes` each pulled in `secs`,
    /// in batches of `n` whose times (ns) are in `hist`.
    /// `cpu_s`: the process's CPU time meanwhile.
    fn of_run(
        hist: &Histogram<u64>,
        inputs: u64,
        n: usize,
        slot_bytes: f64,
        secs: f64,
        cpu_s: f64,
    ) -> Stats {
        let count = inputs as f64;
        let us = |q: f64| hist.value_at_quantile(q) as f64 / 1e3;
        Stats {
            cpu_ms_per_gb: cpu_s * 1e3 / (count * slot_bytes / 1e9).max(1e-12),
            inputs_per_s: count / secs,
            gb_per_s: count * slot_bytes / secs / 1e9,
            batch_p50_us: us(0.5),
            batch_p99_us: us(0.99),
            input_p50_us: us(0.5) / n as f64,
            input_p99_us: us(0.99) / n as f64,
        }
    }
    /// Each figure's median over runs.
    fn median(runs: &[Stats]) -> Stats {
        let mut out = [0.0; 7];
        for (k, o) in out.iter_mut().enumerate() {
            let mut v: Vec<f64> = runs.iter().map(|r| r.fields()[k]).collect();
            v.sort_by(f64::total_cmp);
            *o = v[v.len() / 2];
        }
        Stats::from_fields(out)
    }
}

/// The frontend: a region with `n` inputs, served by `tr`.
struct Frontend {
    server: Box<dyn RegionServer>,
    /// (task id, offset, slot len) of each input.
    slots: Vec<(u64, u64, u32)>,
}

fn frontend(tr: &dyn Transport, region: &Arc<Region>, slots: &[(u64, u64, u32)]) -> Frontend {
    let addr = if tr.name() == "tcp" {
        "127.0.0.1:0"
    } else {
        ""
    };
    Frontend {
        server: tr.serve_region(region.clone(), addr).expect("serve region"),
        slots: slots.to_vec(),
    }
}

fn run_once(
    tr: &dyn Transport,
    fe: &Frontend,
    cfg: &Cfg,
    n: usize,
    seed: u64,
    into: Land,
) -> Stats {
    let readers: Vec<_> = (0..cfg.backends)
        .map(|_| {
            let r = tr.reader().expect("reader");
            r.attach(0, &fe.server.info()).expect("attach");
            r
        })
        .collect();
    let barrier = Barrier::new(cfg.backends + 1);
    let run_for = Duration::from_secs_f64(cfg.secs);
    let timeout = Duration::from_secs(5);
    let (hist, count, elapsed) = std::thread::scope(|sc| {
        let handles: Vec<_> = readers
            .iter()
            .enumerate()
            .map(|(b, rd)| {
                let barrier = &barrier;
                let slots = &fe.slots;
                let input_bytes = cfg.input_bytes;
                sc.spawn(move || {
                    let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed * 1000 + b as u64);
                    let mut hist =
                        Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).expect("histogram");
                    let mut reqs = Vec::with_capacity(n);
                    let mut tasks = Vec::with_capacity(n);
                    // The inputs' buffers come back for the next batch, as a
                    // backend recycles them.
                    let mut bufs: Vec<Vec<u8>> = Vec::with_capacity(n);
                    // The batch's tensor (gather, rows), one row per input.
                    let mut tensor = match into {
                        Land::Buffers => Vec::new(),
                        _ => vec![0u8; n * input_bytes],
                    };
                    let mut pull = |rng: &mut Xoshiro256PlusPlus| -> u64 {
                        reqs.clear();
                        tasks.clear();
                        let start = rng.gen_range(0..slots.len());
                        for i in 0..n {
                            let (task, offset, len) = slots[(start + i) % slots.len()];
                            reqs.push(ReadReq {
                                peer: 0,
                                offset,
                                len,
                                cap: cap_of(task),
                            });
                            tasks.push(task);
                        }
                        let t0 = Instant::now();
                        if into == Land::Rows {
                            let mut rows: Vec<&mut [u8]> =
                                tensor.chunks_exact_mut(input_bytes).collect();
                            let (out, _, back) = rd.read_many_rows(
                                &reqs,
                                timeout,
                                std::mem::take(&mut bufs),
                                &mut rows,
                            );
                            let ns = t0.elapsed().as_nanos() as u64;
                            bufs = back;
                            for (o, &task) in out.iter().zip(&tasks) {
                                let head = o.as_ref().expect("read");
                                let len =
                                    SlotHeader::check_head(head, task, cap_of(task)).expect("slot");
                                assert_eq!(len, input_bytes);
                            }
                            return ns;
                        }
                        let out = rd.read_many_into(&reqs, timeout, std::mem::take(&mut bufs));
                        let mut rows = tensor.chunks_exact_mut(input_bytes);
                        for (o, &task) in out.iter().zip(&tasks) {
                            let bytes = o.as_ref().expect("read");
                            let payload =
                                SlotHeader::check(bytes, task, cap_of(task)).expect("slot");
                            assert_eq!(payload.len(), input_bytes);
                            if into == Land::Gather {
                                rows.next()
                                    .expect("a row per input")
                                    .copy_from_slice(payload);
                            }
                        }
                        let ns = t0.elapsed().as_nanos() as u64;
                        bufs.extend(out.into_iter().flatten());
                        ns
                    };
                    for _ in 0..3 {
                        pull(&mut rng); // warm up
                    }
                    barrier.wait();
                    let end = Instant::now() + run_for;
                    let mut batches = 0u64;
                    while Instant::now() < end {
                        let ns = pull(&mut rng);
                        hist.record(ns.max(1)).expect("record");
                        batches += 1;
                    }
                    (hist, batches * n as u64)
                })
            })
            .collect();
        barrier.wait();
        let t0 = Instant::now();
        let c0 = cpu_time_s();
        let mut all = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).expect("hist");
        let mut count = 0;
        for h in handles {
            let (hist, c) = h.join().expect("backend thread");
            all.add(&hist).expect("merge");
            count += c;
        }
        (all, count, (t0.elapsed(), cpu_time_s() - c0))
    });
    let slot_bytes = fe.slots[0].2 as f64;
    Stats::of_run(
        &hist,
        count,
        n,
        slot_bytes,
        elapsed.0.as_secs_f64(),
        elapsed.1,
    )
}

/// This process's CPU time so far (user and system, every thread), seconds.
fn cpu_time_s() -> f64 {
    // SAFETY: getrusage writes the struct it is given and nothing else.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        return 0.0;
    }
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

fn row(name: &str, n: usize, s: &Stats) {
    println!(
        "{name:<17} {n:>4} {:>12.0} {:>7.2} {:>11.1} {:>11.1} {:>11.1} {:>11.1} {:>10.0}",
        s.inputs_per_s,
        s.gb_per_s,
        s.batch_p50_us,
        s.batch_p99_us,
        s.input_p50_us,
        s.input_p99_us,
        s.cpu_ms_per_gb
    );
}

/// The link: one plain loopback TCP connection on which the reader asks for a
/// batch's bytes (an 8-byte length) and the server writes them from memory, no
/// region, no channel. What one connection carries, the bound of a pull on it.
fn link_once(cfg: &Cfg, n: usize, slot_bytes: usize) -> Stats {
    use std::io::{Read, Write};
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr");
    let batch = n * slot_bytes;
    let server = std::thread::spawn(move || {
        let (mut s, _) = l.accept().expect("accept");
        s.set_nodelay(true).expect("nodelay");
        let data = vec![7u8; batch];
        let mut len = [0u8; 8];
        while s.read_exact(&mut len).is_ok() {
            let want = u64::from_le_bytes(len) as usize;
            if s.write_all(&data[..want.min(batch)]).is_err() {
                break;
            }
        }
    });
    let mut c = std::net::TcpStream::connect(addr).expect("connect");
    c.set_nodelay(true).expect("nodelay");
    let mut buf = vec![0u8; batch];
    let mut pull = || -> u64 {
        let t0 = Instant::now();
        c.write_all(&(batch as u64).to_le_bytes()).expect("ask");
        c.read_exact(&mut buf).expect("answer");
        t0.elapsed().as_nanos() as u64
    };
    for _ in 0..3 {
        pull();
    }
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).expect("hist");
    let t0 = Instant::now();
    let c0 = cpu_time_s();
    let end = t0 + Duration::from_secs_f64(cfg.secs);
    let mut batches = 0u64;
    while Instant::now() < end {
        hist.record(pull().max(1)).expect("record");
        batches += 1;
    }
    let secs = t0.elapsed().as_secs_f64();
    let cpu = cpu_time_s() - c0;
    drop(c);
    server.join().expect("link server");
    Stats::of_run(&hist, batches * n as u64, n, slot_bytes as f64, secs, cpu)
}

fn ratio_row(name: &str, n: usize, a: &Stats, b: &Stats) {
    let (t, i) = (a.fields(), b.fields());
    let mut ratio = [0.0; 7];
    for k in 0..7 {
        ratio[k] = t[k] / i[k];
    }
    let r = Stats::from_fields(ratio);
    println!(
        "{:<17} {n:>4} {:>12.3} {:>7.3} {:>11.2} {:>11.2} {:>11.2} {:>11.2} {:>10.2}",
        name,
        r.inputs_per_s,
        r.gb_per_s,
        r.batch_p50_us,
        r.batch_p99_us,
        r.input_p50_us,
        r.input_p99_us,
        r.cpu_ms_per_gb
    );
}

fn main() {
    let cfg = Cfg::from_args();
    let started = Instant::now();
    let slot = (cfg.input_bytes + fermata::transport::SLOT_HEADER) as u64;
    let region = Arc::new(Region::new(1, (slot + 64) * cfg.inputs as u64 + 4096).expect("region"));
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(7);
    let slots: Vec<(u64, u64, u32)> = (0..cfg.inputs as u64)
        .map(|task| {
            let input: Vec<u8> = (0..cfg.input_bytes).map(|_| rng.gen()).collect();
            let r = region
                .put(task, cap_of(task), &input)
                .expect("region big enough");
            (task, r.offset, r.len)
        })
        .collect();
    // Per stream count: TCP in the clear and through the channel.
    let key = fermata::transport::auth::ClusterKey::generate();
    let mut names: Vec<String> = vec!["inproc".into()];
    let mut transports: Vec<Box<dyn Transport>> = vec![Box::new(InProc::global())];
    for &k in &cfg.streams {
        names.push(format!("tcp x{k}"));
        transports.push(Box::new(
            Tcp::keyed_with_pull_streams(None, k).expect("tcp transport"),
        ));
        names.push(format!("channel x{k}"));
        transports.push(Box::new(
            Tcp::keyed_with_pull_streams(Some(key.clone()), k)
                .expect("tcp transport with a cluster key"),
        ));
    }
    let fronts: Vec<Frontend> = transports
        .iter()
        .map(|tr| frontend(tr.as_ref(), &region, &slots))
        .collect();

    println!(
        "input pull: 1 frontend region server, {} backends, {} inputs of {} bytes \
         ({} bytes with the slot header), {} s x {} repeats, medians; \
         tcp xK / channel xK: K connections per peer, in the clear / through the \
         channel; link: one plain connection, one reader, no region",
        cfg.backends, cfg.inputs, cfg.input_bytes, slot, cfg.secs, cfg.repeats
    );
    println!(
        "{:<17} {:>4} {:>12} {:>7} {:>11} {:>11} {:>11} {:>11} {:>10}",
        "transport",
        "N",
        "inputs/s",
        "GB/s",
        "batch p50us",
        "batch p99us",
        "input p50us",
        "input p99us",
        "cpu ms/GB"
    );
    for &n in &cfg.batches {
        // Each mode's medians, by transport.
        let mut med: Vec<Vec<Stats>> = Vec::new();
        for &into in &cfg.into {
            let mut mine = Vec::new();
            for (k, tr) in transports.iter().enumerate() {
                let runs: Vec<Stats> = (0..cfg.repeats)
                    .map(|r| run_once(tr.as_ref(), &fronts[k], &cfg, n, r as u64, into))
                    .collect();
                let m = Stats::median(&runs);
                row(&format!("{}{}", names[k], into.suffix()), n, &m);
                mine.push(m);
            }
            med.push(mine);
        }
        let runs: Vec<Stats> = (0..cfg.repeats)
            .map(|_| link_once(&cfg, n, slot as usize))
            .collect();
        let link = Stats::median(&runs);
        row("link", n, &link);
        for (m, &into) in cfg.into.iter().enumerate() {
            for (j, &k) in cfg.streams.iter().enumerate() {
                let (tcp, ch) = (&med[m][1 + 2 * j], &med[m][2 + 2 * j]);
                let sfx = into.suffix();
                ratio_row(&format!("channel/tcp x{k}{sfx}"), n, ch, tcp);
                ratio_row(&format!("channel/link x{k}{sfx}"), n, ch, &link);
            }
        }
        // Straight into the rows against through buffers and a gather.
        let at = |want: Land| cfg.into.iter().position(|&i| i == want);
        if let (Some(r), Some(g)) = (at(Land::Rows), at(Land::Gather)) {
            for (k, name) in names.iter().enumerate() {
                ratio_row(&format!("rows/gather {name}"), n, &med[r][k], &med[g][k]);
            }
        }
    }
    println!("total {:.1} s", started.elapsed().as_secs_f64());
}

/// Task `task`'s read capability in this bench (any value but the probe's).
fn cap_of(task: u64) -> u64 {
    task + 1
}
