//! Socket set-up shared by the TCP transport's parts: resolving an address, a
//! blocking connect with a timeout, and binding a listener that the runtime then
//! takes over.

use super::options::CONNECT_TIMEOUT;
use super::runtime::Inner;
use anyhow::Context as _;
use std::net::{SocketAddr, ToSocketAddrs};

fn resolve(addr: &str) -> anyhow::Result<Vec<SocketAddr>> {
    let addrs: Vec<SocketAddr> = addr
        .to_socket_addrs()
        .with_context(|| format!("resolving `{addr}`"))?
        .collect();
    if addrs.is_empty() {
        anyhow::bail!("`{addr}` resolves to no address");
    }
    Ok(addrs)
}

/// A blocking connect (from any thread) with [`CONNECT_TIMEOUT`] per address.
pub(super) fn connect_std(addr: &str) -> anyhow::Result<std::net::TcpStream> {
    let mut last = None;
    for a in resolve(addr)? {
        match std::net::TcpStream::connect_timeout(&a, CONNECT_TIMEOUT) {
            Ok(s) => {
                s.set_nodelay(true)
                    .with_context(|| format!("setting TCP_NODELAY on the connection to {a}"))?;
                return Ok(s);
            }
            Err(e) => last = Some((a, e)),
        }
    }
    let (a, e) = last.expect("at least one address");
    Err(e).with_context(|| format!("connecting to `{addr}` ({a})"))
}

/// Answers and frames of at least this many bytes are read with the
/// connection's ACKs sent at once ([`quick_ack`]).
pub(super) const QUICK_ACK_FROM: usize = 32 << 10;

/// Asks the kernel to acknowledge what arrives on `s` at once rather than
/// delay it (`TCP_QUICKACK`, Linux; elsewhere nothing).
///
/// A connection of requests and answers (a region reader's, a client's)
/// looks interactive to Linux, which then delays its ACKs, window updates
/// included. An answer larger than the window offered so far (on loopback
/// one 64 KiB segment) then waits, once the reader has taken the window's
/// bytes, for the delayed ACK that reopens it: pulls of 150 KB inputs
/// stalled 5-65 ms, in one or two of every hundred, at 200 r/s on an idle
/// machine. The kernel may go back to delaying, so it is asked again before
/// each large answer or frame (one system call).
pub(super) fn quick_ack(s: &tokio::net::TcpStream) {
    #[cfg(target_os = "linux")]
    {
        // Best effort: without it, ACKs are only delayed.
        let _ = socket2::SockRef::from(s).set_tcp_quickack(true);
    }
    #[cfg(not(target_os = "linux"))]
    let _ = s;
}

fn bind_std(addr: &str, what: &str) -> anyhow::Result<std::net::TcpListener> {
    let l = std::net::TcpListener::bind(addr)
        .with_context(|| format!("binding the {what} to `{addr}`"))?;
    l.set_nonblocking(true)
        .with_context(|| format!("making the {what} at `{addr}` non-blocking"))?;
    Ok(l)
}

/// Binds the `what` (for error messages: "listener", "region server") to `addr`
/// and registers it with `inner`'s runtime; the listener and the address it got.
pub(super) fn bind(
    inner: &Inner,
    addr: &str,
    what: &str,
) -> anyhow::Result<(tokio::net::TcpListener, SocketAddr)> {
    let l = bind_std(addr, what)?;
    let local = l
        .local_addr()
        .with_context(|| format!("the address of the {what} at `{addr}`"))?;
    let l = inner
        .listener(l)
        .with_context(|| format!("registering the {what} at `{addr}`"))?;
    Ok((l, local))
}

#[cfg(test)]
mod tests {
    /// `quick_ack` turns on TCP_QUICKACK on a connected stream (Linux).
    #[cfg(target_os = "linux")]
    #[test]
    fn quick_ack_turns_delayed_acks_off() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()
            .unwrap();
        rt.block_on(async {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = l.local_addr().unwrap();
            let (c, _) = tokio::join!(tokio::net::TcpStream::connect(addr), l.accept());
            let c = c.unwrap();
            let sock = socket2::SockRef::from(&c);
            sock.set_tcp_quickack(false).unwrap();
            assert!(!sock.tcp_quickack().unwrap());
            super::quick_ack(&c);
            assert!(sock.tcp_quickack().unwrap());
        });
    }
}
