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
