//! The authenticated cluster (issue 14): a process that does not hold the
//! cluster secret can neither register, nor submit, nor read a frontend's input
//! region, whatever it sends; a process with another secret is refused by the
//! handshake; the members go on serving meanwhile. Real TCP on loopback.

use fermata::harness::loadgen::{self, LoadgenOpts};
use fermata::node::serve::{Cluster, ClusterOpts};
use fermata::transport::auth::ClusterKey;
use fermata::transport::{tcp::Tcp, Transport};
use fermata::wire::{self, Dur, GpuInfo, Msg, RegionInfo, Role};
use fermata::workload::Workload;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn workload() -> Workload {
    Workload::from_toml(
        r#"
name = "auth"
gpus = 2
rate_rps = 100
[[models]]
name = "m"
alpha_ms = 0.5
beta_ms = 2.0
slo_ms = 40
input_bytes = 64
"#,
        None,
    )
    .unwrap()
}

/// Everything a raw socket gets from `addr` after sending `bytes`, until the
/// peer closes (or 8 s pass).
fn raw_exchange(addr: &str, bytes: &[u8]) -> (Vec<u8>, bool) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(8))).unwrap();
    let _ = s.write_all(bytes);
    let mut got = Vec::new();
    let mut b = [0u8; 4096];
    let end = Instant::now() + Duration::from_secs(8);
    loop {
        match s.read(&mut b) {
            Ok(0) => return (got, true),
            Ok(n) => got.extend_from_slice(&b[..n]),
            Err(_) => return (got, Instant::now() < end),
        }
    }
}

/// An in-process cluster on loopback TCP whose connections prove a fresh
/// secret, with frontend regions of `region_bytes`: the secret, the members'
/// transport, the workload and the cluster.
fn keyed_cluster(region_bytes: u64) -> (ClusterKey, Arc<dyn Transport>, Workload, Cluster) {
    let key = ClusterKey::generate();
    let tr: Arc<dyn Transport> = Arc::new(Tcp::keyed(Some(key.clone())).unwrap());
    let w = workload();
    let o = ClusterOpts {
        host: "127.0.0.1".into(),
        region_bytes,
        ..ClusterOpts::default()
    };
    let c = Cluster::start(tr.clone(), &w, &o).unwrap();
    (key, tr, w, c)
}

#[test]
fn only_members_of_the_cluster_get_in() {
    let (_, tr, w, c) = keyed_cluster(16 << 20);
    let sched = c.scheduler.addr().to_string();
    let fe = c.frontend_addrs()[0].clone();
    let data = c.frontends[0].data_addr().to_string();

    // 1. An outsider speaking the wire protocol: a backend's Register to the
    //    scheduler, and a 64 MiB frame header to the frontend. Each gets the
    //    handshake's hello (40 bytes) and the connection closed: no answer, and
    //    nothing buffered for the frame.
    let register = wire::encode_to_vec(&Msg::Register {
        role: Role::Backend,
        name: "intruder".into(),
        gpus: vec![GpuInfo {
            local: 0,
            name: "fake".into(),
            mem_bytes: 1 << 30,
        }],
        ctrl_addr: String::new(),
        region: None,
    });
    let (got, closed) = raw_exchange(&sched, &register);
    assert!(closed, "the scheduler closed the outsider's connection");
    assert_eq!(got.len(), 40, "only the hello came back: {got:?}");
    assert_eq!(&got[..8], b"FMTAUTH1");
    let mut frame = (64u32 << 20).to_le_bytes().to_vec();
    frame.extend_from_slice(&[0u8; 64]);
    let (got, closed) = raw_exchange(&fe, &frame);
    assert!(closed && got.len() == 40, "{got:?}");

    // 2. A process with another secret: refused by the handshake, on both
    //    ports, with the reason.
    let other: Arc<dyn Transport> = Arc::new(Tcp::keyed(Some(ClusterKey::generate())).unwrap());
    let (tx, _rx) = fermata::transport::event_channel();
    let e = other.connect(&sched, tx.clone()).err().expect("refused");
    assert!(format!("{e:#}").contains("another cluster secret"), "{e:#}");
    let e = other.connect(&fe, tx).err().expect("refused");
    assert!(format!("{e:#}").contains("another cluster secret"), "{e:#}");

    // 3. Reading the frontend's input region: without the secret, and with
    //    another one, the reader cannot attach.
    let info = RegionInfo {
        addr: data.clone(),
        region: 1,
        len: 16 << 20,
        rkey: 0,
        base: 0,
    };
    for (who, t) in [
        (
            "no secret",
            Arc::new(Tcp::new().unwrap()) as Arc<dyn Transport>,
        ),
        ("another secret", other.clone()),
    ] {
        let r = t.reader().unwrap();
        assert!(r.attach(7, &info).is_err(), "{who}: attached to the region");
    }
    // A member can.
    let r = tr.reader().unwrap();
    r.attach(7, &info).expect("a member attaches");

    // 4. The members served all along: every request of a load run is good or
    //    ended once, and the scheduler knows one backend (no intruder).
    let mut lo = LoadgenOpts::new(c.frontend_addrs(), &w);
    lo.rate_rps = 200.0;
    lo.warmup = Dur::ZERO;
    lo.duration = Dur::from_secs_f64(1.0);
    let rep = loadgen::run(tr.clone(), &w, &lo).unwrap();
    assert_eq!(rep.unanswered, 0);
    assert!(rep.sim.bad_rate() < 0.05, "bad rate {}", rep.sim.bad_rate());
    let cr = c.stop().unwrap();
    assert_eq!(cr.scheduler.backends_registered, 1);
}

/// A peer that holds the cluster secret but was not given a task (a backend
/// the task was not planned on, or a compromised member) can neither read the
/// task's input nor answer it: every read without the task's capability is
/// refused, a probe reads zeros, and forged results are refused while the
/// real ones still answer every request, with the right bytes.
#[test]
fn a_member_without_the_tasks_capability_reads_and_answers_nothing() {
    use fermata::transport::{ReadError, ReadReq, PROBE_CAP};
    use fermata::wire::{task_id, TaskId, TaskResult, TaskStatus, Time};
    let (key, tr, w, c) = keyed_cluster(1 << 20);
    let fe = c.frontend_addrs()[0].clone();
    let data = c.frontends[0].data_addr().to_string();
    let rogue: Arc<dyn Transport> = Arc::new(Tcp::keyed(Some(key)).unwrap());

    let load = {
        let (tr, w, fes) = (tr.clone(), w.clone(), c.frontend_addrs());
        std::thread::spawn(move || {
            let mut lo = LoadgenOpts::new(fes, &w);
            lo.rate_rps = 300.0;
            lo.warmup = Dur::ZERO;
            lo.duration = Dur::from_secs_f64(2.0);
            loadgen::run(tr, &w, &lo).unwrap()
        })
    };

    // Reads of every slot-aligned offset of the region, while requests come
    // and go, with guessed capabilities: none served; probes: zeros.
    let rd = rogue.reader().unwrap();
    let info = RegionInfo {
        addr: data,
        region: 1,
        len: 1 << 20,
        rkey: 0,
        base: 0,
    };
    rd.attach(9, &info).unwrap();
    let (mut denied, mut probes) = (0, 0);
    let end = Instant::now() + Duration::from_millis(1500);
    let mut guess = 1u64;
    while Instant::now() < end {
        let reqs: Vec<ReadReq> = (0..256u64)
            .map(|i| {
                guess = guess
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ReadReq {
                    peer: 9,
                    offset: i * 64,
                    len: 96,
                    cap: if i % 16 == 0 { PROBE_CAP } else { guess | 1 },
                }
            })
            .collect();
        for (r, out) in reqs.iter().zip(rd.read_many(&reqs, Duration::from_secs(2))) {
            match out {
                Err(ReadError::Denied) => denied += 1,
                Ok(b) if r.cap == PROBE_CAP => {
                    assert!(b.iter().all(|&x| x == 0), "a probe read the region");
                    probes += 1;
                }
                other => panic!("a read without the capability got {other:?}"),
            }
        }
        // Forged answers for every task id the frontend may have given: each
        // message that hits a pending request closes the connection.
        let (tx, rx) = fermata::transport::event_channel();
        if let Ok(conn) = rogue.connect(&fe, tx) {
            let items: Vec<TaskResult> = (1..=3u32)
                .flat_map(|node| (1..=800u64).map(move |seq| task_id(node, seq)))
                .map(|id: TaskId| TaskResult {
                    id,
                    status: TaskStatus::Failed,
                    started: Time(0),
                    finished: Time(0),
                    batch_size: 0,
                    output: Vec::new(),
                    cap: id.0 ^ 0x5a5a,
                })
                .collect();
            let _ = conn.send(Msg::Results { items });
            // Paces the rounds: the frontend's close, or 20 ms.
            let _ = rx.recv_timeout(Duration::from_millis(20));
            conn.close("done");
        }
    }
    assert!(
        denied > 1000 && probes > 50,
        "{denied} denied, {probes} probes"
    );

    let rep = load.join().unwrap();
    assert_eq!(rep.unanswered, 0);
    assert_eq!(rep.wrong_outputs, 0);
    assert_eq!(rep.failed, 0, "a forged failure ended a request");
    assert!(rep.sim.bad_rate() < 0.05, "bad rate {}", rep.sim.bad_rate());
    let cr = c.stop().unwrap();
    let forged: u64 = cr.frontends.iter().map(|f| f.forged_results).sum();
    assert!(forged > 0, "the forgeries never met a pending request");
}
