//! [`HttpServer`]: hyper 1 (HTTP/1.1 with keep-alive) on its own small tokio
//! runtime: the listening socket, the accept loop (one task per connection), and
//! stop.

use super::conns::{Admitted, Conns};
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
    /// Draining, and the requests being answered ([`HttpServer::drain`]).
    life: Arc<Life>,
}

/// A server's drain state, shared with its handlers.
#[derive(Default)]
pub(super) struct Life {
    pub(super) draining: std::sync::atomic::AtomicBool,
    pub(super) in_flight: std::sync::atomic::AtomicUsize,
}

/// How a drain went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Drained {
    /// Requests still being answered when the drain gave up (0: all done).
    pub left: usize,
    pub took: Duration,
}

impl HttpServer {
    /// The KServe v2 API of `fe`, with `/metrics`.
    pub fn start_frontend(fe: FrontendHandle, o: &HttpOpts) -> Result<HttpServer> {
        let conns = Conns::new(o.max_connections, Some(&fe.metrics()));
        Self::start(App::frontend(fe, o), o, conns)
    }

    /// `/metrics` (and `/v2/health/live`) only: the scheduler's and backends'.
    pub fn start_metrics(listen: &str, regs: Vec<Arc<Registry>>) -> Result<HttpServer> {
        Self::start_metrics_with(listen, regs, Vec::new())
    }

    /// [`Self::start_metrics`] that also answers GET /PATH with each JSON
    /// producer's document (e.g. the scheduler's `v1/autoscale`).
    pub fn start_metrics_with(
        listen: &str,
        regs: Vec<Arc<Registry>>,
        json: Vec<(String, super::routes::JsonGet)>,
    ) -> Result<HttpServer> {
        let mut o = HttpOpts::new(listen);
        o.threads = 1;
        o.max_connections = o.max_connections.min(METRICS_MAX_CONNECTIONS);
        let conns = Conns::new(o.max_connections, regs.first().map(|r| r.as_ref()));
        Self::start(App::metrics_only(regs).with_json(json), &o, conns)
    }

    fn start(app: App, o: &HttpOpts, conns: Arc<Conns>) -> Result<HttpServer> {
        let threads = o.threads.max(1);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            // Large bodies are decoded off the workers (`routes.rs`); this
            // bounds how many at once.
            .max_blocking_threads(threads * 2)
            .thread_name("http")
            .enable_all()
            .build()
            .context("cannot start the HTTP runtime")?;
        let listen = &o.listen;
        let std_listener =
            listen_std(listen).with_context(|| format!("cannot listen for HTTP at {listen}"))?;
        let addr = std_listener.local_addr()?;
        let limits = ConnLimits {
            header_timeout: o.header_timeout,
        };
        let life = app.life.clone();
        rt.spawn(accept_loop(Arc::new(app), std_listener, conns, limits));
        Ok(HttpServer {
            addr,
            rt: Some(rt),
            life,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The first half of a graceful stop (SIGTERM): readiness answers 503
    /// ("draining") at once while requests are still served for `ready_grace`
    /// (so that a load balancer polling readiness takes this node out before
    /// it closes), then waits for the requests being answered, at most
    /// `max_wait`. [`HttpServer::stop`] closes afterwards.
    pub fn drain(&self, ready_grace: Duration, max_wait: Duration) -> Drained {
        use std::sync::atomic::Ordering;
        let t0 = Instant::now();
        self.life.draining.store(true, Ordering::Release);
        std::thread::sleep(ready_grace);
        let end = Instant::now() + max_wait;
        let mut left = self.life.in_flight.load(Ordering::Acquire);
        while left > 0 && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(5));
            left = self.life.in_flight.load(Ordering::Acquire);
        }
        Drained {
            left,
            took: t0.elapsed(),
        }
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

/// The accept queue asked of the kernel for the client-facing listeners (HTTP
/// and gRPC; the kernel caps it at `net.core.somaxconn`). Rust's standard
/// library asks for 128: when answers slow down, an open-loop client opens
/// connections by the hundred, the queue overflows, the kernel drops their
/// handshakes and each of those clients retries only a second later (`fermata
/// bench http` saw answers 1-3 s late in such bursts, connects of 1.03 s).
pub const LISTEN_BACKLOG: i32 = 4096;

/// A non-blocking listener at `addr` with a [`LISTEN_BACKLOG`] accept queue.
pub(in crate::node) fn listen_std(addr: &str) -> std::io::Result<std::net::TcpListener> {
    use std::os::fd::AsRawFd;
    let l = std::net::TcpListener::bind(addr)?;
    // Calling listen() again on a listening socket sets its queue's length.
    // SAFETY: listen() on a socket descriptor this function owns.
    if unsafe { libc::listen(l.as_raw_fd(), LISTEN_BACKLOG) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // Accepted sockets inherit it (so [`Stamped`] need not ask again), and the
    // kernel stamps packets from now on: a request whose bytes came while its
    // connection waited in the accept queue is charged with that wait too
    // (asked on each connection alone, its first bytes had no stamp and the
    // SLO started when they were read).
    note_arrivals(&l);
    l.set_nonblocking(true)?;
    Ok(l)
}

/// Most connections of a metrics-only server (`--metrics-listen`).
const METRICS_MAX_CONNECTIONS: usize = 64;

/// How long an accept error is quiet in the log after it is logged.
const ACCEPT_LOG_EVERY: Duration = Duration::from_secs(10);

/// What every connection is held to.
#[derive(Clone, Copy)]
struct ConnLimits {
    header_timeout: Duration,
}

/// Accepts connections for ever, each served on its own task (or refused at
/// the cap, see [`Conns`]). An accept error (EMFILE: out of file descriptors)
/// closes the longest-waiting connection, backs off (10 ms doubling to 1 s)
/// and is logged once per [`ACCEPT_LOG_EVERY`] with the count since.
async fn accept_loop(
    app: Arc<App>,
    std_listener: std::net::TcpListener,
    conns: Arc<Conns>,
    limits: ConnLimits,
) {
    let listener = match tokio::net::TcpListener::from_std(std_listener) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(error = %e, "http: cannot use the listening socket");
            return;
        }
    };
    let mut errors = AcceptErrors::default();
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(x) => {
                errors.accepted();
                x
            }
            Err(e) => {
                conns.evict_one();
                let wait = errors.note("http", &e, Instant::now());
                tokio::time::sleep(wait).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        match conns.admit() {
            Some(adm) => {
                tokio::spawn(serve_connection(app.clone(), stream, peer, adm, limits));
                conns.settle().await;
            }
            None => refuse(stream),
        }
    }
}

/// Accept errors: the backoff, and the log's quiet interval.
#[derive(Default)]
pub(in crate::node) struct AcceptErrors {
    backoff: Duration,
    logged_at: Option<Instant>,
    since_logged: u64,
}

impl AcceptErrors {
    /// A connection was accepted: the next error backs off from the start.
    pub(in crate::node) fn accepted(&mut self) {
        self.backoff = Duration::ZERO;
    }

    /// Notes error `e` of the `server` ("http", "grpc") at `now`: logs it
    /// unless one was logged within [`ACCEPT_LOG_EVERY`]; the time to wait
    /// before the next accept.
    pub(in crate::node) fn note(
        &mut self,
        server: &'static str,
        e: &std::io::Error,
        now: Instant,
    ) -> Duration {
        self.since_logged += 1;
        if self
            .logged_at
            .is_none_or(|t| now.duration_since(t) >= ACCEPT_LOG_EVERY)
        {
            let fds =
                e.raw_os_error() == Some(libc::EMFILE) || e.raw_os_error() == Some(libc::ENFILE);
            let hint = match (fds, server) {
                (false, _) => "",
                (true, "http") => {
                    " (out of file descriptors: raise `ulimit -n` or lower --http-max-connections)"
                }
                (true, _) => " (out of file descriptors: raise `ulimit -n`)",
            };
            tracing::warn!(
                error = %e,
                errors = self.since_logged,
                "{server}: accepting connections fails{hint}; backing off (logged once per {}s)",
                ACCEPT_LOG_EVERY.as_secs()
            );
            self.logged_at = Some(now);
            self.since_logged = 0;
        }
        self.backoff = (self.backoff * 2).clamp(Duration::from_millis(10), Duration::from_secs(1));
        self.backoff
    }
}

/// Answers a connection over the cap with 503 and closes it (what the socket
/// takes at once; nothing waits on a client that does not read).
fn refuse(stream: tokio::net::TcpStream) {
    const BODY: &str = r#"{"error":"the server is at its connection limit (--http-max-connections) with every connection in a request; try again"}"#;
    let msg = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\nretry-after: 1\r\n\r\n{BODY}",
        BODY.len()
    );
    let _ = stream.try_write(msg.as_bytes());
}

/// Serves one connection (keep-alive) until it ends, or until [`Conns`] tells
/// it to make room: then a connection still sending its head is dropped (no
/// request of it was taken) and any other closes once its answer is written.
/// Each request is stamped with the moment its first byte was read
/// ([`Stamped`]): a client's SLO runs from there.
async fn serve_connection(
    app: Arc<App>,
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    adm: Admitted,
    limits: ConnLimits,
) {
    let stamp = Arc::new(Mutex::new(Stamp::Armed));
    let io = Stamped::new(stream, stamp.clone());
    let adm = Arc::new(adm);
    let svc = {
        let stamp = stamp.clone();
        let adm = adm.clone();
        hyper::service::service_fn(move |req| {
            let app = app.clone();
            let stamp = stamp.clone();
            let adm = adm.clone();
            async move {
                adm.busy();
                let t0 = take_stamp(&stamp);
                let resp = app.handle(req, t0).await;
                // The request is read (its body drained): the next byte read
                // begins the next request.
                *stamp.lock().expect("stamp lock") = Stamp::Armed;
                adm.waiting();
                Ok::<_, std::convert::Infallible>(resp)
            }
        })
    };
    let conn = hyper::server::conn::http1::Builder::new()
        .keep_alive(true)
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .serve_connection(hyper_util::rt::TokioIo::new(io), svc);
    tokio::pin!(conn);
    let r = tokio::select! {
        r = conn.as_mut() => r,
        _ = adm.slot.evict.notified() => {
            if matches!(*stamp.lock().expect("stamp lock"), Stamp::Read(_)) {
                tracing::debug!(%peer, "http: closed a connection still sending its head to make room");
                return;
            }
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(e) = r {
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

/// What a [`Stamped`] socket tells of each read that brought bytes: when the
/// host received them.
pub(in crate::node) trait NoteRead: Send + Sync + 'static {
    fn note(&self, received: Instant);
}

/// HTTP/1.1: the first read of a request (after the previous one was taken)
/// stamps it.
impl NoteRead for Mutex<Stamp> {
    fn note(&self, received: Instant) {
        let mut s = self.lock().expect("stamp lock");
        if let Stamp::Armed = *s {
            *s = Stamp::Read(received);
        }
    }
}

/// A connection's socket that tells `note` when the bytes of each read came:
/// the kernel's receive time ([`recv_stamped`]), or the moment they were read
/// where the kernel gave none. Hyper (and tonic above it) calls the service
/// only once a request's head is parsed; a client that sends its head slowly,
/// or a server that reads it late, would otherwise not be charged to the
/// request's SLO.
pub(in crate::node) struct Stamped<N: NoteRead> {
    io: tokio::net::TcpStream,
    note: Arc<N>,
}

impl<N: NoteRead> Stamped<N> {
    /// Wraps a connection accepted from a [`listen_std`] listener, whose
    /// receive timestamps it inherited.
    pub(in crate::node) fn new(io: tokio::net::TcpStream, note: Arc<N>) -> Stamped<N> {
        Stamped { io, note }
    }
    pub(in crate::node) fn note(&self) -> &Arc<N> {
        &self.note
    }
}

impl<N: NoteRead> AsyncRead for Stamped<N> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        use std::os::fd::AsRawFd;
        let this = self.get_mut();
        loop {
            std::task::ready!(this.io.poll_read_ready(cx))?;
            let fd = this.io.as_raw_fd();
            // SAFETY: `recv_stamped` only writes into the unfilled part of
            // `buf`, and says how many bytes it wrote.
            let unfilled = unsafe { buf.unfilled_mut() };
            let r = this
                .io
                .try_io(tokio::io::Interest::READABLE, || recv_stamped(fd, unfilled));
            match r {
                Ok((n, arrived)) => {
                    // SAFETY: recvmsg wrote the first n bytes of the unfilled part.
                    unsafe { buf.assume_init(n) };
                    buf.advance(n);
                    if n > 0 {
                        this.note.note(arrived.unwrap_or_else(Instant::now));
                    }
                    return Poll::Ready(Ok(()));
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

/// The longest a request's bytes may have waited in the kernel's socket
/// buffer for their receive time to be believed (beyond it the wall clock
/// more likely stepped).
const RECEIVE_AGE_MAX: Duration = Duration::from_secs(10);

/// Asks the kernel to note when each packet of `s` arrives (`SO_TIMESTAMPNS`),
/// so that [`recv_stamped`] can tell how long its bytes waited before they were
/// read. Best effort: without it a request is stamped when it is read.
fn note_arrivals(s: &impl std::os::fd::AsRawFd) {
    let on: libc::c_int = 1;
    // SAFETY: setsockopt with a pointer to a live c_int and its size.
    let r = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_TIMESTAMPNS,
            (&on as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r != 0 {
        tracing::debug!(error = %std::io::Error::last_os_error(), "http: no receive timestamps on a connection");
    }
}

/// Reads what `fd` has into `dst` (recvmsg), and when the kernel noted it, the
/// moment the bytes read arrived at this host (the latest of their packets),
/// as an [`Instant`].
///
/// Written with libc: neither tokio nor std reads a TCP socket's receive
/// timestamps. They are why a request's SLO starts when the host received it,
/// not when a busy HTTP worker got round to reading it: bytes that waited in
/// the socket buffer through a stall are charged with that wait, and the
/// scheduler drops what can no longer be on time rather than serve it late.
fn recv_stamped(
    fd: std::os::fd::RawFd,
    dst: &mut [std::mem::MaybeUninit<u8>],
) -> std::io::Result<(usize, Option<Instant>)> {
    let mut iov = libc::iovec {
        iov_base: dst.as_mut_ptr().cast(),
        iov_len: dst.len(),
    };
    // Room for one control message with a timespec (8-byte aligned).
    let mut control = [0u64; 8];
    // SAFETY: an all-zero msghdr is valid (no name, no control yet).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control) as _;
    // SAFETY: msg points at live buffers of the lengths it states.
    let n = unsafe { libc::recvmsg(fd, &mut msg, 0) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let (now, wall) = (Instant::now(), std::time::SystemTime::now());
    let mut arrived = None;
    // SAFETY: the CMSG_* walk stays within msg_control/msg_controllen as the
    // kernel filled them in; the data is read unaligned.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_TIMESTAMPNS {
                let ts: libc::timespec =
                    std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<libc::timespec>());
                let at = std::time::UNIX_EPOCH
                    + Duration::new(
                        ts.tv_sec.max(0) as u64,
                        ts.tv_nsec.clamp(0, 999_999_999) as u32,
                    );
                // A packet stamped after now (the wall clock stepped back) waited 0.
                let waited = wall.duration_since(at).unwrap_or(Duration::ZERO);
                if waited <= RECEIVE_AGE_MAX {
                    arrived = now.checked_sub(waited);
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    Ok((n as usize, arrived))
}

impl<N: NoteRead> AsyncWrite for Stamped<N> {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Bytes that waited in the socket buffer are stamped with when they
    /// arrived, not when they were read; without timestamps asked for, none.
    #[test]
    fn reads_tell_when_the_bytes_arrived() {
        use std::io::Write;
        use std::os::fd::AsRawFd;
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 64];
        c.write_all(b"before").unwrap();
        std::thread::sleep(Duration::from_millis(20));
        let (n, at) = recv_stamped(s.as_raw_fd(), &mut buf).unwrap();
        assert_eq!((n, at), (6, None), "no timestamps were asked for");
        note_arrivals(&s);
        // The kernel turns receive timestamps on a moment later (a deferred
        // switch): packets before that have none.
        let t0 = Instant::now();
        loop {
            c.write_all(b"x").unwrap();
            std::thread::sleep(Duration::from_millis(2));
            if recv_stamped(s.as_raw_fd(), &mut buf).unwrap().1.is_some() {
                break;
            }
            assert!(t0.elapsed() < Duration::from_secs(10), "no timestamps came");
        }
        c.write_all(b"GET / HTTP/1.1\r\n").unwrap();
        std::thread::sleep(Duration::from_millis(60));
        let (n, at) = recv_stamped(s.as_raw_fd(), &mut buf).unwrap();
        let waited = at.expect("a receive timestamp").elapsed();
        assert_eq!(n, 16);
        assert!(
            waited >= Duration::from_millis(55) && waited < Duration::from_secs(5),
            "{waited:?}"
        );
        // SAFETY: recvmsg wrote the first n bytes.
        let got: Vec<u8> = buf[..n]
            .iter()
            .map(|b| unsafe { b.assume_init() })
            .collect();
        assert_eq!(got, b"GET / HTTP/1.1\r\n");
    }

    /// A request sent on a connection that waits in the accept queue is
    /// stamped with when its bytes came, not when the connection was accepted.
    #[test]
    fn bytes_that_waited_for_accept_are_stamped_with_their_arrival() {
        use std::io::Write;
        use std::os::fd::AsRawFd;
        let l = listen_std("127.0.0.1:0").unwrap();
        l.set_nonblocking(false).unwrap();
        let addr = l.local_addr().unwrap();
        let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 64];
        // Wait for the kernel's deferred switch to receive timestamps.
        let t0 = Instant::now();
        loop {
            let mut c = std::net::TcpStream::connect(addr).unwrap();
            c.write_all(b"x").unwrap();
            std::thread::sleep(Duration::from_millis(2));
            let (s, _) = l.accept().unwrap();
            if recv_stamped(s.as_raw_fd(), &mut buf).unwrap().1.is_some() {
                break;
            }
            assert!(t0.elapsed() < Duration::from_secs(10), "no timestamps came");
        }
        let mut c = std::net::TcpStream::connect(addr).unwrap();
        c.write_all(b"GET / HTTP/1.1\r\n").unwrap();
        std::thread::sleep(Duration::from_millis(60));
        let (s, _) = l.accept().unwrap();
        let (n, at) = recv_stamped(s.as_raw_fd(), &mut buf).unwrap();
        assert_eq!(n, 16);
        let waited = at.expect("a receive timestamp before accept").elapsed();
        assert!(
            waited >= Duration::from_millis(55) && waited < Duration::from_secs(5),
            "{waited:?}"
        );
    }
}
