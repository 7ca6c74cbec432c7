//! The completion-polling thread of a transport: polls the control CQ shared by
//! all its connections, hands every completion to its connection, and ends the
//! connections whose side channel closed once the CQ is empty.

use super::control::Shared;
use super::options::{IDLE_SLEEP, SPIN_POLLS};
use super::verbs;
use crate::transport::rdma_wire::wr_parts;
use crate::transport::ConnId;
use std::sync::atomic::Ordering;

/// The polling thread's body; returns once the transport stops (or its CQ broke).
pub(super) fn poll_loop(shared: &Shared) {
    let mut wcs = verbs::wc_array::<32>();
    let mut idle = 0u32;
    while !shared.stop.load(Ordering::Acquire) {
        let n = match shared.ctrl_cq.poll(&mut wcs) {
            Ok(n) => n,
            Err(e) => {
                // A broken CQ breaks every connection.
                let conns: Vec<_> = shared.conns.lock().expect("lock").drain().collect();
                for (_, c) in conns {
                    c.fail(&format!("rdma completion queue failed: {e}"));
                }
                return;
            }
        };
        for wc in &wcs[..n] {
            let (id, _, _) = wr_parts(wc.wr_id());
            let conn = shared.conns.lock().expect("lock").get(&id).cloned();
            // None: a completion of a connection already gone; nothing to do.
            if let Some(c) = conn {
                c.on_completion(wc);
            }
        }
        if n > 0 {
            idle = 0;
            continue;
        }
        end_lost(shared);
        idle = idle.saturating_add(1);
        if idle < SPIN_POLLS {
            std::hint::spin_loop();
        } else {
            std::thread::sleep(IDLE_SLEEP);
        }
    }
}

/// The CQ is empty: now ends the connections whose side channel closed.
fn end_lost(shared: &Shared) {
    let lost: Vec<ConnId> = std::mem::take(&mut *shared.lost.lock().expect("lock"));
    for id in lost {
        let c = shared.conns.lock().expect("lock").remove(&id);
        if let Some(c) = c {
            c.fail("connection lost (its TCP side channel closed)");
        }
    }
}
