//! The tokio runtime a [`Tcp`](super::Tcp) transport owns ([`Inner`], shared by
//! everything made with the transport), how sockets made with std are handed to it,
//! and the stop signal its tasks wait on.

use super::options::{pull_streams, tcp_threads};
use crate::transport::auth::{self, Channel, ClusterKey, Service};
use anyhow::Context as _;
use std::sync::atomic::AtomicU64;
use std::time::Duration;
use tokio::runtime::{Handle, Runtime};
use tokio::sync::watch;

/// The runtime and the connection id counter of one transport (and its clones).
pub(super) struct Inner {
    rt: Option<Runtime>,
    pub(super) handle: Handle,
    pub(super) next_id: AtomicU64,
    /// The cluster secret every connection proves (None: no handshake, for
    /// tests and tools that talk to no cluster).
    pub(super) key: Option<ClusterKey>,
    /// Connections a region reader made with this transport keeps to each
    /// peer ([`pull_streams`]).
    pub(super) pull_streams: usize,
}

impl Inner {
    /// Starts the runtime (worker threads named `fermata-tcp`, see
    /// [`tcp_threads`]).
    pub(super) fn start(key: Option<ClusterKey>) -> anyhow::Result<Inner> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(tcp_threads())
            .thread_name("fermata-tcp")
            .enable_all()
            .build()
            .context("starting the TCP transport's tokio runtime")?;
        let handle = rt.handle().clone();
        Ok(Inner {
            rt: Some(rt),
            handle,
            next_id: AtomicU64::new(1),
            key,
            pull_streams: pull_streams(),
        })
    }

    /// Opens the secure channel on a socket just connected to `service` at
    /// `addr` (blocking), when the transport has a key (None without one:
    /// the bytes then pass in the clear).
    pub(super) fn authenticate_std(
        &self,
        s: &mut std::net::TcpStream,
        addr: &str,
        service: Service,
    ) -> anyhow::Result<Option<Channel>> {
        match &self.key {
            Some(k) => Ok(Some(
                auth::dial_std(s, k, service, addr)
                    .with_context(|| format!("authenticating to `{addr}`"))?,
            )),
            None => Ok(None),
        }
    }

    /// Opens the secure channel on a socket just accepted by a `service`
    /// listener, when the transport has a key; a peer that fails is logged
    /// and refused (Err).
    pub(super) async fn authenticate(
        key: &Option<ClusterKey>,
        s: &mut tokio::net::TcpStream,
        peer: &std::net::SocketAddr,
        service: Service,
    ) -> Result<Option<Channel>, ()> {
        let Some(k) = key else { return Ok(None) };
        let port = s.local_addr().map(|a| a.port()).unwrap_or(0);
        match auth::accept_async(s, k, service, port).await {
            Ok((ch, d)) => {
                tracing::debug!(%peer, role = %d.role, dialed = %d.dialed, "tcp: {}: a member's channel is open", service.name());
                Ok(Some(ch))
            }
            Err(e) => {
                refusal_warning(peer, service, &e);
                Err(())
            }
        }
    }

    /// Registers a connected (non-blocking) std socket with the runtime.
    pub(super) fn stream(&self, s: std::net::TcpStream) -> std::io::Result<tokio::net::TcpStream> {
        let _g = self.handle.enter();
        tokio::net::TcpStream::from_std(s)
    }

    /// Registers a bound (non-blocking) std listener with the runtime.
    pub(super) fn listener(
        &self,
        l: std::net::TcpListener,
    ) -> std::io::Result<tokio::net::TcpListener> {
        let _g = self.handle.enter();
        tokio::net::TcpListener::from_std(l)
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            if Handle::try_current().is_ok() {
                // Dropped inside a runtime (maybe our own): must not block.
                rt.shutdown_background();
            } else {
                rt.shutdown_timeout(Duration::from_secs(1));
            }
        }
    }
}

/// Counts a refused peer, and warns about it at most once per 10 s (with the
/// count of those not warned about, and the total).
fn refusal_warning(peer: &std::net::SocketAddr, service: Service, e: &auth::AuthError) {
    if let Some(unlogged) = auth::refusal() {
        tracing::warn!(%peer, reason = %e, unlogged, refused_total = auth::refused_total(), "tcp: {}: refused a peer that is not a cluster member", service.name());
    }
}

/// Resolves once `stop` is set (or its sender is gone).
pub(super) async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}
