//! The HTTP server's settings ([`HttpOpts`]).

use crate::metrics::Registry;
use std::sync::Arc;

/// HTTP settings of a frontend.
#[derive(Clone)]
pub struct HttpOpts {
    /// host:port to listen on (port 0: any free port).
    pub listen: String,
    /// Worker threads of the HTTP runtime.
    pub threads: usize,
    /// Largest request body (bytes); larger ones get 413.
    pub max_body_bytes: usize,
    /// Largest input tensor a request may declare (bytes); larger ones get 413.
    pub max_tensor_bytes: usize,
    /// More registries rendered on `/metrics` with the frontend's own (the other
    /// nodes of `fermata serve`).
    pub extra_metrics: Vec<Arc<Registry>>,
}

impl std::fmt::Debug for HttpOpts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpOpts")
            .field("listen", &self.listen)
            .field("threads", &self.threads)
            .field("max_body_bytes", &self.max_body_bytes)
            .field("max_tensor_bytes", &self.max_tensor_bytes)
            .field("extra_metrics", &self.extra_metrics.len())
            .finish()
    }
}

impl HttpOpts {
    pub fn new(listen: &str) -> HttpOpts {
        HttpOpts {
            listen: listen.to_string(),
            threads: 1,
            max_body_bytes: 64 << 20,
            max_tensor_bytes: crate::workload::MAX_INPUT_BYTES as usize,
            extra_metrics: Vec::new(),
        }
    }
}
