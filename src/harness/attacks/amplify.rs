//! Region amplification, with real processes on loopback: three members
//! (they hold the cluster secret and pass the handshake) open connections to
//! a frontend's region server and send reads that ask for far more than they
//! send: probes (capability 0) of the largest slot, reads of the whole
//! region, lengths past its end, guessed capabilities and random bytes. They
//! never read an answer. Measured: the bytes they got written, the
//! frontend's resident memory (VmRSS) before, at its highest while they
//! send, and after they close, and the legitimate load meanwhile.

use super::super::procs::{ProcCluster, ProcOpts};
use super::rss_mb;
use crate::transport::auth::{dial_std, Service};
use crate::transport::region::MAX_SLOT;
use crate::transport::region_wire as rw;
use crate::transport::secure_io::SecureStd;
use crate::workload::Workload;
use anyhow::{Context, Result};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Members, and connections each.
const MEMBERS: usize = 3;
const CONNS_PER_MEMBER: usize = 4;
/// How long they send.
const ATTACK: Duration = Duration::from_secs(6);
/// The frontend's region.
const REGION_MIB: u64 = 512;

/// The figures.
#[derive(Debug, Clone, serde::Serialize)]
pub struct AmplifyReport {
    pub members: usize,
    pub connections: usize,
    /// Bytes the members got written (reads and garbage, all connections).
    pub bytes_sent: u64,
    /// Read requests among them (28 bytes each).
    pub reads_sent: u64,
    /// What the reads asked for, in all (bytes).
    pub bytes_asked: u128,
    /// The frontend's VmRSS (MB): before, the highest while they sent (sampled
    /// every 50 ms), and 2 s after they closed.
    pub rss_before_mb: f64,
    pub rss_peak_mb: f64,
    pub rss_after_mb: f64,
    /// The legitimate load meanwhile.
    pub load_sent: u64,
    pub load_good: u64,
    pub load_bad_rate: f64,
    pub load_unanswered: u64,
    pub load_wrong_outputs: u64,
}

/// The `i`-th request of a connection: probes of the largest slot, reads of
/// the whole region, lengths past its end, guessed capabilities, random
/// bytes, in turn.
fn request(i: u64, rng: &mut u64) -> [u8; rw::REQ_LEN] {
    let mut next = || {
        // xorshift64*: attack bytes, no need for quality.
        *rng ^= *rng >> 12;
        *rng ^= *rng << 25;
        *rng ^= *rng >> 27;
        rng.wrapping_mul(0x2545_f491_4f6c_dd1d)
    };
    let region = REGION_MIB << 20;
    let r = |offset, len, cap| {
        rw::Request {
            id: i,
            offset,
            len,
            cap,
        }
        .encode()
    };
    match i % 5 {
        0 => r(0, MAX_SLOT as u32, 0),
        1 => r(0, region.min(u32::MAX as u64) as u32, 0),
        2 => r(next() % region, u32::MAX, 0),
        3 => r(next() % region, (next() % MAX_SLOT as u64) as u32, next()),
        _ => {
            let mut b = [0u8; rw::REQ_LEN];
            for c in b.chunks_mut(8) {
                let v = next().to_le_bytes();
                c.copy_from_slice(&v[..c.len()]);
            }
            b
        }
    }
}

/// What a request asks for (its length field).
fn asked(req: &[u8; rw::REQ_LEN]) -> u64 {
    rw::Request::decode(req).len as u64
}

/// One member's connection: the handshake, a hello, then requests until
/// `stop` or a write times out (the server stopped reading: it has answers
/// to write that nobody reads). Returns the bytes written, the reads and
/// what they asked for; the connection stays open (held in `keep`).
fn attack_conn(
    addr: &str,
    key: &crate::transport::auth::ClusterKey,
    seed: u64,
    stop: &AtomicBool,
    sent: &AtomicU64,
    reads: &AtomicU64,
) -> Result<(SecureStd<TcpStream>, u128)> {
    let mut s = TcpStream::connect(addr).with_context(|| format!("connecting to {addr}"))?;
    let ch = dial_std(&mut s, key, Service::Region, addr).map_err(|e| anyhow::anyhow!("{e}"))?;
    s.set_write_timeout(Some(Duration::from_millis(500)))?;
    let mut s = SecureStd::new(s, ch);
    s.write_all(&rw::hello(1))?;
    let mut w = [0u8; rw::WELCOME_LEN];
    s.read_exact(&mut w)?;
    let (st, _) = rw::parse_welcome(&w).map_err(|e| anyhow::anyhow!(e))?;
    anyhow::ensure!(
        st == rw::ST_OK,
        "the region server did not welcome region 1"
    );
    let mut rng = seed | 1;
    let mut total_asked = 0u128;
    let mut i = 0u64;
    let mut batch = Vec::with_capacity(64 * rw::REQ_LEN);
    while !stop.load(Ordering::SeqCst) {
        batch.clear();
        let mut batch_asked = 0u128;
        for _ in 0..64 {
            let r = request(i, &mut rng);
            batch_asked += asked(&r) as u128;
            batch.extend_from_slice(&r);
            i += 1;
        }
        match s.write_all(&batch) {
            Ok(()) => {
                sent.fetch_add(batch.len() as u64, Ordering::SeqCst);
                reads.fetch_add(64, Ordering::SeqCst);
                total_asked += batch_asked;
            }
            // Timed out (or closed): the server holds answers nobody reads
            // and takes no more. What went partly is not counted.
            Err(_) => break,
        }
    }
    Ok((s, total_asked))
}

/// Runs the attack against a cluster of `exe` (the `fermata` binary), with
/// its workload file in `dir`.
pub fn run(exe: &Path, dir: &Path) -> Result<AmplifyReport> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join("amplify.toml");
    std::fs::write(&path, super::super::procs::small_workload("amplify", 1))?;
    let w = Workload::from_file(&path)?;
    let data_port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let mut o = ProcOpts::new(path);
    o.frontend_args = vec!["--data-listen".into(), format!("127.0.0.1:{data_port}")];
    let c = ProcCluster::start(exe, &o)?;
    let region = format!("127.0.0.1:{data_port}");
    let pid = c.frontends[0].child.id();
    let load = {
        let (tr, w) = (c.secret.transport()?, w.clone());
        let mut lo = super::super::loadgen::LoadgenOpts::new(c.frontend_addrs.clone(), &w);
        lo.rate_rps = 100.0;
        lo.warmup = crate::core::Dur::ZERO;
        lo.duration = crate::core::Dur::from_secs_f64(ATTACK.as_secs_f64() + 5.0);
        lo.verify = true;
        std::thread::spawn(move || super::super::loadgen::run(tr, &w, &lo))
    };
    std::thread::sleep(Duration::from_millis(1500));
    let before = rss_mb(pid);

    let stop = Arc::new(AtomicBool::new(false));
    let (sent, reads) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let threads: Vec<_> = (0..MEMBERS * CONNS_PER_MEMBER)
        .map(|k| {
            let (addr, key) = (region.clone(), c.secret.key.clone());
            let (stop, sent, reads) = (stop.clone(), sent.clone(), reads.clone());
            std::thread::spawn(move || {
                attack_conn(&addr, &key, 0x5eed + k as u64, &stop, &sent, &reads)
            })
        })
        .collect();
    let started = Instant::now();
    let mut peak = before;
    while started.elapsed() < ATTACK {
        std::thread::sleep(Duration::from_millis(50));
        peak = peak.max(rss_mb(pid));
    }
    stop.store(true, Ordering::SeqCst);
    let mut held = Vec::new();
    let mut bytes_asked = 0u128;
    for t in threads {
        let (s, a) = t
            .join()
            .map_err(|_| anyhow::anyhow!("an attacking thread panicked"))??;
        bytes_asked += a;
        held.push(s);
    }
    peak = peak.max(rss_mb(pid));
    drop(held);
    std::thread::sleep(Duration::from_secs(2));
    let after = rss_mb(pid);
    let r = load
        .join()
        .map_err(|_| anyhow::anyhow!("the load generator panicked"))??;
    c.stop();
    Ok(AmplifyReport {
        members: MEMBERS,
        connections: MEMBERS * CONNS_PER_MEMBER,
        bytes_sent: sent.load(Ordering::SeqCst),
        reads_sent: reads.load(Ordering::SeqCst),
        bytes_asked,
        rss_before_mb: before,
        rss_peak_mb: peak,
        rss_after_mb: after,
        load_sent: r.sent,
        load_good: r.sim.good(),
        load_bad_rate: r.sim.bad_rate(),
        load_unanswered: r.unanswered,
        load_wrong_outputs: r.wrong_outputs,
    })
}
