//! The HTTP server's settings ([`HttpOpts`]) and their defaults, sized to the
//! machine: worker threads to its cores, the connection cap to its file limit.

use crate::metrics::Registry;
use std::sync::Arc;
use std::time::Duration;

/// HTTP settings of a frontend.
#[derive(Clone)]
pub struct HttpOpts {
    /// host:port to listen on (port 0: any free port).
    pub listen: String,
    /// Worker threads of the HTTP runtime ([`default_threads`]).
    pub threads: usize,
    /// Largest request body (bytes); larger ones get 413.
    pub max_body_bytes: usize,
    /// Most bytes of request bodies buffered at once, all requests together
    /// ([`super::default_buffered_bytes`]); a body beyond gets 503 with
    /// `Retry-After` before a byte of it is read.
    pub max_buffered_bytes: usize,
    /// Largest input tensor a request may declare (bytes); larger ones get 413.
    pub max_tensor_bytes: usize,
    /// Most inference bodies read and not yet decoded at once
    /// ([`DEFAULT_MAX_PENDING`]); a request beyond is refused at the door
    /// (429 with `Retry-After`) before its body is read.
    pub max_pending: usize,
    /// Most connections open at once ([`default_max_connections`]). A new one
    /// beyond closes the connection that has waited longest for its next
    /// request; with none waiting it is answered 503 and closed.
    pub max_connections: usize,
    /// A connection that sends no complete request head within this time is
    /// closed: an idle keep-alive connection (from its last answer) and a
    /// client that sends its head slowly alike.
    pub header_timeout: Duration,
    /// A request whose body has not arrived within this time of its head gets
    /// 408 and its connection is closed.
    pub body_timeout: Duration,
    /// More registries rendered on `/metrics` with the frontend's own (the other
    /// nodes of `fermata serve`).
    pub extra_metrics: Vec<Arc<Registry>>,
    /// The buffered-bytes budget shared with the frontend's gRPC server (None:
    /// the HTTP server makes its own of `max_buffered_bytes`).
    pub bodies: Option<Arc<super::body_budget::BodyBudget>>,
}

impl std::fmt::Debug for HttpOpts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpOpts")
            .field("listen", &self.listen)
            .field("threads", &self.threads)
            .field("max_body_bytes", &self.max_body_bytes)
            .field("max_buffered_bytes", &self.max_buffered_bytes)
            .field("max_tensor_bytes", &self.max_tensor_bytes)
            .field("max_pending", &self.max_pending)
            .field("max_connections", &self.max_connections)
            .field("header_timeout", &self.header_timeout)
            .field("body_timeout", &self.body_timeout)
            .field("extra_metrics", &self.extra_metrics.len())
            .finish()
    }
}

/// Inference bodies read and not yet decoded, at most, by default: about a
/// second of decoding on one core for small JSON bodies; beyond, the server
/// is that far behind and a new request is better refused at once.
pub const DEFAULT_MAX_PENDING: usize = 1024;

/// File descriptors kept for everything but HTTP connections (the listening
/// sockets, the cluster's connections, logs, models).
pub const RESERVED_FDS: u64 = 128;

/// The HTTP workers by default: half the machine's cores (the other half runs
/// the frontend's loop, its transport and, in `fermata serve`, the other
/// roles), at least 2 and at most 16. At least 2 even on a small machine: with
/// one worker, every connection waits while it decodes a request's body, so
/// their reads fall behind together; on 2 cores
/// `fermata bench http` sustained about 6,000 cnn requests/s with 2 workers
/// and 4,000-5,000 with 1.
pub fn default_threads() -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (cores / 2).clamp(2, 16)
}

/// Raises this process's open-file limit (`RLIMIT_NOFILE`) from its soft
/// value to its hard one, as servers commonly do at start (a soft limit of
/// 1,024 is a default meant for interactive programs, not for a server of
/// thousands of connections); returns the soft limit in force. The hard limit
/// stays the operator's: `ulimit -Hn` (or the service manager's
/// `LimitNOFILE`) still bounds it.
pub fn raise_open_file_limit() -> u64 {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit on a local struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) != 0 {
            return 1024;
        }
        if r.rlim_cur < r.rlim_max {
            let want = libc::rlimit {
                rlim_cur: r.rlim_max,
                rlim_max: r.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &want) == 0 {
                r = want;
            }
        }
    }
    r.rlim_cur
}

/// The connection cap by default: the process's open-file limit
/// (`RLIMIT_NOFILE`, soft) less [`RESERVED_FDS`], between 16 and 16,384. Below
/// the limit, a flood of connections is refused by the cap (oldest waiting
/// first), never by the kernel's EMFILE, which would stop accepting anyone.
pub fn default_max_connections() -> usize {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit through a valid pointer.
    let soft = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 {
        lim.rlim_cur
    } else {
        1024
    };
    soft.saturating_sub(RESERVED_FDS).clamp(16, 16_384) as usize
}

impl HttpOpts {
    pub fn new(listen: &str) -> HttpOpts {
        HttpOpts {
            listen: listen.to_string(),
            threads: default_threads(),
            max_body_bytes: 64 << 20,
            max_buffered_bytes: super::default_buffered_bytes(),
            max_tensor_bytes: crate::workload::MAX_INPUT_BYTES as usize,
            max_pending: DEFAULT_MAX_PENDING,
            max_connections: default_max_connections(),
            header_timeout: Duration::from_secs(30),
            body_timeout: Duration::from_secs(30),
            extra_metrics: Vec::new(),
            bodies: None,
        }
    }
}
