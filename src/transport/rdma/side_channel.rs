//! The TCP side channel every queue pair is set up over: connecting and
//! accepting, the hello that exchanges endpoints (and, from a region server, the
//! region's description), the "ready" byte, and waiting for the channel's end,
//! which is the liveness signal of the connection it set up. With a cluster
//! key the side channel opens with the secure channel's handshake
//! ([`crate::transport::auth`]) and the hello and ready bytes travel in its
//! records.

use super::options::HANDSHAKE_TIMEOUT;
use crate::transport::auth::{self, Channel, ClusterKey, Service, MAX_RECORD, TAG};
use crate::transport::rdma_wire::{Endpoint, ENDPOINT_BYTES};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

const HELLO_MAGIC: [u8; 4] = *b"FRD1";
pub(super) const KIND_CTRL: u8 = 1;
pub(super) const KIND_REGION: u8 = 2;
/// Region description a region server appends to its hello (zeroes elsewhere).
const REGION_BYTES: usize = 4 + 8 + 8 + 4;
const HELLO_BYTES: usize = 4 + 1 + ENDPOINT_BYTES + REGION_BYTES;
/// Where the region description starts in a hello.
const DESC_AT: usize = 5 + ENDPOINT_BYTES;

/// What a region server tells a reader in its hello.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) struct RegionDesc {
    pub(super) region: u32,
    pub(super) len: u64,
    pub(super) base: u64,
    pub(super) rkey: u32,
}

/// A side channel's socket, and its secure channel when the transport has a
/// cluster key.
pub(super) struct SideTcp {
    pub(super) tcp: TcpStream,
    ch: Option<Channel>,
}

impl std::ops::Deref for SideTcp {
    type Target = TcpStream;
    fn deref(&self) -> &TcpStream {
        &self.tcp
    }
}

impl SideTcp {
    /// Sends `b` (one record through the channel).
    fn send(&mut self, b: &[u8]) -> anyhow::Result<()> {
        match &mut self.ch {
            None => self.tcp.write_all(b)?,
            Some(c) => {
                let mut out = Vec::new();
                c.sealer.seal(b, &mut out)?;
                self.tcp.write_all(&out)?;
            }
        }
        Ok(())
    }

    /// Reads exactly `b.len()` bytes (whole records through the channel).
    fn recv(&mut self, b: &mut [u8]) -> anyhow::Result<()> {
        let Some(c) = &mut self.ch else {
            self.tcp.read_exact(b)?;
            return Ok(());
        };
        let mut got = Vec::new();
        while got.len() < b.len() {
            let mut rec = vec![0u8; 2];
            self.tcp.read_exact(&mut rec)?;
            let n = u16::from_be_bytes([rec[0], rec[1]]) as usize;
            anyhow::ensure!(
                (TAG..=MAX_RECORD).contains(&n) && got.len() + n - TAG <= b.len(),
                "a malformed record from the peer"
            );
            rec.resize(2 + n, 0);
            self.tcp.read_exact(&mut rec[2..])?;
            c.opener.open(&rec, &mut got)?;
        }
        anyhow::ensure!(got.len() == b.len(), "a malformed record from the peer");
        b.copy_from_slice(&got);
        Ok(())
    }
}

/// Sends our hello, reads the peer's; checks magic and kind.
pub(super) fn exchange_hello(
    tcp: &mut SideTcp,
    kind: u8,
    ours: &Endpoint,
    region: RegionDesc,
) -> anyhow::Result<(Endpoint, RegionDesc)> {
    tcp.send(&hello(kind, ours, region))?;
    let mut p = [0u8; HELLO_BYTES];
    tcp.recv(&mut p)?;
    parse_hello(&p, kind)
}

fn hello(kind: u8, ours: &Endpoint, region: RegionDesc) -> [u8; HELLO_BYTES] {
    let mut b = [0u8; HELLO_BYTES];
    b[0..4].copy_from_slice(&HELLO_MAGIC);
    b[4] = kind;
    let e = DESC_AT;
    b[5..e].copy_from_slice(&ours.to_bytes());
    b[e..e + 4].copy_from_slice(&region.region.to_le_bytes());
    b[e + 4..e + 12].copy_from_slice(&region.len.to_le_bytes());
    b[e + 12..e + 20].copy_from_slice(&region.base.to_le_bytes());
    b[e + 20..e + 24].copy_from_slice(&region.rkey.to_le_bytes());
    b
}

/// The peer's endpoint and region description, from its hello `p`, which must be
/// of `kind`.
fn parse_hello(p: &[u8; HELLO_BYTES], kind: u8) -> anyhow::Result<(Endpoint, RegionDesc)> {
    if p[0..4] != HELLO_MAGIC {
        anyhow::bail!("the peer is not a fermata rdma endpoint (bad hello)");
    }
    if p[4] != kind {
        anyhow::bail!(
            "the peer expects a {} connection, this is a {} one (control address and region \
             address mixed up?)",
            kind_name(p[4]),
            kind_name(kind)
        );
    }
    let e = DESC_AT;
    let ep = Endpoint::from_bytes(p[5..e].try_into().expect("endpoint bytes"));
    let u64_at = |i: usize| u64::from_le_bytes(p[i..i + 8].try_into().expect("8"));
    let u32_at = |i: usize| u32::from_le_bytes(p[i..i + 4].try_into().expect("4"));
    let desc = RegionDesc {
        region: u32_at(e),
        len: u64_at(e + 4),
        base: u64_at(e + 12),
        rkey: u32_at(e + 20),
    };
    Ok((ep, desc))
}

fn kind_name(k: u8) -> &'static str {
    match k {
        KIND_CTRL => "control",
        KIND_REGION => "region",
        _ => "unknown",
    }
}

/// Both sides' "my receives are posted" byte.
pub(super) fn exchange_ready(tcp: &mut SideTcp) -> anyhow::Result<()> {
    tcp.send(&[1])?;
    let mut b = [0u8; 1];
    tcp.recv(&mut b)?;
    anyhow::ensure!(b[0] == 1, "bad ready byte from the peer");
    Ok(())
}

/// Connects the side channel to `service` at `addr` and, with `key`, opens
/// the secure channel ([`crate::transport::auth`]).
pub(super) fn tcp_connect(
    addr: &str,
    service: Service,
    key: Option<&ClusterKey>,
) -> anyhow::Result<SideTcp> {
    let mut last = None;
    for sa in addr
        .to_socket_addrs()
        .map_err(|e| anyhow::anyhow!("bad address `{addr}`: {e}"))?
    {
        match TcpStream::connect_timeout(&sa, HANDSHAKE_TIMEOUT) {
            Ok(mut s) => {
                let ch = match key {
                    Some(k) => Some(
                        auth::dial_std(&mut s, k, service, addr)
                            .map_err(|e| anyhow::anyhow!("authenticating to `{addr}`: {e}"))?,
                    ),
                    None => None,
                };
                return Ok(SideTcp { tcp: s, ch });
            }
            Err(e) => last = Some(e),
        }
    }
    match last {
        Some(e) => anyhow::bail!("cannot connect to `{addr}`: {e}"),
        None => anyhow::bail!("address `{addr}` resolves to nothing"),
    }
}

pub(super) fn handshake_timeouts(tcp: &TcpStream, on: bool) -> std::io::Result<()> {
    let t = on.then_some(HANDSHAKE_TIMEOUT);
    tcp.set_read_timeout(t)?;
    tcp.set_write_timeout(t)?;
    tcp.set_nodelay(true)
}

/// Blocks until the peer closes `tcp` (or it breaks).
pub(super) fn wait_eof(mut tcp: TcpStream) {
    let mut b = [0u8; 64];
    loop {
        match tcp.read(&mut b) {
            Ok(0) => return,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return,
        }
    }
}

/// A thread accepting side channels; stopped (and joined) on drop.
pub(super) struct AcceptThread {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl AcceptThread {
    /// Accepts on `listener` (of `service`) until stopped, running `on_conn`
    /// on a thread per connection once the peer opened the secure channel
    /// over `key` (when given; a peer that does not is logged and closed).
    pub(super) fn spawn(
        listener: TcpListener,
        key: Option<ClusterKey>,
        service: Service,
        on_conn: impl Fn(SideTcp, String) + Send + Sync + 'static,
    ) -> std::io::Result<AcceptThread> {
        listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let on_conn = move |mut s: TcpStream, peer: String| {
            let ch = match &key {
                Some(k) => match auth::accept_std(&mut s, k, service) {
                    Ok((ch, _)) => Some(ch),
                    Err(e) => {
                        if let Some(unlogged) = auth::refusal() {
                            tracing::warn!(%peer, reason = %e, unlogged, refused_total = auth::refused_total(), "rdma: refused a peer that is not a cluster member");
                        }
                        return;
                    }
                },
                None => None,
            };
            on_conn(SideTcp { tcp: s, ch }, peer)
        };
        let thread = accept_loop(listener, stop.clone(), Arc::new(on_conn))?;
        Ok(AcceptThread {
            stop,
            thread: Some(thread),
        })
    }

    /// Stops accepting and waits for the thread (once; later calls do nothing).
    pub(super) fn stop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(h) = self.thread.take() {
            let _ = h.join();
        }
    }
}

impl Drop for AcceptThread {
    fn drop(&mut self) {
        self.stop();
    }
}

type OnConn = dyn Fn(TcpStream, String) + Send + Sync;

fn accept_loop(
    listener: TcpListener,
    stop: Arc<AtomicBool>,
    on_conn: Arc<OnConn>,
) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("rdma-accept".into())
        .spawn(move || {
            while !stop.load(Ordering::Acquire) {
                match listener.accept() {
                    Ok((s, peer)) => {
                        if s.set_nonblocking(false).is_err() {
                            continue;
                        }
                        let f = on_conn.clone();
                        let peer = peer.to_string();
                        let _ = std::thread::Builder::new()
                            .name("rdma-conn".into())
                            .spawn(move || f(s, peer));
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        })
}
