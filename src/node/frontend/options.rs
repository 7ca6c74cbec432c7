//! The frontend's settings ([`FrontendOpts`]).

use std::time::Duration;

/// Frontend settings.
#[derive(Debug, Clone)]
pub struct FrontendOpts {
    pub scheduler: String,
    /// Where clients connect and backends push results.
    pub listen: String,
    /// Where the region is served (TCP: host:port).
    pub data_listen: String,
    /// The host peers dial for both (None: the bound address; for a
    /// wildcard bind, `$POD_IP` or the host name's address; see
    /// [`crate::node::advertise`]).
    pub advertise: Option<String>,
    pub region_bytes: u64,
    pub name: String,
    /// A task with no answer by its deadline plus this ends as Failed.
    pub grace: Duration,
    pub scheduler_timeout: Duration,
    /// Serve the KServe v2 HTTP API (and `/metrics`) too.
    pub http: Option<crate::node::http::HttpOpts>,
    /// Serve the KServe v2 gRPC API too.
    pub grpc: Option<crate::node::grpc::GrpcOpts>,
    /// The applications (ensembles of the model repository) served over the
    /// scheduler's models, by the HTTP and gRPC APIs.
    pub apps: Vec<crate::triton_ensemble::EnsembleConfig>,
    /// Re-plan the applications on their measured fan-out (None: their
    /// budgets stay those of their configuration).
    pub replan: Option<super::ReplanOpts>,
}

impl FrontendOpts {
    pub fn new(scheduler: &str) -> FrontendOpts {
        FrontendOpts {
            scheduler: scheduler.to_string(),
            listen: "127.0.0.1:0".into(),
            data_listen: "127.0.0.1:0".into(),
            advertise: None,
            region_bytes: 1 << 30,
            name: "frontend".into(),
            grace: Duration::from_millis(3000),
            scheduler_timeout: Duration::from_millis(2000),
            http: None,
            grpc: None,
            apps: Vec::new(),
            replan: None,
        }
    }
}
