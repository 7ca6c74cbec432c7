//! Listening for control connections: [`listen`] binds, and an accept task makes a
//! connection of every accepted socket and announces it as
//! [`Event::Accepted`] before its messages.

use super::conn::new_conn;
use super::net;
use super::runtime::Inner;
use crate::transport::auth::Service;
use crate::transport::{Conn, Event, EventTx, Listener};
use std::sync::{Arc, Weak};
use std::time::Duration;

struct TcpListenerHandle {
    addr: String,
    task: tokio::task::JoinHandle<()>,
    _inner: Arc<Inner>,
}

impl Listener for TcpListenerHandle {
    fn local_addr(&self) -> String {
        self.addr.clone()
    }
}

impl Drop for TcpListenerHandle {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// [`Transport::listen`](crate::transport::Transport::listen) for TCP.
pub(super) fn listen(
    inner: &Arc<Inner>,
    addr: &str,
    events: EventTx,
) -> anyhow::Result<Box<dyn Listener>> {
    let (l, local) = net::bind(inner, addr, "listener")?;
    let task = inner
        .handle
        .spawn(accept_loop(Arc::downgrade(inner), l, events));
    Ok(Box::new(TcpListenerHandle {
        addr: local.to_string(),
        task,
        _inner: inner.clone(),
    }))
}

async fn accept_loop(inner: Weak<Inner>, listener: tokio::net::TcpListener, events: EventTx) {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                // Out of file descriptors and the like: wait a little, go on.
                tracing::warn!(error = %e, "tcp: accepting a connection failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Some(strong) = inner.upgrade() else {
            return;
        };
        if let Err(e) = stream.set_nodelay(true) {
            tracing::warn!(%peer, error = %e, "tcp: setting TCP_NODELAY failed");
        }
        // The handshake runs on its own task: a peer that sends nothing holds
        // up no one else's accept.
        let key = strong.key.clone();
        drop(strong);
        let (inner, events) = (inner.clone(), events.clone());
        tokio::spawn(async move {
            let mut stream = stream;
            let Ok(ch) = Inner::authenticate(&key, &mut stream, &peer, Service::Control).await
            else {
                return;
            };
            let Some(inner) = inner.upgrade() else { return };
            let (conn, start) = new_conn(&inner, stream, peer.to_string(), events.clone(), ch);
            let conn: Arc<dyn Conn> = conn;
            if events.send_detached(Event::Accepted(conn.clone())).is_err() {
                // Nobody listens to this listener's events any more.
                conn.close("listener's event loop is gone");
                return;
            }
            start();
        });
    }
}
