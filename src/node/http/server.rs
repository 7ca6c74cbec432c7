//! [`HttpServer`]: hyper 1 (HTTP/1.1 with keep-alive) on its own small tokio
//! runtime: the listening socket, the accept loop (one task per connection), and
//! stop.

use super::options::HttpOpts;
use super::routes::App;
use crate::metrics::Registry;
use crate::node::frontend::FrontendHandle;
use anyhow::{Context, Result};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context as TaskContext, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A running HTTP server (its own tokio runtime).
pub struct HttpServer {
    addr: SocketAddr,
    rt: Option<tokio::runtime::Runtime>,
}

impl HttpServer {
    /// The KServe v2 API of `fe`, with `/metrics`.
    pub fn start_frontend(fe: FrontendHandle, o: &HttpOpts) -> Result<HttpServer> {
        Self::start(App::frontend(fe, o), &o.listen, o.threads)
    }

    /// `/metrics` (and `/v2/health/live`) only: the scheduler's and backends'.
    pub fn start_metrics(listen: &str, regs: Vec<Arc<Registry>>) -> Result<HttpServer> {
        Self::start(App::metrics_only(regs), listen, 1)
    }

    fn start(app: App, listen: &str, threads: usize) -> Result<HttpServer> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads.max(1))
            .thread_name("http")
            .enable_all()
            .build()
            .context("cannot start the HTTP runtime")?;
        let std_listener = std::net::TcpListener::bind(listen)
            .with_context(|| format!("cannot listen for HTTP at {listen}"))?;
        std_listener.set_nonblocking(true)?;
        let addr = std_listener.local_addr()?;
        rt.spawn(accept_loop(Arc::new(app), std_listener));
        Ok(HttpServer { addr, rt: Some(rt) })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting and closes every connection (requests in flight still end
    /// at the frontend; their answers go nowhere).
    pub fn stop(mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_timeout(Duration::from_millis(200));
        }
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

/// Accepts connections for ever, each served on its own task.
async fn accept_loop(app: Arc<App>, std_listener: std::net::TcpListener) {
    let listener = match tokio::net::TcpListener::from_std(std_listener) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(error = %e, "http: cannot use the listening socket");
            return;
        }
    };
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(error = %e, "http: accepting a connection failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        tokio::spawn(serve_connection(app.clone(), stream, peer));
    }
}

/// Serves one connection (keep-alive) until it ends. Each request is stamped
/// with the moment its first byte was read ([`Stamped`]): a client's SLO runs
/// from there.
async fn serve_connection(app: Arc<App>, stream: tokio::net::TcpStream, peer: SocketAddr) {
    let stamp = Arc::new(Mutex::new(Stamp::Armed));
    let io = Stamped {
        io: stream,
        stamp: stamp.clone(),
    };
    let svc = hyper::service::service_fn(move |req| {
        let app = app.clone();
        let stamp = stamp.clone();
        async move {
            let t0 = take_stamp(&stamp);
            let resp = app.handle(req, t0).await;
            // The request is read (its body drained): the next byte read
            // begins the next request.
            *stamp.lock().expect("stamp lock") = Stamp::Armed;
            Ok::<_, std::convert::Infallible>(resp)
        }
    });
    if let Err(e) = hyper::server::conn::http1::Builder::new()
        .keep_alive(true)
        .serve_connection(hyper_util::rt::TokioIo::new(io), svc)
        .await
    {
        tracing::debug!(%peer, error = %e, "http: connection ended with an error");
    }
}

/// Where a connection is in noting its next request's first byte.
#[derive(Debug, Clone, Copy)]
enum Stamp {
    /// Between requests: the next byte read is a request's first.
    Armed,
    /// The first byte of the request being read came at this instant.
    Read(Instant),
    /// Its request is being served: reads are its body.
    Taken,
}

/// The stamp of the request now being served: when its first byte was read,
/// or now when the bytes came before the previous request ended (pipelined
/// in one read).
fn take_stamp(stamp: &Mutex<Stamp>) -> Instant {
    let mut s = stamp.lock().expect("stamp lock");
    let t = match *s {
        Stamp::Read(t) => t,
        Stamp::Armed | Stamp::Taken => Instant::now(),
    };
    *s = Stamp::Taken;
    t
}

/// A connection's socket that notes when the first byte of each request is
/// read. Hyper calls the service only once a request's head is parsed; a
/// client that sends its head slowly, or a server that reads it late, would
/// otherwise not be charged to the request's SLO.
struct Stamped {
    io: tokio::net::TcpStream,
    stamp: Arc<Mutex<Stamp>>,
}

impl AsyncRead for Stamped {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.io).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            let mut s = self.stamp.lock().expect("stamp lock");
            if let Stamp::Armed = *s {
                *s = Stamp::Read(Instant::now());
            }
        }
        r
    }
}

impl AsyncWrite for Stamped {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }
    fn poll_shutdown(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}
