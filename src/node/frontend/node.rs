//! [`FrontendNode`], a running frontend: start-up (the input region and its
//! server, the client listener, the scheduler's connection and registration, the
//! shared state and metrics, the event loop's thread, the HTTP API when asked
//! for) and stop.

use super::event_loop::{Links, Loop};
use super::handle::{FrontendHandle, FrontendState, LOCAL_MAX};
use super::metrics::LoopMetrics;
use super::options::FrontendOpts;
use super::register::{register, register_msg};
use super::report::FrontendReport;
use crate::metrics::Registry;
use crate::node::advertise;
use crate::node::clock::SchedClock;
use crate::node::grpc::GrpcServer;
use crate::node::http::HttpServer;

/// How long a stopping frontend lets gRPC calls in flight finish.
const GRPC_STOP_GRACE: std::time::Duration = std::time::Duration::from_secs(2);
use crate::runtime::clock::Clock;
use crate::transport::{Region, Transport};
use anyhow::{Context, Result};
use crossbeam_channel::bounded;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

/// A running frontend.
pub struct FrontendNode {
    addr: String,
    data_addr: String,
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<FrontendReport>>,
    /// The thread that re-plans the applications (with `FrontendOpts::replan`).
    replan: Option<JoinHandle<()>>,
    shared: FrontendHandle,
    http: Option<HttpServer>,
    grpc: Option<GrpcServer>,
}

impl FrontendNode {
    /// Starts and registers; returns once the scheduler acknowledged (or fails).
    pub fn start(transport: Arc<dyn Transport>, opts: FrontendOpts) -> Result<FrontendNode> {
        let region = Arc::new(Region::new(1, opts.region_bytes)?);
        let server = transport
            .serve_region(region.clone(), &opts.data_listen)
            .with_context(|| format!("cannot serve the input region at {}", opts.data_listen))?;
        let registry = Registry::new();
        let (tx, rx) = crate::node::event_channel(&registry, "frontend");
        let listener = transport
            .listen(&opts.listen, tx.clone())
            .with_context(|| format!("cannot listen at {}", opts.listen))?;
        let clock = SchedClock::exact(Clock::new());
        // What peers dial: the bound addresses, with the advertised host.
        let adv = opts.advertise.as_deref();
        let addr = advertise::advertised(&listener.local_addr(), adv)?;
        let mut region_info = server.info();
        region_info.addr = advertise::advertised(&region_info.addr, adv)?;
        let data_addr = region_info.addr.clone();
        let reg_msg = register_msg(&opts, addr.clone(), region_info);
        let mut reg = register(&*transport, tx.clone(), &rx, &clock, &opts, reg_msg)?;
        let (ltx, lrx) = bounded(LOCAL_MAX);
        let apps = crate::node::apps::serve_apps(&opts.apps, &reg.models)?;
        let state = Arc::new(FrontendState::new(
            reg.models.clone(),
            apps,
            reg.gpus,
            registry.clone(),
            ltx,
        ));
        let shared = FrontendHandle {
            state: state.clone(),
        };
        let metrics = LoopMetrics::new(&registry, &reg.models, &state);
        // Weakly: the registry may outlive the frontend (a scrape in flight),
        // the region must not.
        let stored = Arc::downgrade(&region);
        registry.collector(
            "fermata_frontend_input_bytes_stored_total",
            "Input bytes the frontend copied into its region (each request's input, once, into its slot): the first copy of an input on its way to the executor.",
            crate::metrics::Kind::Counter,
            move || {
                stored
                    .upgrade()
                    .map_or_else(Vec::new, |r| vec![(vec![], r.bytes_stored() as f64)])
            },
        );
        let stop = Arc::new(AtomicBool::new(false));
        if let Some(r) = &opts.replan {
            r.check()?;
        }
        let apps = state.apps.clone();
        let early = std::mem::take(&mut reg.early);
        let links = Links {
            transport,
            events: tx,
            clock,
            region,
            server,
            listener,
        };
        let lp = Loop::new(state, reg, metrics, links, &opts);
        let handle = lp.spawn(early, rx, lrx, stop.clone())?;
        let replan = match &opts.replan {
            Some(r) => super::replan::spawn(&apps, r, stop.clone()).inspect_err(|_| {
                stop.store(true, Ordering::Release);
            })?,
            None => None,
        };
        let mut node = FrontendNode {
            addr,
            data_addr,
            stop,
            handle: Some(handle),
            replan,
            shared,
            http: None,
            grpc: None,
        };
        // One buffered-bytes budget for HTTP bodies and gRPC messages.
        let limit = opts
            .http
            .as_ref()
            .map(|h| h.max_buffered_bytes)
            .or(opts.grpc.as_ref().map(|g| g.max_buffered_bytes));
        let bodies =
            limit.map(|l| crate::node::http::BodyBudget::with_metrics(l, &node.shared.metrics()));
        if let Some(h) = &opts.http {
            let mut h = h.clone();
            h.bodies = h.bodies.or(bodies.clone());
            node.http = Some(HttpServer::start_frontend(node.shared.clone(), &h)?);
        }
        if let Some(g) = &opts.grpc {
            let mut g = g.clone();
            g.bodies = g.bodies.or(bodies);
            node.grpc = Some(GrpcServer::start(node.shared.clone(), &g)?);
        }
        Ok(node)
    }

    /// Where clients connect.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Where backends read the input region (the region server).
    pub fn data_addr(&self) -> &str {
        &self.data_addr
    }

    /// Where the HTTP API listens, when it was asked for.
    pub fn http_addr(&self) -> Option<std::net::SocketAddr> {
        self.http.as_ref().map(|h| h.addr())
    }

    /// Where the gRPC API listens (with `FrontendOpts::grpc`).
    pub fn grpc_addr(&self) -> Option<std::net::SocketAddr> {
        self.grpc.as_ref().map(|g| g.addr())
    }

    /// A handle for in-process clients.
    pub fn handle(&self) -> FrontendHandle {
        self.shared.clone()
    }

    /// The frontend's metrics.
    pub fn metrics(&self) -> Arc<Registry> {
        self.shared.metrics()
    }

    /// Drains the HTTP server (and turns gRPC's readiness off) before a stop (see
    /// [`HttpServer::drain`](crate::node::http::HttpServer::drain)): readiness
    /// 503 for `ready_grace`, then the requests in flight answered (at most
    /// `max_wait`). None without an HTTP server.
    pub fn drain_http(
        &self,
        ready_grace: std::time::Duration,
        max_wait: std::time::Duration,
    ) -> Option<crate::node::http::Drained> {
        // gRPC's readiness says no too; its calls in flight end at its stop.
        self.shared
            .state
            .draining
            .store(true, std::sync::atomic::Ordering::Release);
        self.http.as_ref().map(|h| h.drain(ready_grace, max_wait))
    }

    pub fn stop(mut self) -> FrontendReport {
        // The HTTP and gRPC servers first: their requests in flight end
        // through the loop.
        if let Some(g) = self.grpc.take() {
            g.stop(GRPC_STOP_GRACE);
        }
        if let Some(h) = self.http.take() {
            h.stop();
        }
        self.stop.store(true, Ordering::Release);
        if let Some(r) = self.replan.take() {
            let _ = r.join();
        }
        self.handle
            .take()
            .map(|h| h.join().unwrap_or_default())
            .unwrap_or_default()
    }

    /// Times the frontend lost the scheduler and joined again.
    pub fn rejoins(&self) -> u64 {
        self.shared.state.rejoins.load(Ordering::Relaxed)
    }

    pub fn is_finished(&self) -> bool {
        self.handle.as_ref().is_none_or(|h| h.is_finished())
    }
}

impl Drop for FrontendNode {
    fn drop(&mut self) {
        if let Some(g) = self.grpc.take() {
            g.stop(GRPC_STOP_GRACE);
        }
        if let Some(h) = self.http.take() {
            h.stop();
        }
        self.stop.store(true, Ordering::Release);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}
