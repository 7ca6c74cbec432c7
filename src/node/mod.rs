//! The distributed runtime's processes (Section 4 of the Symphony paper): the
//! scheduler, backends, frontends and the load generator, each an object that runs
//! its own threads over a [`crate::transport::Transport`]. The `fermata` binary
//! runs one per process (`fermata scheduler|backend|frontend|loadgen`);
//! `fermata serve` runs them all in one process over the in-process transport.

pub mod advertise;
pub mod apps;
pub mod autoscaler;
pub mod backend;
pub mod clock;
pub mod exec;
pub mod frontend;
pub mod grpc;
pub mod http;
pub mod onnx;
pub mod proto;
pub mod scheduler;
pub mod serve;

/// Set once the process was asked to stop (SIGTERM, SIGINT; see
/// [`request_stop`]): waits during start-up give up instead of running on.
static STOP_REQUESTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Asks every start-up wait of this process to give up (a signal handler may
/// call it: it only stores to an atomic).
pub fn request_stop() {
    STOP_REQUESTED.store(true, std::sync::atomic::Ordering::SeqCst);
}

/// Whether [`request_stop`] was called.
pub fn stop_requested() -> bool {
    STOP_REQUESTED.load(std::sync::atomic::Ordering::SeqCst)
}

/// A node's event channel ([`crate::transport::event_channel`], bounded at
/// [`crate::transport::EVENTS_MAX`]) and its `fermata_events_full_total{role}`
/// counter in `reg`: the times a transport found the channel full and waited.
pub fn event_channel(
    reg: &crate::metrics::Registry,
    role: &'static str,
) -> (
    crate::transport::EventTx,
    crossbeam_channel::Receiver<crate::transport::Event>,
) {
    let (tx, rx) = crate::transport::event_channel();
    let full = tx.full_counter();
    reg.collector(
        "fermata_events_full_total",
        "Times this node's event channel was full (EVENTS_MAX events) and a transport waited for room.",
        crate::metrics::Kind::Counter,
        move || {
            let v = full.load(std::sync::atomic::Ordering::Relaxed) as f64;
            vec![(vec![("role".to_string(), role.to_string())], v)]
        },
    );
    (tx, rx)
}

/// Connects to the first scheduler of `list` (addresses separated by commas:
/// a primary and its standbys) that answers; the connection and the addresses
/// in the order a node's membership tries them, the connected one first.
pub fn connect_scheduler(
    transport: &dyn crate::transport::Transport,
    list: &str,
    events: crate::transport::EventTx,
) -> anyhow::Result<(std::sync::Arc<dyn crate::transport::Conn>, Vec<String>)> {
    let addrs: Vec<String> = list
        .split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect();
    if addrs.is_empty() {
        anyhow::bail!("no scheduler address given");
    }
    let mut errors = Vec::new();
    for i in 0..addrs.len() {
        match transport.connect(&addrs[i], events.clone()) {
            Ok(c) => {
                let mut order = addrs.clone();
                order.rotate_left(i);
                return Ok((c, order));
            }
            Err(e) => errors.push(format!("{}: {e:#}", addrs[i])),
        }
    }
    anyhow::bail!("cannot reach the scheduler ({})", errors.join("; "))
}
