//! The authenticated cluster: a process that does not hold the
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
    //    scheduler, and a 64 MiB frame header to the frontend. Neither is a
    //    channel header: the connection is closed with nothing sent back, and
    //    nothing buffered for the frame.
    let register = wire::encode_to_vec(&Msg::Register {
        role: Role::Backend,
        name: "intruder".into(),
        gpus: vec![GpuInfo {
            local: 0,
            name: "fake".into(),
            mem_bytes: 1 << 30,
            device: fermata::wire::DeviceKind::Emulated,
            lanes: 1,
        }],
        ctrl_addr: String::new(),
        region: None,
    });
    let (got, closed) = raw_exchange(&sched, &register);
    assert!(closed, "the scheduler closed the outsider's connection");
    assert!(got.is_empty(), "nothing came back: {got:?}");
    let mut frame = (64u32 << 20).to_le_bytes().to_vec();
    frame.extend_from_slice(&[0u8; 64]);
    let (got, closed) = raw_exchange(&fe, &frame);
    assert!(closed && got.is_empty(), "{got:?}");

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

/// A process that does not hold the cluster secret, bound where members dial:
/// it accepts each connection, opens one to a target (`targets`, in turn)
/// and copies the bytes both ways, keeping everything it sees. It can also
/// write bytes of its own into a connection towards its target.
struct Relay {
    addr: String,
    conns: Arc<std::sync::Mutex<Vec<Arc<Relayed>>>>,
    /// Every byte seen, both ways.
    seen: Arc<std::sync::Mutex<Vec<u8>>>,
}

/// One relayed connection.
struct Relayed {
    /// Bytes that came back from the target.
    back: std::sync::atomic::AtomicUsize,
    /// The target closed it.
    closed: std::sync::atomic::AtomicBool,
    to_target: std::sync::Mutex<TcpStream>,
}

impl Relayed {
    fn back(&self) -> usize {
        self.back.load(std::sync::atomic::Ordering::SeqCst)
    }
    fn closed(&self) -> bool {
        self.closed.load(std::sync::atomic::Ordering::SeqCst)
    }
    /// Writes `bytes` towards the target.
    fn inject(&self, bytes: &[u8]) {
        let _ = self.to_target.lock().unwrap().write_all(bytes);
    }
}

impl Relay {
    fn start(bind: &str, targets: Vec<String>) -> Relay {
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
        use std::sync::Mutex;
        let l = std::net::TcpListener::bind(bind).unwrap();
        let r = Relay {
            addr: l.local_addr().unwrap().to_string(),
            conns: Arc::new(Mutex::new(Vec::new())),
            seen: Arc::new(Mutex::new(Vec::new())),
        };
        let (conns, seen) = (r.conns.clone(), r.seen.clone());
        std::thread::spawn(move || {
            for (i, s) in l.incoming().enumerate() {
                let Ok(dialer) = s else { return };
                let Ok(target) = TcpStream::connect(&targets[i % targets.len()]) else {
                    continue;
                };
                let rc = Arc::new(Relayed {
                    back: AtomicUsize::new(0),
                    closed: AtomicBool::new(false),
                    to_target: Mutex::new(target.try_clone().unwrap()),
                });
                conns.lock().unwrap().push(rc.clone());
                // Dialer to target.
                let (mut d, mut t) = (dialer.try_clone().unwrap(), target.try_clone().unwrap());
                let seen1 = seen.clone();
                std::thread::spawn(move || {
                    let mut b = [0u8; 65536];
                    while let Ok(n @ 1..) = d.read(&mut b) {
                        seen1.lock().unwrap().extend_from_slice(&b[..n]);
                        if t.write_all(&b[..n]).is_err() {
                            break;
                        }
                    }
                    let _ = t.shutdown(std::net::Shutdown::Write);
                });
                // Target to dialer.
                let (mut t, mut d) = (target, dialer);
                let seen2 = seen.clone();
                std::thread::spawn(move || {
                    let mut b = [0u8; 65536];
                    while let Ok(n @ 1..) = t.read(&mut b) {
                        seen2.lock().unwrap().extend_from_slice(&b[..n]);
                        rc.back.fetch_add(n, Ordering::SeqCst);
                        if d.write_all(&b[..n]).is_err() {
                            break;
                        }
                    }
                    rc.closed.store(true, Ordering::SeqCst);
                    let _ = d.shutdown(std::net::Shutdown::Both);
                });
            }
        });
        r
    }

    fn conns(&self) -> Vec<Arc<Relayed>> {
        self.conns.lock().unwrap().clone()
    }

    fn saw(&self, needle: &[u8]) -> bool {
        self.seen
            .lock()
            .unwrap()
            .windows(needle.len())
            .any(|w| w == needle)
    }
}

/// Waits (up to 5 s) until `f` holds.
fn wait_until(mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + Duration::from_secs(5);
    while Instant::now() < end {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    f()
}

fn exe() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_BIN_EXE_fermata"))
}

/// The relay attack with real processes: a process without the secret binds
/// an address a member dials (here: the scheduler address a backend is
/// given) and relays the member's handshake to other members' ports (a
/// frontend's control listener, the real scheduler). Each refuses it at its
/// first bytes (another address was dialed): nothing comes back through the
/// relay, the relayed backend never joins, and the cluster serves on.
#[test]
fn a_relay_without_the_secret_is_refused_by_the_members_it_relays_to() {
    use fermata::harness::procs::{small_workload, Proc, ProcCluster, ProcOpts};
    let dir = std::env::temp_dir().join(format!("fermata-relay-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let wp = dir.join("relay.toml");
    std::fs::write(&wp, small_workload("relay", 1)).unwrap();
    let w = Workload::from_file(&wp).unwrap();
    let c = ProcCluster::start(&exe(), &ProcOpts::new(wp.clone())).unwrap();
    let relay = Relay::start(
        "127.0.0.1:0",
        vec![c.frontend_addrs[0].clone(), c.scheduler_addr.clone()],
    );
    let mut args = vec![
        "backend".to_string(),
        "--scheduler".into(),
        relay.addr.clone(),
        "--gpus".into(),
        "1".into(),
        "--name".into(),
        "relayed".into(),
    ];
    args.extend(c.secret.args());
    let mut b = Proc::spawn(&exe(), "relayed", &args, false).unwrap();
    let joined = b.wait_for("fermata backend ready", Duration::from_secs(6), |l| {
        l.starts_with("fermata backend ready")
            .then(|| l.to_string())
    });
    assert!(joined.is_err(), "the relayed backend joined: {joined:?}");
    b.stop(Duration::from_secs(2));
    let conns = relay.conns();
    assert!(!conns.is_empty(), "the backend dialed the relay");
    for (i, rc) in conns.iter().enumerate() {
        assert_eq!(rc.back(), 0, "connection {i}: a member sent something back");
        assert!(
            wait_until(|| rc.closed()),
            "connection {i}: its target closed it"
        );
    }

    // The cluster served on, and knows one backend.
    let tr = c.secret.transport().unwrap();
    let mut lo = LoadgenOpts::new(c.frontend_addrs.clone(), &w);
    lo.rate_rps = 100.0;
    lo.warmup = Dur::ZERO;
    lo.duration = Dur::from_secs_f64(1.0);
    lo.verify = true;
    let rep = loadgen::run(tr, &w, &lo).unwrap();
    assert_eq!(rep.unanswered, 0);
    assert!(rep.sim.bad_rate() < 0.05, "bad rate {}", rep.sim.bad_rate());
    let reports = c.stop();
    let s = reports.scheduler.expect("the scheduler's report");
    assert_eq!(s["backends_registered"], 1, "{s}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A process without the secret that holds the address members dial and
/// relays to the very member they meant (same port, another loopback
/// address: a forwarder) sees only records: no model name, no input, and
/// what it writes into a connection (a forged wire frame, a region read
/// with a guessed capability) makes the member close it, never answer it.
/// The frontend advertises 127.0.0.2, where the relays listen; it listens
/// on 127.0.0.1.
#[test]
fn a_forwarder_without_the_secret_reads_and_forges_nothing() {
    use fermata::harness::procs::{ProcCluster, ProcOpts};
    let dir = std::env::temp_dir().join(format!("fermata-fwd-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let wp = dir.join("fwd.toml");
    const MODEL: &str = "model-name-only-members-may-read";
    std::fs::write(
        &wp,
        format!(
            "name = \"fwd\"\ngpus = 1\nrate_rps = 100\n[[models]]\nname = \"{MODEL}\"\n\
             alpha_ms = 0.5\nbeta_ms = 2.0\nslo_ms = 50\ninput_bytes = 4096\n"
        ),
    )
    .unwrap();
    let w = Workload::from_file(&wp).unwrap();
    // The forwarders first, on ports free on 127.0.0.1 too.
    let (ctl, data) = loop {
        let free = || {
            std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port()
        };
        let (c, d) = (free(), free());
        if c == d {
            continue;
        }
        let (Ok(_), Ok(_)) = (
            std::net::TcpListener::bind(format!("127.0.0.2:{c}")),
            std::net::TcpListener::bind(format!("127.0.0.2:{d}")),
        ) else {
            continue;
        };
        break (
            Relay::start(&format!("127.0.0.2:{c}"), vec![format!("127.0.0.1:{c}")]),
            Relay::start(&format!("127.0.0.2:{d}"), vec![format!("127.0.0.1:{d}")]),
        );
    };
    let port = |a: &str| a.rsplit_once(':').unwrap().1.to_string();
    let data_port = port(&data.addr);
    let mut o = ProcOpts::new(wp.clone());
    o.frontend_args = vec![
        "--advertise".into(),
        "127.0.0.2".into(),
        "--listen".into(),
        format!("127.0.0.1:{}", port(&ctl.addr)),
        "--data-listen".into(),
        format!("127.0.0.1:{data_port}"),
    ];
    let c = ProcCluster::start(&exe(), &o).unwrap();
    let fe = c.frontend_addrs[0].clone();
    assert_eq!(
        fe, ctl.addr,
        "the frontend advertises the forwarder's address"
    );

    // Members talk through the forwarders: the requests are served, with
    // the right outputs.
    let tr = c.secret.transport().unwrap();
    let mut lo = LoadgenOpts::new(vec![fe.clone()], &w);
    lo.rate_rps = 100.0;
    lo.warmup = Dur::ZERO;
    lo.duration = Dur::from_secs_f64(1.0);
    lo.verify = true;
    let rep = loadgen::run(tr.clone(), &w, &lo).unwrap();
    assert!(
        rep.sim.good() > 50,
        "served through the forwarders: {}",
        rep.sim.good()
    );
    assert_eq!(rep.unanswered, 0);
    assert!(!ctl.conns().is_empty() && !data.conns().is_empty());
    // ... and the forwarders saw records only: the model's name travels in
    // the load generator's requests and the frontend's model list.
    assert!(
        !ctl.saw(MODEL.as_bytes()),
        "the model name went in the clear"
    );
    assert!(!data.saw(MODEL.as_bytes()));

    // A member's connections through the forwarders, kept open: a control
    // connection to the frontend and a region reader.
    let (tx, rx) = fermata::transport::event_channel();
    let conn = tr.connect(&fe, tx).unwrap();
    let ctl_conn = ctl.conns().last().unwrap().clone();
    let reader = tr.reader().unwrap();
    let info = RegionInfo {
        addr: format!("127.0.0.2:{data_port}"),
        region: 1,
        len: 512 << 20,
        rkey: 0,
        base: 0,
    };
    reader.attach(3, &info).unwrap();
    let data_conn = data.conns().last().unwrap().clone();
    std::thread::sleep(Duration::from_millis(200));
    assert!(!ctl_conn.closed() && !data_conn.closed());
    let (ctl_back, data_back) = (ctl_conn.back(), data_conn.back());

    // Forged bytes into them: a wire frame towards the frontend, a region
    // read (a guessed capability) towards its region server, each followed
    // by enough bytes to make up the record their first two bytes announce.
    // Each member closes the connection and answers nothing.
    let mut frame = wire::encode_to_vec(&Msg::ListModels);
    frame.extend_from_slice(&[0u8; 1024]);
    ctl_conn.inject(&frame);
    let mut read = 1u64.to_le_bytes().to_vec();
    read.extend_from_slice(&0u64.to_le_bytes());
    read.extend_from_slice(&64u32.to_le_bytes());
    read.extend_from_slice(&0x5eedu64.to_le_bytes());
    read.extend_from_slice(&[0u8; 1024]);
    data_conn.inject(&read);
    assert!(
        wait_until(|| ctl_conn.closed()),
        "the frontend closed the forged connection"
    );
    assert!(
        wait_until(|| data_conn.closed()),
        "the region server closed it"
    );
    assert_eq!(
        ctl_conn.back(),
        ctl_back,
        "nothing answered the forged frame"
    );
    assert_eq!(
        data_conn.back(),
        data_back,
        "nothing answered the forged read"
    );
    // The member's own end saw the connection end, not a message.
    let ev = rx.recv_timeout(Duration::from_secs(5)).unwrap();
    assert!(
        matches!(ev, fermata::transport::Event::Closed(..)),
        "the member's connection ended"
    );
    drop(conn);
    c.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

/// The relay attack as it was reported, through `fermata bench attacks
/// --scenarios relay`'s harness: the scheduler killed, a process without the
/// secret on its address relaying every node's reconnection to the
/// frontend's control listener and region server, with reads and forged
/// results of its own. Every relayed connection is refused with nothing
/// sent back, no input is read, no forged answer accepted, and the real
/// scheduler takes its address back with both nodes.
#[test]
fn the_relay_on_a_restarting_schedulers_address_reads_and_forges_nothing() {
    let dir = std::env::temp_dir().join(format!("fermata-relay-bench-{}", std::process::id()));
    let r = fermata::harness::attacks::relay::run(&exe(), &dir).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(r.to_control > 0 && r.to_region > 0, "{r:?}");
    assert_eq!(r.refused, r.to_control + r.to_region, "{r:?}");
    assert_eq!(r.bytes_back, 0, "{r:?}");
    assert_eq!(r.inputs_read, 0, "{r:?}");
    assert_eq!(r.forged_accepted, 0, "{r:?}");
    assert!(r.scheduler_restarted && r.nodes_back, "{r:?}");
    assert_eq!(r.load_unanswered, 0, "{r:?}");
}
