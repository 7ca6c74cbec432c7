//! `fermata bench attacks`: memory attacks on the internal ports,
//! repeated against real processes on loopback while a load generator runs.
//! Each attack opens connections that announce 64 MiB frames and send what
//! the target takes; what is measured is how many bytes each connection could
//! send before it was closed, the target's resident memory (VmRSS) while the
//! connections are open and after they close, and how the legitimate load
//! fared meanwhile.
//!
//! - **outsider**: no cluster secret; 10 connections to the scheduler and 10
//!   to the frontend, each announcing a 64 MiB frame and sending up to 48 MiB.
//! - **member**: a peer holding the secret (past the handshake); 10
//!   connections to the frontend, each sending 48 MiB of an unfinished 64 MiB
//!   frame. Bounded per connection by the frame limit, not refused: what
//!   matters is that the memory goes back when they close.
//! - **relay** ([`relay`]): a process without the secret holds the address
//!   the nodes dial while the scheduler is down and relays their handshakes
//!   to a frontend's real ports.
//! - **amplify** ([`amplify`]): members send region reads that ask for far
//!   more than they send, and never read the answers.

pub mod amplify;
pub mod relay;

use super::procs::{ProcCluster, ProcOpts};
use crate::transport::auth::{dial_std, ClusterKey, Service};
use crate::transport::secure_io::SecureStd;
use crate::workload::Workload;
use anyhow::{Context, Result};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::Duration;

/// Connections per attack and target.
const CONNS: usize = 10;
/// Bytes each connection tries to send after its frame's length prefix.
const SEND: usize = 48 << 20;

/// One attack's figures.
#[derive(Debug, Clone, serde::Serialize)]
pub struct AttackRow {
    pub attack: String,
    pub target: String,
    pub connections: usize,
    /// The most bytes one connection got written before it was closed (or
    /// all it tried to send): for a connection closed at once, what the
    /// kernels' socket buffers took before the reset, not what the target
    /// kept.
    pub max_bytes_sent: u64,
    /// Connections the target closed.
    pub closed_by_target: usize,
    /// The target's VmRSS before, with the connections open, and once they
    /// closed (MB): when it was back within 16 MB of before, or 5 s after.
    pub rss_before_mb: f64,
    pub rss_open_mb: f64,
    pub rss_after_mb: f64,
    /// Seconds from the close until the memory was back (None: not within 5 s).
    pub returned_after_s: Option<f64>,
}

/// The whole run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct AttacksReport {
    pub rows: Vec<AttackRow>,
    /// The legitimate load during the attacks.
    pub load_sent: u64,
    pub load_good: u64,
    pub load_bad_rate: f64,
    pub load_unanswered: u64,
}

/// VmRSS of process `pid` in MB (NaN when unreadable).
pub(crate) fn rss_mb(pid: u32) -> f64 {
    let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return f64::NAN;
    };
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

/// Opens a connection to `addr` (proving `key` when given), announces a
/// 64 MiB frame and writes up to [`SEND`] bytes of it; the stream (None when
/// the target closed it) and the bytes written.
fn flood(addr: &str, key: Option<&ClusterKey>) -> Result<(Option<Sock>, u64)> {
    let mut s = TcpStream::connect(addr).with_context(|| format!("connecting to {addr}"))?;
    s.set_write_timeout(Some(Duration::from_secs(5)))?;
    let mut s = match key {
        Some(k) => {
            let ch =
                dial_std(&mut s, k, Service::Control, addr).map_err(|e| anyhow::anyhow!("{e}"))?;
            Sock::Sealed(SecureStd::new(s, ch))
        }
        None => Sock::Plain(s),
    };
    // The frame's length prefix, then its body, 1 MiB at a time.
    if s.write_all(&(64u32 << 20).to_le_bytes()).is_err() {
        return Ok((None, 0));
    }
    let chunk = vec![0u8; 1 << 20];
    let mut sent = 4u64;
    while (sent as usize) < SEND {
        match s.write(&chunk) {
            Ok(0) | Err(_) => return Ok((None, sent)),
            Ok(n) => sent += n as u64,
        }
    }
    // Still open: does the target close it in a moment (an outsider's is
    // closed at its first bytes, the writes above may just have been
    // buffered by the kernel)?
    s.tcp().set_read_timeout(Some(Duration::from_millis(300)))?;
    let mut b = [0u8; 64];
    loop {
        match s.read(&mut b) {
            Ok(0) => return Ok((None, sent)),
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return Ok((None, sent)),
            Err(_) => return Ok((Some(s), sent)),
        }
    }
}

/// An attacker's socket: in the clear (an outsider) or through the channel
/// (a member).
enum Sock {
    Plain(TcpStream),
    Sealed(SecureStd<TcpStream>),
}

impl Sock {
    fn tcp(&self) -> &TcpStream {
        match self {
            Sock::Plain(s) => s,
            Sock::Sealed(s) => s.get_ref(),
        }
    }
}

impl Read for Sock {
    fn read(&mut self, b: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Sock::Plain(s) => s.read(b),
            Sock::Sealed(s) => s.read(b),
        }
    }
}

impl Write for Sock {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        match self {
            Sock::Plain(s) => s.write(b),
            Sock::Sealed(s) => s.write(b),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn attack(
    name: &str,
    target: &str,
    addr: &str,
    pid: u32,
    key: Option<&ClusterKey>,
) -> Result<AttackRow> {
    let before = rss_mb(pid);
    let mut open = Vec::new();
    let (mut max_sent, mut closed) = (0u64, 0usize);
    for _ in 0..CONNS {
        let (s, sent) = flood(addr, key)?;
        max_sent = max_sent.max(sent);
        match s {
            Some(s) => open.push(s),
            None => closed += 1,
        }
    }
    std::thread::sleep(Duration::from_millis(500));
    let during = rss_mb(pid);
    drop(open);
    // How long until the memory is back (within 16 MB of before), up to 5 s.
    let closed_at = std::time::Instant::now();
    let mut returned = None;
    while closed_at.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(100));
        if rss_mb(pid) <= before + 16.0 {
            returned = Some(closed_at.elapsed().as_secs_f64());
            break;
        }
    }
    Ok(AttackRow {
        attack: name.to_string(),
        target: target.to_string(),
        connections: CONNS,
        max_bytes_sent: max_sent,
        closed_by_target: closed,
        rss_before_mb: before,
        rss_open_mb: during,
        rss_after_mb: rss_mb(pid),
        returned_after_s: returned,
    })
}

/// Runs the attacks against a cluster of `exe` (the `fermata` binary), with
/// its workload file in `dir`.
pub fn run(exe: &Path, dir: &Path) -> Result<AttacksReport> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join("attacks.toml");
    std::fs::write(&path, super::procs::small_workload("attacks", 1))?;
    let w = Workload::from_file(&path)?;
    let c = ProcCluster::start(exe, &ProcOpts::new(path))?;
    let load = c.load_in_background(&w, 100.0, 12.0)?;
    std::thread::sleep(Duration::from_millis(500));
    let sched = (c.scheduler_addr.clone(), c.scheduler.child.id());
    let fe = (c.frontend_addrs[0].clone(), c.frontends[0].child.id());
    let key = c.secret.key.clone();
    let rows = vec![
        attack("outsider", "scheduler", &sched.0, sched.1, None)?,
        attack("outsider", "frontend", &fe.0, fe.1, None)?,
        attack("member", "frontend", &fe.0, fe.1, Some(&key))?,
    ];
    let r = load
        .join()
        .map_err(|_| anyhow::anyhow!("the load generator panicked"))??;
    c.stop();
    Ok(AttacksReport {
        rows,
        load_sent: r.sent,
        load_good: r.sim.good(),
        load_bad_rate: r.sim.bad_rate(),
        load_unanswered: r.unanswered,
    })
}
