//! The relay attack, with real processes on loopback: the scheduler is
//! killed, and a process that does not hold the cluster secret binds the
//! address the nodes dial (the scheduler's, until it is started again). It
//! accepts every connection the nodes open there and relays it, in turn, to
//! a member's real port (the frontend's control listener, then its region
//! server), copying the bytes both ways. On each relayed connection it also
//! writes its own attack in the clear after the relayed bytes: a region
//! reader's hello and reads of every slot-sized stretch of the region with
//! guessed capabilities (towards the region server), or `Results` frames
//! answering guessed task ids with its own output (towards the control
//! listener). Then it leaves the address, a real scheduler is started on it,
//! and the nodes join it again.
//!
//! Counted: the connections the nodes opened to it, those the member it
//! relayed to closed without sending a byte back, the bytes members sent
//! back, the clients' inputs it read (region answers carrying data), and
//! the forged answers the frontend accepted (requests of the load generator,
//! which checks every output, that ended with a wrong output).

use super::super::procs::{Proc, ProcCluster, ProcOpts};
use crate::transport::region_wire as rw;
use crate::wire::{self, Msg, TaskId, TaskResult, TaskStatus, Time};
use crate::workload::Workload;
use anyhow::{Context, Result};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long the attacker holds the scheduler's address.
const HOLD: Duration = Duration::from_secs(8);
/// Guessed region reads written into each connection relayed to the region
/// server.
const READS_PER_CONN: u64 = 4096;
/// Forged results written into each connection relayed to the control
/// listener (ids 0.., one `Results` frame each).
const RESULTS_PER_CONN: u64 = 1024;

/// The relay attack's figures.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct RelayReport {
    /// Connections the nodes opened to the attacker's address.
    pub connections: u64,
    /// Of those, relayed to the frontend's control listener / region server.
    pub to_control: u64,
    pub to_region: u64,
    /// Relayed connections the member closed without sending a byte back.
    pub refused: u64,
    /// Bytes members sent back through the attacker (all connections).
    pub bytes_back: u64,
    /// Region reads and forged results the attacker wrote.
    pub reads_sent: u64,
    pub forged_sent: u64,
    /// Region answers that carried data: clients' inputs read.
    pub inputs_read: u64,
    /// Requests that ended with an output other than their own: forged
    /// answers the frontend accepted.
    pub forged_accepted: u64,
    /// The legitimate load over the whole run (requests fail at once while
    /// no scheduler serves).
    pub load_sent: u64,
    pub load_good: u64,
    pub load_unanswered: u64,
    /// The real scheduler started on the address once the attacker left,
    /// and both nodes joined it again.
    pub scheduler_restarted: bool,
    pub nodes_back: bool,
    /// Requests served after the restart (a short verified run).
    pub good_after_restart: u64,
}

/// What one relayed connection saw.
#[derive(Default)]
struct Seen {
    connections: AtomicU64,
    to_control: AtomicU64,
    to_region: AtomicU64,
    refused: AtomicU64,
    bytes_back: AtomicU64,
    reads_sent: AtomicU64,
    forged_sent: AtomicU64,
    inputs_read: AtomicU64,
}

/// The attacker's own bytes towards the region server: a hello for region 1
/// (a frontend's), then reads of every 16 MiB stretch with guessed
/// capabilities.
fn region_attack(region_len: u64) -> (Vec<u8>, u64) {
    let mut b = rw::hello(1).to_vec();
    let step = 1u64 << 24;
    let mut n = 0;
    for i in 0..READS_PER_CONN {
        let offset = (i * 4096) % region_len.saturating_sub(step).max(1);
        let r = rw::Request {
            id: i,
            offset,
            len: 4096,
            cap: 0x9e37_79b9_7f4a_7c15u64.wrapping_mul(i + 1),
        };
        b.extend_from_slice(&r.encode());
        n += 1;
    }
    (b, n)
}

/// The attacker's own bytes towards the control listener: `Results` frames
/// answering task ids 0.. with its output.
fn results_attack() -> (Vec<u8>, u64) {
    let mut b = Vec::new();
    for i in 0..RESULTS_PER_CONN {
        b.extend_from_slice(&wire::encode_to_vec(&Msg::Results {
            items: vec![TaskResult {
                id: TaskId(i),
                status: TaskStatus::Ok,
                started: Time(0),
                finished: Time(0),
                batch_size: 1,
                output: b"forged by the relay".to_vec(),
                cap: i,
            }],
        }));
    }
    (b, RESULTS_PER_CONN)
}

/// Parses the region server's answers in `back` (a welcome, then answers):
/// how many carried data.
fn answers_with_data(back: &[u8]) -> u64 {
    if back.len() < rw::WELCOME_LEN {
        return 0;
    }
    let mut at = rw::WELCOME_LEN;
    let mut n = 0;
    while back.len() - at >= rw::ANS_LEN {
        let h = rw::AnswerHeader::decode(back[at..at + rw::ANS_LEN].try_into().expect("16"));
        at += rw::ANS_LEN;
        if h.status == rw::ST_OK && h.len > 0 {
            n += 1;
            at = at.saturating_add(h.len as usize).min(back.len());
        }
    }
    n
}

/// The attacker: listens on `addr` until told to stop, relaying each
/// connection to `targets` in turn.
struct Relay {
    stop: Arc<AtomicBool>,
    addr: String,
    thread: Option<std::thread::JoinHandle<()>>,
    seen: Arc<Seen>,
    conns: Arc<Mutex<Vec<TcpStream>>>,
}

impl Relay {
    fn start(l: TcpListener, control: String, region: String, region_len: u64) -> Relay {
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Seen::default());
        let conns = Arc::new(Mutex::new(Vec::new()));
        let addr = l.local_addr().map(|a| a.to_string()).unwrap_or_default();
        let (st, sn, cs) = (stop.clone(), seen.clone(), conns.clone());
        let thread = std::thread::spawn(move || {
            for (i, s) in l.incoming().enumerate() {
                if st.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(node) = s else { continue };
                sn.connections.fetch_add(1, Ordering::SeqCst);
                let to_region = i % 2 == 1;
                let target = if to_region { &region } else { &control };
                let Ok(member) = TcpStream::connect(target) else {
                    continue;
                };
                if to_region {
                    sn.to_region.fetch_add(1, Ordering::SeqCst);
                } else {
                    sn.to_control.fetch_add(1, Ordering::SeqCst);
                }
                for s in [&node, &member] {
                    if let Ok(c) = s.try_clone() {
                        cs.lock().expect("lock").push(c);
                    }
                }
                relay_one(node, member, to_region, region_len, sn.clone());
            }
        });
        Relay {
            stop,
            addr,
            thread: Some(thread),
            seen,
            conns,
        }
    }

    /// Leaves the address: no more connections, every relayed one closed.
    fn leave(mut self) -> Arc<Seen> {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(&self.addr);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        for c in self.conns.lock().expect("lock").drain(..) {
            let _ = c.shutdown(std::net::Shutdown::Both);
        }
        self.seen.clone()
    }
}

/// Relays one connection: the node's bytes to the member, then the attack
/// of its own once the node's first bytes (its handshake's start) went
/// through; the member's bytes back to the node, counted and parsed.
fn relay_one(
    mut node: TcpStream,
    member: TcpStream,
    to_region: bool,
    region_len: u64,
    seen: Arc<Seen>,
) {
    let Ok(mut m_in) = member.try_clone() else {
        return;
    };
    let Ok(mut n_out) = node.try_clone() else {
        return;
    };
    let mut m_out = member;
    let sn = seen.clone();
    std::thread::spawn(move || {
        let mut b = vec![0u8; 65536];
        let mut attacked = false;
        let _ = node.set_read_timeout(Some(Duration::from_millis(500)));
        loop {
            match node.read(&mut b) {
                Ok(0) => break,
                Ok(n) => {
                    if m_out.write_all(&b[..n]).is_err() {
                        break;
                    }
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(_) => break,
            }
            // The node's handshake went through (or it waits for an
            // answer): the attack of its own, once.
            if !attacked {
                attacked = true;
                let (bytes, n) = if to_region {
                    region_attack(region_len)
                } else {
                    results_attack()
                };
                if m_out.write_all(&bytes).is_ok() {
                    let c = if to_region {
                        &sn.reads_sent
                    } else {
                        &sn.forged_sent
                    };
                    c.fetch_add(n, Ordering::SeqCst);
                }
            }
        }
        let _ = m_out.shutdown(std::net::Shutdown::Write);
    });
    std::thread::spawn(move || {
        let mut b = vec![0u8; 65536];
        let mut back = Vec::new();
        while let Ok(n @ 1..) = m_in.read(&mut b) {
            seen.bytes_back.fetch_add(n as u64, Ordering::SeqCst);
            if back.len() < 64 << 20 {
                back.extend_from_slice(&b[..n]);
            }
            if n_out.write_all(&b[..n]).is_err() {
                break;
            }
        }
        if back.is_empty() {
            seen.refused.fetch_add(1, Ordering::SeqCst);
        }
        if to_region {
            seen.inputs_read
                .fetch_add(answers_with_data(&back), Ordering::SeqCst);
        }
        let _ = n_out.shutdown(std::net::Shutdown::Both);
    });
}

/// A free port on 127.0.0.1.
fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Runs the relay attack against a cluster of `exe` (the `fermata` binary),
/// with its workload file in `dir`.
pub fn run(exe: &Path, dir: &Path) -> Result<RelayReport> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join("relay.toml");
    std::fs::write(&path, super::super::procs::small_workload("relay", 1))?;
    let w = Workload::from_file(&path)?;
    let data_port = free_port()?;
    let mut o = ProcOpts::new(path.clone());
    o.frontend_args = vec!["--data-listen".into(), format!("127.0.0.1:{data_port}")];
    let mut c = ProcCluster::start(exe, &o)?;
    let region = format!("127.0.0.1:{data_port}");
    let control = c.frontend_addrs[0].clone();
    let region_len = 512u64 << 20;

    // The load, checking every output, over the whole attack.
    let secs = HOLD.as_secs_f64() + 4.0;
    let load = {
        let (tr, w) = (c.secret.transport()?, w.clone());
        let mut lo = super::super::loadgen::LoadgenOpts::new(c.frontend_addrs.clone(), &w);
        lo.rate_rps = 100.0;
        lo.warmup = crate::core::Dur::ZERO;
        lo.duration = crate::core::Dur::from_secs_f64(secs);
        lo.verify = true;
        std::thread::spawn(move || super::super::loadgen::run(tr, &w, &lo))
    };
    std::thread::sleep(Duration::from_secs(1));

    // The scheduler goes; the attacker takes its address.
    let addr = c.scheduler_addr.clone();
    c.scheduler.signal(libc::SIGKILL);
    let _ = c.scheduler.child.wait();
    let l = {
        let end = Instant::now() + Duration::from_secs(5);
        loop {
            match TcpListener::bind(&addr) {
                Ok(l) => break l,
                Err(_) if Instant::now() < end => std::thread::sleep(Duration::from_millis(10)),
                Err(e) => return Err(e).context("binding the scheduler's address"),
            }
        }
    };
    let relay = Relay::start(l, control, region, region_len);
    std::thread::sleep(HOLD);
    let seen = relay.leave();

    // The real scheduler again, on its address.
    let mut args = c.scheduler_args.clone();
    if let Some(i) = args.iter().position(|a| a == "--listen") {
        args[i + 1] = addr.clone();
    }
    let restarted = Proc::spawn(exe, "scheduler2", &args, false).and_then(|mut p| {
        p.wait_for("listening", Duration::from_secs(20), |l| {
            l.starts_with("fermata scheduler listening on")
                .then(|| l.to_string())
        })?;
        Ok(p)
    });
    let scheduler_restarted = restarted.is_ok();
    let mut nodes_back = false;
    if let Ok(p) = restarted {
        let old = std::mem::replace(&mut c.scheduler, p);
        let _ = old.stop(Duration::from_millis(100));
        nodes_back = true;
        for (p, what) in c
            .backends
            .iter_mut()
            .map(|p| (p, "fermata backend back in service"))
            .chain(
                c.frontends
                    .iter_mut()
                    .map(|p| (p, "fermata frontend back in service")),
            )
        {
            nodes_back &= p
                .wait_for(what, Duration::from_secs(20), |l| {
                    l.starts_with(what).then(|| l.to_string())
                })
                .is_ok();
        }
    }
    let r = load
        .join()
        .map_err(|_| anyhow::anyhow!("the load generator panicked"))??;
    // Served again, through the restarted scheduler.
    let after = {
        let tr = c.secret.transport()?;
        let mut lo = super::super::loadgen::LoadgenOpts::new(c.frontend_addrs.clone(), &w);
        lo.rate_rps = 100.0;
        lo.warmup = crate::core::Dur::ZERO;
        lo.duration = crate::core::Dur::from_secs_f64(2.0);
        lo.verify = true;
        super::super::loadgen::run(tr, &w, &lo)?
    };
    c.stop();
    let g = |a: &AtomicU64| a.load(Ordering::SeqCst);
    Ok(RelayReport {
        connections: g(&seen.connections),
        to_control: g(&seen.to_control),
        to_region: g(&seen.to_region),
        refused: g(&seen.refused),
        bytes_back: g(&seen.bytes_back),
        reads_sent: g(&seen.reads_sent),
        forged_sent: g(&seen.forged_sent),
        inputs_read: g(&seen.inputs_read),
        forged_accepted: r.wrong_outputs + after.wrong_outputs,
        load_sent: r.sent,
        load_good: r.sim.good(),
        load_unanswered: r.unanswered,
        scheduler_restarted,
        nodes_back,
        good_after_restart: after.sim.good(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn region_answers_with_data_are_counted_and_refusals_are_not() {
        let mut back = rw::welcome(rw::ST_OK, 1 << 20).to_vec();
        let ans = |id: u64, st: u32, len: u32| {
            let mut a = id.to_le_bytes().to_vec();
            a.extend_from_slice(&st.to_le_bytes());
            a.extend_from_slice(&len.to_le_bytes());
            a
        };
        back.extend(ans(1, rw::ST_DENIED, 0));
        back.extend(ans(2, rw::ST_OK, 3));
        back.extend_from_slice(b"abc");
        back.extend(ans(3, rw::ST_OOB, 0));
        back.extend(ans(4, rw::ST_OK, 1));
        back.push(9);
        assert_eq!(answers_with_data(&back), 2);
        assert_eq!(answers_with_data(&back[..rw::WELCOME_LEN]), 0);
        assert_eq!(answers_with_data(&[]), 0);
    }
}
