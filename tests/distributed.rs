//! The distributed runtime in one process (in-process and TCP transports):
//! requests in, results out with the right bytes, every request ended exactly once,
//! and the failure behaviour: a backend that dies, a frontend that leaves,
//! malformed and unexpected messages.

use fermata::core::Dur;
use fermata::harness::loadgen::{self, LoadReport, LoadgenOpts};
use fermata::node::backend::{BackendNode, BackendOpts};
use fermata::node::frontend::{FrontendNode, FrontendOpts};
use fermata::node::scheduler::{SchedulerNode, SchedulerOpts};
use fermata::node::serve::{Cluster, ClusterOpts};
use fermata::transport::{inproc::InProc, tcp::Tcp, Event, Transport};
use fermata::wire::{GpuId, ModelId, Msg, PlanId, Role, Time};
use fermata::workload::Workload;
use std::io::{Read, Write};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One at a time: the tests measure timing-sensitive outcomes on few cores.
static SERIAL: Mutex<()> = Mutex::new(());

/// The runs a pull test makes at most while the machine starves its scheduler
/// (more than 1% of the plans at the backend after their planned start), and
/// the pause after each: on a 2-core CI machine one starved spell spanned
/// three runs in a row (about 30 s).
const STARVED_RUNS: u32 = 5;
const STARVED_PAUSE: Duration = Duration::from_secs(5);

fn workload(gpus: u32) -> Workload {
    Workload::from_toml(
        &format!(
            r#"
name = "dist"
gpus = {gpus}
rate_rps = 300
[[models]]
name = "small"
alpha_ms = 0.5
beta_ms = 2.0
slo_ms = 40
input_bytes = 2048
[[models]]
name = "big"
alpha_ms = 1.0
beta_ms = 4.0
slo_ms = 60
input_bytes = 20000
"#
        ),
        None,
    )
    .unwrap()
}

fn load_opts(w: &Workload, fes: Vec<String>, rate: f64, secs: f64) -> LoadgenOpts {
    let mut o = LoadgenOpts::new(fes, w);
    o.rate_rps = rate;
    o.warmup = Dur::from_secs_f64(0.3);
    o.duration = Dur::from_secs_f64(secs);
    o
}

fn offered(r: &LoadReport) -> u64 {
    r.sim.offered()
}

fn assert_accounted(r: &LoadReport) {
    assert_eq!(r.unanswered, 0, "every request must be answered");
    assert_eq!(r.duplicates, 0, "no request may be answered twice");
    assert_eq!(r.wrong_outputs, 0, "outputs must match the inputs");
}

fn inproc() -> Arc<dyn Transport> {
    Arc::new(InProc::global())
}

fn cluster_opts(backends: u32, frontends: u32, host: &str) -> ClusterOpts {
    ClusterOpts {
        backends,
        frontends,
        host: host.into(),
        region_bytes: 64 << 20,
        ..ClusterOpts::default()
    }
}

#[test]
fn requests_in_results_out_every_request_once() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for (tr, host) in [
        (inproc(), "e2e"),
        (
            Arc::new(Tcp::new().unwrap()) as Arc<dyn Transport>,
            "127.0.0.1",
        ),
    ] {
        let w = workload(4);
        let c = Cluster::start(tr.clone(), &w, &cluster_opts(2, 2, host)).unwrap();
        let r = loadgen::run(
            tr.clone(),
            &w,
            &load_opts(&w, c.frontend_addrs(), 300.0, 1.5),
        )
        .unwrap();
        let rep = c.stop().unwrap();
        assert_accounted(&r);
        assert!(offered(&r) > 300, "offered {}", offered(&r));
        assert!(
            r.sim.bad_rate() < 0.05,
            "{}: bad rate {} at light load",
            tr.name(),
            r.sim.bad_rate()
        );
        // Batches ran (batch sizes seen by clients).
        assert!(r.sim.batch_requests().iter().sum::<u64>() > 0);
        // Every request the frontends took was sent by the load generator, and
        // every plan the scheduler sent was reported done.
        let fe_req: u64 = rep.frontends.iter().map(|f| f.requests).sum();
        assert_eq!(fe_req, r.sent);
        let fe_ended: u64 = rep
            .frontends
            .iter()
            .map(|f| f.good + f.late + f.dropped + f.failed)
            .sum();
        assert_eq!(
            fe_ended, r.sent,
            "each request ended exactly once at its frontend"
        );
        assert_eq!(rep.scheduler.plans_done, rep.scheduler.plans_sent);
        assert_eq!(rep.scheduler.backends_registered, 2);
        assert_eq!(rep.scheduler.frontends_registered, 2);
        assert!(rep.scheduler.d_ctrl_us > 0.0, "d_ctrl was measured");
    }
}

#[test]
fn a_dead_backend_fails_its_tasks_and_the_rest_go_on() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let tr = inproc();
    let w = workload(4);
    let mut c = Cluster::start(tr.clone(), &w, &cluster_opts(2, 1, "crash")).unwrap();
    let lo = load_opts(&w, c.frontend_addrs(), 400.0, 3.0);
    let (tx, rx) = std::sync::mpsc::channel();
    let w2 = w.clone();
    let tr2 = tr.clone();
    std::thread::spawn(move || tx.send(loadgen::run(tr2, &w2, &lo)).unwrap());
    std::thread::sleep(Duration::from_millis(1500));
    // The backend with GPU 0: deferred scheduling keeps the lowest GPUs busiest.
    let first = c
        .backend_gpus
        .iter()
        .position(|g| g.contains(&GpuId(0)))
        .unwrap();
    // Die while it has a plan in flight.
    let t = std::time::Instant::now();
    while c.backends[first].plans_in_flight() == 0 && t.elapsed() < Duration::from_secs(2) {
        std::thread::yield_now();
    }
    let dead = c.backends.remove(first).crash();
    let r = rx.recv().unwrap().unwrap();
    let rep = c.stop().unwrap();
    assert_accounted(&r);
    assert_eq!(rep.scheduler.backends_lost, 1);
    assert_eq!(rep.scheduler.backends_left, 1);
    assert!(
        dead.plans_run > 0,
        "the dead backend had work before it died"
    );
    assert!(r.failed > 0, "the dead backend had tasks in flight");
    // Its in-flight tasks ended as explicit failures (not silence, not timeouts).
    assert_eq!(
        rep.scheduler.tasks_failed_backend_lost, r.failed,
        "failures are exactly the dead backend's tasks"
    );
    let timed_out: u64 = rep.frontends.iter().map(|f| f.timed_out).sum();
    assert_eq!(timed_out, 0, "nothing waited for the last-resort timeout");
    // The surviving backend carried the load.
    let bad = (r.sim.offered() - r.sim.good() - r.failed) as f64 / r.sim.offered() as f64;
    assert!(bad < 0.05, "bad rate {bad} without the failed ones");
}

#[test]
fn a_frontend_that_leaves_does_not_stall_the_others() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let tr = inproc();
    let w = workload(4);
    let mut c = Cluster::start(tr.clone(), &w, &cluster_opts(1, 2, "leave")).unwrap();
    let addrs = c.frontend_addrs();
    let run = |addr: String, rate: f64| {
        let (w, tr) = (w.clone(), tr.clone());
        let lo = load_opts(&w, vec![addr], rate, 2.5);
        std::thread::spawn(move || loadgen::run(tr, &w, &lo))
    };
    let stays = run(addrs[0].clone(), 200.0);
    let leaves = run(addrs[1].clone(), 200.0);
    std::thread::sleep(Duration::from_millis(1200));
    let gone = c.frontends.remove(1).stop();
    // Its clients get every answer before the connection closes (pending ones
    // fail), then the load generator sees the frontend gone.
    assert!(gone.requests > 0);
    assert_eq!(
        gone.good + gone.late + gone.dropped + gone.failed,
        gone.requests
    );
    // The load generator names the frontend gone; a frontend that stops
    // answers everything it took first, so none was open on it. (What
    // arrived later had no frontend left: unsent, counted unanswered.)
    let l = leaves
        .join()
        .unwrap()
        .expect("the run ends with its accounting");
    assert_eq!(l.lost.len(), 1, "the frontend is gone");
    // What reached the frontend it answered. A request the client handed to
    // the transport after the stop's last read of the frontend's inbox, and
    // before its connections closed, never reached it: only such a request
    // can be open at the loss, and at 200 r/s that window holds a send or two.
    assert_eq!(
        l.sent,
        gone.requests + l.lost[0].open,
        "every request sent reached the frontend or was open at the loss: {:?}",
        l.lost[0]
    );
    assert!(l.lost[0].open <= 2, "{:?}", l.lost[0]);
    let r = stays.join().unwrap().unwrap();
    let rep = c.stop().unwrap();
    assert_accounted(&r);
    assert_eq!(rep.scheduler.frontends_left, 2);
    assert_eq!(rep.scheduler.frontends_lost, 0);
    assert!(r.sim.bad_rate() < 0.05, "bad rate {}", r.sim.bad_rate());
}

#[test]
fn malformed_and_unexpected_messages_close_only_that_connection() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let tr: Arc<dyn Transport> = Arc::new(Tcp::new().unwrap());
    let w = workload(2);
    let s = SchedulerNode::start(tr.clone(), &w, SchedulerOpts::default()).unwrap();
    let be = BackendNode::start(tr.clone(), BackendOpts::emulated(s.addr(), 2)).unwrap();
    be.wait_ready(Duration::from_secs(10)).unwrap();
    // Garbage bytes: the scheduler says why in an Error, then closes that
    // connection.
    let mut raw = std::net::TcpStream::connect(s.addr()).unwrap();
    raw.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    raw.write_all(&[0xff; 64]).unwrap();
    let mut got = Vec::new();
    raw.read_to_end(&mut got).unwrap();
    let len = u32::from_le_bytes(got[..4].try_into().unwrap()) as usize;
    assert!(
        matches!(
            fermata::wire::decode(&got[4..4 + len]),
            Ok(Msg::Error { .. })
        ),
        "an Error first: {got:?}"
    );
    assert_eq!(got.len(), 4 + len, "then the connection closed");
    // A message this peer may not send (a Plan from an unregistered node): an
    // Error explains, then the connection closes.
    let (etx, erx) = fermata::transport::event_channel();
    let conn = tr.connect(s.addr(), etx).unwrap();
    conn.send(Msg::Plan {
        id: PlanId(1),
        model: ModelId(0),
        gpu: GpuId(0),
        exec_at: Time(0),
        finish_at: Time(0),
        sent: Time(0),
        tasks: vec![],
    })
    .unwrap();
    let mut got_error = false;
    loop {
        match erx.recv_timeout(Duration::from_secs(5)).expect("an answer") {
            Event::Msg(_, Msg::Error { message }) => {
                assert!(message.contains("unexpected message Plan"), "{message}");
                got_error = true;
            }
            Event::Closed(..) => break,
            _ => {}
        }
    }
    assert!(got_error);
    // A backend registering without GPUs is refused with a reason.
    let (etx, erx) = fermata::transport::event_channel();
    let conn = tr.connect(s.addr(), etx).unwrap();
    conn.send(Msg::Register {
        role: Role::Backend,
        name: "nogpu".into(),
        gpus: vec![],
        ctrl_addr: String::new(),
        region: None,
    })
    .unwrap();
    match erx.recv_timeout(Duration::from_secs(5)).expect("an answer") {
        Event::Msg(_, Msg::Error { message }) => assert!(message.contains("at least one GPU")),
        _ => panic!("expected an Error"),
    }
    // Nothing else was affected: a frontend registers and requests are served.
    let mut fo = FrontendOpts::new(s.addr());
    fo.region_bytes = 16 << 20;
    let fe = FrontendNode::start(tr.clone(), fo).unwrap();
    let r = loadgen::run(
        tr.clone(),
        &w,
        &load_opts(&w, vec![fe.addr().to_string()], 100.0, 0.7),
    )
    .unwrap();
    assert_accounted(&r);
    assert!(r.sim.good() > 0);
    fe.stop();
    be.stop();
    let rep = s.stop().unwrap();
    assert_eq!(rep.connections_closed_for_errors, 2);
    assert_eq!(rep.backends_left, 1);
    assert_eq!(rep.backends_lost, 0);
}

#[test]
fn unknown_model_and_bad_requests_fail_with_a_reason() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let tr = inproc();
    let w = workload(2);
    let c = Cluster::start(tr.clone(), &w, &cluster_opts(1, 1, "bad")).unwrap();
    let (etx, erx) = fermata::transport::event_channel();
    let conn = tr.connect(&c.frontend_addrs()[0], etx).unwrap();
    conn.send(Msg::Infer {
        req: 7,
        model: "nope".into(),
        slo: Dur::ZERO,
        input: vec![1, 2, 3].into(),
    })
    .unwrap();
    conn.send(Msg::Infer {
        req: 8,
        model: "small".into(),
        slo: Dur(-5),
        input: vec![1, 2, 3].into(),
    })
    .unwrap();
    let mut seen = std::collections::HashMap::new();
    let mut reply = |want: u64| loop {
        if let Event::Msg(
            _,
            Msg::InferReply {
                req,
                status,
                message,
                output,
                ..
            },
        ) = erx.recv_timeout(Duration::from_secs(5)).expect("a reply")
        {
            seen.insert(req, (status, message, output));
            if seen.contains_key(&want) {
                return seen[&want].clone();
            }
        }
    };
    use fermata::wire::Outcome;
    let r7 = reply(7);
    assert_eq!(r7.0, Outcome::Failed);
    assert!(
        r7.1.contains("unknown model `nope`") && r7.1.contains("small"),
        "{}",
        r7.1
    );
    let r8 = reply(8);
    assert_eq!(r8.0, Outcome::Failed);
    assert!(r8.1.contains("the SLO must be >= 0"), "{}", r8.1);
    // A valid request is served, with the right bytes. A lone request is held to
    // its frontrun moment, which leaves it only l(2) - l(1) = 0.5 ms (plus the
    // slack) to spare: on a busy machine it may come back late, or be dropped when
    // its batch starts too late. That is a timing outcome, not this test's
    // subject, so a dropped one is sent again (a bounded number of times).
    let mut served = false;
    for attempt in 0..20u64 {
        let req = 9 + attempt;
        conn.send(Msg::Infer {
            req,
            model: "small".into(),
            slo: Dur::ZERO,
            input: vec![5; 2048].into(),
        })
        .unwrap();
        let (status, message, output) = reply(req);
        match status {
            Outcome::Good | Outcome::Late => {
                assert_eq!(output, fermata::node::exec::emulated_output(&[5; 2048]));
                served = true;
                break;
            }
            Outcome::Dropped => {
                assert!(message.contains("dropped"), "{message}");
            }
            Outcome::Failed => panic!("a valid request failed: {message}"),
        }
    }
    assert!(served, "20 lone requests in a row were dropped");
    c.stop().unwrap();
}

/// A request that waited so long before the frontend's loop admitted it that
/// its deadline cannot be met (its wait plus its model's l(1) reach its SLO)
/// is dropped there, before its input is copied into the region: a loop that
/// fell behind catches up on such requests instead of copying their inputs
/// and filling the region with requests the scheduler would drop anyway. One
/// that can still be on time is admitted, its input stored.
#[test]
fn a_request_that_waited_past_its_deadline_is_dropped_before_its_input_is_stored() {
    use fermata::node::frontend::Ended;
    use fermata::wire::DropReason;
    use std::time::Instant;
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let tr = inproc();
    let w = workload(2);
    let s = SchedulerNode::start(tr.clone(), &w, SchedulerOpts::default()).unwrap();
    let be = BackendNode::start(tr.clone(), BackendOpts::emulated(s.addr(), 2)).unwrap();
    be.wait_ready(Duration::from_secs(10)).unwrap();
    let mut fo = FrontendOpts::new(s.addr());
    fo.region_bytes = 16 << 20;
    let fe = FrontendNode::start(tr.clone(), fo).unwrap();
    let h = fe.handle();
    let t0 = Instant::now();
    while h.gpus_in_service() == 0 {
        assert!(t0.elapsed() < Duration::from_secs(10), "no GPU in service");
        std::thread::sleep(Duration::from_millis(10));
    }
    // `small`: SLO 40 ms, l(1) = 2.5 ms. 38 ms of waiting leave 2 ms.
    let waited = Instant::now() - Duration::from_millis(38);
    let done = h
        .infer("small", Dur::ZERO, vec![5; 2048], waited)
        .blocking_recv()
        .expect("an answer");
    assert_eq!(
        done.ended,
        Ended::Dropped(DropReason::Expired),
        "{}",
        done.message
    );
    assert!(done.message.contains("cannot be met"), "{}", done.message);
    assert_eq!(done.batch_size, 0);
    // One that waited 20 ms is admitted (its input stored) and answered; a
    // lone request on a busy machine may still be dropped by the scheduler,
    // so it is sent again (a bounded number of times).
    let mut sent = 0u64;
    let mut served = false;
    while sent < 20 && !served {
        sent += 1;
        let waited = Instant::now() - Duration::from_millis(20);
        let done = h
            .infer("small", Dur::ZERO, vec![5; 2048], waited)
            .blocking_recv()
            .expect("an answer");
        served = matches!(done.ended, Ended::Good | Ended::Late);
    }
    assert!(served, "20 requests in a row were dropped");
    // Each request's wait for the loop is in the frontend's metrics.
    let text = h.metrics().render();
    let count = text
        .lines()
        .find_map(|l| l.strip_prefix("fermata_frontend_loop_wait_seconds_count "))
        .unwrap_or_else(|| panic!("no loop wait series in\n{text}"));
    assert_eq!(count.trim().parse::<u64>().unwrap(), 1 + sent);
    let rep = fe.stop();
    assert_eq!(
        rep.input_bytes_stored,
        2048 * sent,
        "only the admitted requests' inputs are stored"
    );
    be.stop();
    s.stop().unwrap();
}

/// Real inputs: 602,112-byte inputs (a 3x224x224 FP32 image) at a moderate
/// rate on the one-GPU H100 ResNet-50 profile end under 1% bad, in process.
/// The pull budget of a batch of 64 is what such a batch's pull
/// costs (a few ms on loopback), not 64 times the slowest input's.
/// A stopped cluster gives its frontend's region back: the next region of
/// that length in the process gets its memory, zeroed (the requests' inputs
/// do not outlive them), rather than a fresh allocation; nothing keeps a
/// stopped frontend's region alive.
#[test]
fn a_stopped_frontends_region_goes_to_the_next_zeroed() {
    use fermata::transport::region::Region;
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // A length no other test of this file uses.
    let len: u64 = (40 << 20) + 7 * 64;
    let w = workload(2);
    let tr = inproc();
    let mut co = cluster_opts(1, 1, "reuse");
    co.region_bytes = len;
    let c = Cluster::start(tr.clone(), &w, &co).unwrap();
    let r = loadgen::run(
        tr.clone(),
        &w,
        &load_opts(&w, c.frontend_addrs(), 300.0, 0.5),
    )
    .unwrap();
    let rep = c.stop().unwrap();
    assert_accounted(&r);
    assert!(
        rep.frontends[0].input_bytes_stored > 0,
        "{:?}",
        rep.frontends
    );
    let next = Region::new(9, len).unwrap();
    assert!(next.reused(), "the stopped frontend's region was not freed");
    let zeros = next.with_slice(0, len as u32, |m| m.iter().all(|&b| b == 0));
    assert_eq!(zeros, Ok(true), "inputs left in the reused region");
}

#[test]
fn large_inputs_at_a_moderate_rate_end_under_one_percent_bad() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let w = Workload::from_toml(
        r#"
name = "r50_h100_large"
gpus = 1
rate_rps = 800
[[models]]
name = "resnet50"
alpha_ms = 0.2228
beta_ms = 1.4654
slo_ms = 50
max_batch = 64
input_bytes = 602112
"#,
        None,
    )
    .unwrap();
    // In process only: over loopback TCP on a loaded 2-core machine the same
    // run ended at 1.04% bad (batch pulls p50 7.7 ms, p99 14.5 ms).
    // A run in which more than 1% of the plans reached the backend after
    // their planned start says nothing about the pulls: the machine starved
    // the scheduler's path (a loaded CI machine). It is made again (see
    // `STARVED_RUNS`); a run that fails with its plans on time fails the test
    // at once.
    let (tr, host) = (inproc(), "large");
    for attempt in 1..=STARVED_RUNS {
        let mut co = cluster_opts(1, 1, host);
        co.region_bytes = 256 << 20;
        let c = Cluster::start(tr.clone(), &w, &co).unwrap();
        let mut lo = load_opts(&w, c.frontend_addrs(), 800.0, 3.0);
        lo.warmup = Dur::from_secs_f64(1.0);
        let r = loadgen::run(tr.clone(), &w, &lo).unwrap();
        let rep = c.stop().unwrap();
        assert_accounted(&r);
        assert!(offered(&r) > 1500, "offered {}", offered(&r));
        let s = &rep.scheduler;
        let b = &rep.backends[0];
        assert!(b.pulls_predicted > 100, "{b:?}");
        let budget64 = s.d_data_fixed_us + 64.0 * s.d_data_us;
        let why = format!(
            "{}: {:.3}% bad at 800 r/s with 602,112-byte inputs (pull budget {:.0} us + {:.1} us per input; pulls per batch p50 {:.0} us p99 {:.0} us, {:.2}% over budget; plans' lead at arrival p1 {:.0} us)",
            tr.name(),
            100.0 * r.sim.bad_rate(),
            s.d_data_fixed_us,
            s.d_data_us,
            b.pull_batch_p50_us,
            b.pull_batch_p99_us,
            100.0 * b.pull_overrun_share,
            b.lead_arrived_p1_us,
        );
        // The budget of a batch of 64 is at most 64 times the largest
        // per-input pull time seen (a batch's pull time over its inputs),
        // what a per-input budget at the slowest input's would be; how far
        // below it a tail puts it is `core::pull`'s test with a maximum 10x
        // the median.
        let per_input_max64 = 64.0 * b.pull_max_us_per_task;
        if r.sim.bad_rate() < 0.01 && budget64 <= per_input_max64 {
            return;
        }
        let starved = b.lead_arrived_p1_us < 0.0;
        assert!(
            starved && attempt < STARVED_RUNS,
            "run {attempt}: {why}; a batch of 64 budgeted {budget64:.0} us against 64 x the largest per-input pull {per_input_max64:.0} us"
        );
        eprintln!("run {attempt} starved, made again: {why}");
        std::thread::sleep(STARVED_PAUSE);
    }
}

/// Pull ahead: a plan for a GPU that still runs a batch reaches the backend
/// `d_ctrl + pull` before that batch ends, and its puller reads the inputs
/// (602,112 bytes each) while the worker runs the batch before, so the batch
/// starts at its planned start. With the GPU busy most of the time (batches of
/// 10 ms and more, at about 80% of capacity), many pulls run during the batch
/// before, and of those the inputs are in by the planned start.
#[test]
fn a_plan_whose_pulls_overlap_the_previous_batch_starts_on_time() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let w = Workload::from_toml(
        r#"
name = "pull_ahead"
gpus = 1
rate_rps = 500
[[models]]
name = "m"
alpha_ms = 1.0
beta_ms = 10.0
slo_ms = 200
max_batch = 16
input_bytes = 602112
"#,
        None,
    )
    .unwrap();
    // A run in which more than 1% of the plans reached the backend after
    // their planned start says nothing about the pulls (the machine starved
    // the scheduler's path): it is made again (see `STARVED_RUNS`).
    let (tr, host) = (inproc(), "ahead");
    for attempt in 1..=STARVED_RUNS {
        let mut co = cluster_opts(1, 1, host);
        co.region_bytes = 256 << 20;
        let c = Cluster::start(tr.clone(), &w, &co).unwrap();
        let mut lo = load_opts(&w, c.frontend_addrs(), 500.0, 3.0);
        lo.warmup = Dur::from_secs_f64(0.5);
        let r = loadgen::run(tr.clone(), &w, &lo).unwrap();
        let rep = c.stop().unwrap();
        assert_accounted(&r);
        let b = &rep.backends[0];
        let pulled = b.pulls_predicted.max(1);
        let why = format!(
            "run {attempt}: {} of {} batches pulled during the batch before, {} of those late ({} late in all); {:.3}% bad; plans' lead at arrival p1 {:.0} us, p50 {:.0} us; pulls p50 {:.0} us p99 {:.0} us, predicted p50 {:.0} us; start delay p50 {:.0} us p99 {:.0} us",
            b.pulls_overlapped,
            b.plans_run,
            b.pulls_overlapped_late,
            b.pulls_late,
            100.0 * r.sim.bad_rate(),
            b.lead_arrived_p1_us,
            b.lead_arrived_p50_us,
            b.pull_batch_p50_us,
            b.pull_batch_p99_us,
            b.pull_predicted_p50_us,
            b.start_delay_p50_us,
            b.start_delay_p99_us,
        );
        // Pulled ahead: at least a fifth of the batches were pulled while
        // the batch before ran (36-82% were on a loaded 2-core machine; none
        // would be if plans left only when their GPU was free, or if a GPU's
        // puller waited for its worker).
        let ahead = b.pulls_overlapped >= 20 && b.pulls_overlapped * 5 >= pulled;
        // On time: those batches had their inputs by their planned start
        // (all but a few whose plans a loaded machine delivered late) and
        // started then (the median start delay, far under a batch's 10 ms).
        let on_time = b.pulls_overlapped_late * 5 <= b.pulls_overlapped
            && b.start_delay_p50_us < 5_000.0
            && r.sim.bad_rate() < 0.01;
        if ahead && on_time {
            eprintln!("{why}");
            // The batches ran with their inputs: none went missing.
            assert_eq!(b.inputs_missing, 0, "{why}");
            // The emulated GPU holds each batch for its profile's latency
            // at the batch's size: the backend's run-over-profile ratio is
            // at least 1 (less than 0.95 would mean it measured against
            // another size's latency, or not at all).
            assert!(
                b.run_over_profile_p50 >= 0.95 && b.run_over_profile_p99 >= b.run_over_profile_p50,
                "run over profile p50 {} p99 {}",
                b.run_over_profile_p50,
                b.run_over_profile_p99
            );
            // Each input was copied twice on its way: into the frontend's
            // region, and pulled into the buffer the emulated GPU reads.
            let c = rep.input_copies().expect("inputs were stored");
            assert_eq!(c.gather, 0.0, "{c:?}");
            assert!(c.pull > 0.9 && c.pull <= 1.0, "{c:?}");
            return;
        }
        let starved = b.lead_arrived_p1_us < 0.0;
        assert!(starved && attempt < STARVED_RUNS, "{why}");
        eprintln!("starved, made again: {why}");
        std::thread::sleep(STARVED_PAUSE);
    }
}
