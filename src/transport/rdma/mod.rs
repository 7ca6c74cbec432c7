//! RDMA transport (ibverbs), built with the `rdma` cargo feature.
//!
//! **Status: compiles and lints everywhere; never run against an RDMA device.** The
//! machines this was written on have no RDMA NIC and no RDMA kernel support, so the
//! only behaviour exercised by tests is [`Rdma::open`] failing with a clear message
//! when no device is listed. Everything past device opening (queue pairs, SEND/RECV,
//! RDMA READ) follows the verbs API and rdma-core's examples but is **untested**;
//! expect to debug it on the first machine with a NIC (SoftRoCE, `rdma link add rxe0
//! type rxe netdev eth0`, is the cheapest way to get one).
//!
//! # Design (Symphony §4.3: backends pull inputs with RDMA READ)
//!
//! * **Devices.** [`Rdma::open`] lists devices with the `ibverbs` crate; none (or a
//!   failed listing: no `/sys/class/infiniband`, no kernel support) is an error that
//!   says so and points at `--transport tcp`. The device is the one named, else
//!   `$FERMATA_RDMA_DEVICE`, else the first listed; port 1 is used and must be
//!   ACTIVE.
//! * **Why raw `ibverbs-sys` calls.** The safe `ibverbs` 0.9 API cannot do what the
//!   data path needs: `ProtectionDomain::allocate` registers only memory it allocates
//!   itself (a `Vec<T>` it owns; there is no way to register caller-owned memory such
//!   as a [`Region`]), `QueuePair::post_send` only posts `IBV_WR_SEND` (no RDMA READ,
//!   no remote address or rkey), and the raw `ibv_pd` / `ibv_qp` / `lkey` behind its
//!   types are private, so its objects cannot be mixed with raw calls either. The
//!   least bad option is a small RAII layer (`verbs.rs`, the only file of this module
//!   with FFI) over the same `ibverbs-sys`
//!   bindings the crate wraps (same library, same version, no second copy of
//!   rdma-core): devices are listed through `ibverbs::devices()`, everything else
//!   (context, PD, CQ, QP state changes, memory registration, posting and polling)
//!   goes through `ibverbs_sys` exactly as the `ibverbs` crate does internally
//!   (`post_send`, `post_recv` and `poll_cq` through the context's `ops` table,
//!   since they are inline functions in `verbs.h`).
//! * **Connection set-up.** Every queue pair is RC and is connected over a plain TCP
//!   socket (std::net) at the listen / region address: each side sends its endpoint
//!   (QP number, LID, GID, PSN, MTU, RDMA-read depth), moves its QP through
//!   INIT -> RTR -> RTS, posts its receives and then sends one "ready" byte; nothing
//!   is sent on the QP before the peer's ready byte arrived. The TCP socket stays
//!   open as a liveness signal (an RC QP only notices a dead peer when a send
//!   exhausts its retries): when it breaks, the connection is closed.
//! * **Control messages** are SENDs into pre-posted receive buffers of
//!   [`CTRL_BUF`] bytes ([`CTRL_RECVS`] per connection). A connection carries a byte
//!   stream of whole [`crate::wire`] frames (`encode`: length prefix + body), cut
//!   into chunks of at most [`CTRL_BUF`] bytes, so **messages larger than a receive
//!   buffer are split** and reassembled by a [`FrameReader`] (RC delivers SENDs in
//!   order and exactly once). [`Conn::send`] never waits: it encodes into a software
//!   backlog that is copied into [`CTRL_SENDS`] registered send slots as they free
//!   up; a backlog over [`BACKLOG_MAX`] bytes answers [`SendError::Full`]. A close
//!   is a SEND with immediate data [`IMM_CLOSE`] (its payload the reason), queued
//!   behind the messages sent before it. Receiver-not-ready is retried forever by
//!   the NIC (`rnr_retry` 7), so a slow reader slows its senders instead of breaking
//!   the connection.
//! * **One completion-polling thread per transport** polls the control CQ shared by
//!   all its connections, reassembles frames, reposts receives, frees send slots and
//!   delivers [`Event`]s. It busy-polls for a while after each completion and then
//!   sleeps [`IDLE_SLEEP`] between polls (completion channels would avoid the sleep;
//!   not worth the extra FFI before this has run once).
//! * **Regions.** [`Transport::serve_region`] registers the frontend's [`Region`]
//!   memory ONCE (`Region::raw()`, `IBV_ACCESS_REMOTE_READ`) and publishes its rkey
//!   and base address in [`RegionInfo`]. Backends connect one RC QP each to the
//!   region server's TCP address; the server only accepts and connects QPs, its
//!   application threads never see a read.
//! * **Reads.** [`RegionReader::read_many`] posts RDMA READs (signalled, many in
//!   flight, at most [`READ_WAVE`] at once and at most [`STAGING`] bytes) into one
//!   registered staging buffer, polls the reader's CQ until all complete or the
//!   timeout passes, and copies the slots out. A peer with a read still outstanding
//!   at the timeout has its QP destroyed (after which the NIC writes nothing more
//!   into the staging buffer for it) and is reconnected on its next read; a READ
//!   that fails (the frontend is gone, or its region server was dropped) also
//!   drops that peer's QP. Reads of one reader are serialised (one staging buffer);
//!   a reconnect inside `read_many` may take up to the 10 s handshake limit when
//!   the frontend's host does not answer at all.
//!
//! # Files
//! * `options`: sizes and timeouts;
//! * `verbs`: the safe wrappers over ibverbs (all the FFI, and all of this module's
//!   `SAFETY` comments);
//! * `side_channel`: the TCP channel queue pairs are set up over;
//! * `control`: the control plane's state, connection set-up, the listener;
//! * `conn`: one control connection (slots, backlog, completions);
//! * `poller`: the completion-polling thread;
//! * `region_server`: serving a region for RDMA READ;
//! * `reader`: the pull side (`read_many` in waves of READs).
//!
//! [`FrameReader`]: crate::wire::FrameReader
//! [`SendError::Full`]: super::SendError::Full
//! [`Event`]: super::Event
//! [`RegionInfo`]: crate::wire::RegionInfo

mod conn;
mod control;
mod options;
mod poller;
mod reader;
mod region_server;
mod side_channel;
mod verbs;

pub use options::{
    BACKLOG_MAX, CTRL_BUF, CTRL_RECVS, CTRL_SENDS, IDLE_SLEEP, IMM_CLOSE, READ_WAVE, STAGING,
};

use super::{Conn, EventTx, Listener, Region, RegionReader, RegionServer, Transport};
use control::Shared;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// The error when no RDMA device is there.
fn no_device(detail: &str) -> anyhow::Error {
    anyhow::anyhow!(
        "no RDMA device found ({detail}): the rdma transport needs an RDMA NIC (InfiniBand or RoCE) \
         and its kernel driver; use --transport tcp instead"
    )
}

/// The RDMA transport. See the module documentation.
pub struct Rdma {
    shared: Arc<Shared>,
    /// The cluster secret every side channel proves (None: no handshake).
    key: Option<crate::transport::auth::ClusterKey>,
    poller: Mutex<Option<JoinHandle<()>>>,
}

/// The device to open: `device`, else `$FERMATA_RDMA_DEVICE`, else the first
/// listed; an error that says so when there is none.
fn pick_device(device: Option<&str>) -> anyhow::Result<String> {
    let names = verbs::device_names().map_err(|e| {
        if e.raw_os_error() == Some(libc::ENOSYS) {
            // What libibverbs says when /sys/class/infiniband is missing.
            no_device(&format!("the kernel has no RDMA support: {e}"))
        } else {
            no_device(&format!("listing RDMA devices failed: {e}"))
        }
    })?;
    if names.is_empty() {
        return Err(no_device("ibverbs lists none"));
    }
    let env = std::env::var("FERMATA_RDMA_DEVICE")
        .ok()
        .filter(|s| !s.is_empty());
    Ok(match device.map(str::to_string).or(env) {
        Some(want) if names.contains(&want) => want,
        Some(want) => anyhow::bail!(
            "RDMA device `{want}` not found; this machine has: {}",
            names.join(", ")
        ),
        None => names[0].clone(),
    })
}

impl Rdma {
    /// Opens RDMA device `device` (else `$FERMATA_RDMA_DEVICE`, else the first one).
    /// Fails with a clear message when the machine has none.
    pub fn open(device: Option<&str>) -> anyhow::Result<Rdma> {
        Self::open_keyed(device, None)
    }

    /// [`Rdma::open`] whose side channels open with the cluster handshake over
    /// `key` ([`crate::transport::auth`]).
    pub fn open_keyed(
        device: Option<&str>,
        key: Option<crate::transport::auth::ClusterKey>,
    ) -> anyhow::Result<Rdma> {
        let name = pick_device(device)?;
        let dev = Arc::new(
            verbs::Device::open(&name)
                .map_err(|e| anyhow::anyhow!("cannot open RDMA device `{name}`: {e}"))?,
        );
        let shared = Arc::new(Shared::new(dev)?);
        let s = shared.clone();
        let poller = std::thread::Builder::new()
            .name("rdma-poll".into())
            .spawn(move || poller::poll_loop(&s))?;
        Ok(Rdma {
            shared,
            key,
            poller: Mutex::new(Some(poller)),
        })
    }

    /// The device in use.
    pub fn device_name(&self) -> &str {
        &self.shared.pd.dev.name
    }
}

impl Drop for Rdma {
    fn drop(&mut self) {
        self.shared
            .stop
            .store(true, std::sync::atomic::Ordering::Release);
        if let Some(h) = self.poller.lock().expect("lock").take() {
            let _ = h.join();
        }
        // Break the reference cycle conns -> (nothing) and let QPs go.
        let conns: Vec<_> = self.shared.conns.lock().expect("lock").drain().collect();
        for (_, c) in conns {
            c.fail("the rdma transport was dropped");
        }
    }
}

impl Transport for Rdma {
    fn name(&self) -> &'static str {
        "rdma"
    }

    fn listen(&self, addr: &str, events: EventTx) -> anyhow::Result<Box<dyn Listener>> {
        control::listen(&self.shared, addr, events, self.key.clone())
    }

    fn connect(&self, addr: &str, events: EventTx) -> anyhow::Result<Arc<dyn Conn>> {
        let tcp = side_channel::tcp_connect(
            addr,
            crate::transport::auth::Service::RdmaControl,
            self.key.as_ref(),
        )?;
        let conn = control::establish(&self.shared, tcp, addr.to_string(), events, false)?;
        Ok(conn)
    }

    fn serve_region(
        &self,
        region: Arc<Region>,
        addr: &str,
    ) -> anyhow::Result<Box<dyn RegionServer>> {
        region_server::serve(&self.shared.pd, region, addr, self.key.clone())
    }

    fn reader(&self) -> anyhow::Result<Arc<dyn RegionReader>> {
        Ok(Arc::new(reader::RdmaReader::new(
            self.shared.pd.clone(),
            self.key.clone(),
        )?))
    }
}
