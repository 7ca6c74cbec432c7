//! `--model-control-mode poll`'s thread (`sched-repo-poll`): looks at the
//! model repository every `--repository-poll-secs` and hands the event loop
//! what it found ([`Scan`]); the event loop turns it into loads and unloads
//! ([`RepoPoll`](crate::node::proto::repo_poll::RepoPoll)). Reading the
//! folder off the event loop keeps a slow file system from holding the
//! scheduler.

use crate::node::proto::repo_poll::Scan;
use crossbeam_channel::{bounded, Receiver, TrySendError};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Starts the thread: a look at `dir` for the models `served` (by id) every
/// `every`, until `stop`. A look the event loop has not taken yet when the
/// next one is ready is replaced by it.
pub(super) fn spawn(
    dir: PathBuf,
    served: Vec<String>,
    every: Duration,
    stop: Arc<AtomicBool>,
) -> std::io::Result<Receiver<Scan>> {
    let (tx, rx) = bounded::<Scan>(1);
    let keep = rx.clone();
    std::thread::Builder::new()
        .name("sched-repo-poll".into())
        .spawn(move || {
            let mut next = Instant::now() + every;
            while !stop.load(Ordering::Acquire) {
                let now = Instant::now();
                if now < next {
                    std::thread::sleep((next - now).min(Duration::from_millis(50)));
                    continue;
                }
                next = now + every;
                let mut s = scan(&dir, &served);
                loop {
                    match tx.try_send(s) {
                        Ok(()) | Err(TrySendError::Disconnected(_)) => break,
                        Err(TrySendError::Full(back)) => {
                            // The older look goes: the newer one says more.
                            let _ = keep.try_recv();
                            s = back;
                        }
                    }
                }
            }
        })?;
    Ok(rx)
}

/// One look at `dir`: each served model's fingerprint (by id) and the models
/// there that are not served.
pub(super) fn scan(dir: &Path, served: &[String]) -> Scan {
    let mut unknown: Vec<String> = crate::repo::model_names(dir)
        .into_iter()
        .filter(|n| !served.contains(n))
        .collect();
    unknown.sort();
    Scan {
        models: served
            .iter()
            .map(|n| crate::repo::model_fingerprint(dir, n))
            .collect(),
        unknown,
    }
}
