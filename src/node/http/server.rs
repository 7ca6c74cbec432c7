//! [`HttpServer`]: hyper 1 (HTTP/1.1 with keep-alive) on its own small tokio
//! runtime: the listening socket, the accept loop (one task per connection), and
//! stop.

use super::options::HttpOpts;
use super::routes::App;
use crate::metrics::Registry;
use crate::node::frontend::FrontendHandle;
use anyhow::{Context, Result};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

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

/// Serves one connection (keep-alive) until it ends.
async fn serve_connection(app: Arc<App>, stream: tokio::net::TcpStream, peer: SocketAddr) {
    let svc = hyper::service::service_fn(move |req| {
        let app = app.clone();
        async move { Ok::<_, std::convert::Infallible>(app.handle(req).await) }
    });
    if let Err(e) = hyper::server::conn::http1::Builder::new()
        .keep_alive(true)
        .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
        .await
    {
        tracing::debug!(%peer, error = %e, "http: connection ended with an error");
    }
}
