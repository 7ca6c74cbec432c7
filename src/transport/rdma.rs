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
//!   least bad option is a small RAII layer (module `verbs`) over the same `ibverbs-sys`
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

use super::*;
use crate::wire::FrameReader;
use std::collections::{HashMap, VecDeque};
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, Weak};
use std::thread::JoinHandle;
use std::time::Instant;

/// Bytes of one control receive (and send) buffer.
pub const CTRL_BUF: usize = 32 << 10;
/// Receive buffers posted per control connection.
pub const CTRL_RECVS: usize = 64;
/// Send slots per control connection.
pub const CTRL_SENDS: usize = 64;
/// Largest unsent backlog of one connection before `send` answers `Full`.
pub const BACKLOG_MAX: usize = 2 * crate::wire::MAX_FRAME;
/// Immediate data of the SEND that closes a connection.
pub const IMM_CLOSE: u32 = 0xC105_E000;
/// Bytes of the reader's registered staging buffer (>= the largest slot).
pub const STAGING: usize = 32 << 20;
/// Most RDMA READs one `read_many` keeps in flight.
pub const READ_WAVE: usize = 256;
/// Sleep of the completion-polling thread when idle.
pub const IDLE_SLEEP: Duration = Duration::from_micros(50);
/// Empty polls before the polling thread starts sleeping.
const SPIN_POLLS: u32 = 2000;
/// Limit on TCP connect and the endpoint exchange.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The error when no RDMA device is there.
fn no_device(detail: &str) -> anyhow::Error {
    anyhow::anyhow!(
        "no RDMA device found ({detail}): the rdma transport needs an RDMA NIC (InfiniBand or RoCE) \
         and its kernel driver; use --transport tcp instead"
    )
}

// =====================================================================================
// verbs: RAII over the raw ibverbs-sys calls
// =====================================================================================

/// A thin, owning layer over `ibverbs_sys`. Every object keeps what it was created
/// from alive (QP -> CQ, PD -> device), so drop order is always legal.
///
/// Safety: libibverbs objects may be used from any thread (the library is thread
/// safe, see rdmamojo "libibverbs thread safe level"), hence the `Send`/`Sync` impls.
mod verbs {
    use ibverbs_sys as ffi;
    use std::ffi::CStr;
    use std::io;
    use std::ptr;
    use std::sync::Arc;

    /// Port used on every device (like the `ibverbs` crate).
    pub const PORT: u8 = 1;

    fn errno_err(what: &str, errno: i32) -> io::Error {
        let e = io::Error::from_raw_os_error(errno);
        io::Error::new(e.kind(), format!("{what}: {e}"))
    }

    fn last_err(what: &str) -> io::Error {
        let e = io::Error::last_os_error();
        io::Error::new(e.kind(), format!("{what}: {e}"))
    }

    /// An opened device context with what QPs need to know about port 1.
    pub struct Device {
        ctx: *mut ffi::ibv_context,
        pub name: String,
        pub lid: u16,
        /// Our GID and its table index, when the link needs global routing (RoCE).
        pub gid: Option<([u8; 16], u8)>,
        /// The port's active MTU (an `IBV_MTU_*` value).
        pub mtu: u8,
        /// The most RDMA READs one QP may have outstanding (as requester / responder).
        pub max_rd_atom: u8,
        pub max_qp_wr: u32,
        /// Largest completion queue.
        pub max_cqe: i32,
    }
    unsafe impl Send for Device {}
    unsafe impl Sync for Device {}

    impl Device {
        /// Opens the device named `name` (as `ibv_get_device_name` gives it).
        pub fn open(name: &str) -> io::Result<Device> {
            let mut n = 0i32;
            // SAFETY: the list is freed below; devices stay valid while a context on
            // them is open (ibv_free_device_list's contract).
            let list = unsafe { ffi::ibv_get_device_list(&mut n) };
            if list.is_null() {
                return Err(last_err("ibv_get_device_list"));
            }
            let mut ctx = ptr::null_mut();
            for i in 0..n.max(0) as usize {
                let dev = unsafe { *list.add(i) };
                let dn = unsafe { ffi::ibv_get_device_name(dev) };
                if !dn.is_null() && unsafe { CStr::from_ptr(dn) }.to_string_lossy() == name {
                    ctx = unsafe { ffi::ibv_open_device(dev) };
                    break;
                }
            }
            unsafe { ffi::ibv_free_device_list(list) };
            if ctx.is_null() {
                return Err(io::Error::other(format!(
                    "ibv_open_device({name}) failed or the device vanished"
                )));
            }
            // From here `d` owns the context (closed on drop if we bail out).
            let mut d = Device {
                ctx,
                name: name.to_string(),
                lid: 0,
                gid: None,
                mtu: 0,
                max_rd_atom: 1,
                max_qp_wr: 0,
                max_cqe: 0,
            };
            let mut pa = ffi::ibv_port_attr::default();
            // SAFETY: same call as the ibverbs crate (ibv_port_attr starts with the
            // compat layout the exported symbol fills).
            let rc = unsafe { ffi::ibv_query_port(ctx, PORT, &mut pa as *mut _ as *mut _) };
            if rc != 0 {
                return Err(errno_err("ibv_query_port", rc));
            }
            if pa.state != ffi::ibv_port_state::IBV_PORT_ACTIVE {
                return Err(io::Error::other(format!(
                    "port {PORT} of {name} is not ACTIVE (state {}); is the link up?",
                    pa.state
                )));
            }
            d.lid = pa.lid;
            d.mtu = pa.active_mtu as u8;
            if u32::from(pa.link_layer) == ffi::IBV_LINK_LAYER_ETHERNET {
                d.gid = Some(pick_gid(ctx, pa.gid_tbl_len)?);
            }
            let mut da = ffi::ibv_device_attr::default();
            let rc = unsafe { ffi::ibv_query_device(ctx, &mut da) };
            if rc != 0 {
                return Err(errno_err("ibv_query_device", rc));
            }
            d.max_rd_atom = da.max_qp_rd_atom.clamp(1, 16) as u8;
            d.max_qp_wr = da.max_qp_wr.max(1) as u32;
            d.max_cqe = da.max_cqe.max(1);
            Ok(d)
        }
    }

    impl Drop for Device {
        fn drop(&mut self) {
            unsafe { ffi::ibv_close_device(self.ctx) };
        }
    }

    /// RoCE needs a GID: `$FERMATA_RDMA_GID_INDEX` if set, else the first RoCE v2
    /// entry holding an IPv4-mapped address, else the first RoCE v2 entry, else 0.
    fn pick_gid(ctx: *mut ffi::ibv_context, len: i32) -> io::Result<([u8; 16], u8)> {
        let mut table = vec![ffi::ibv_gid_entry::default(); len.max(0) as usize];
        let n = unsafe {
            ffi::_ibv_query_gid_table(
                ctx,
                table.as_mut_ptr(),
                table.len(),
                0,
                std::mem::size_of::<ffi::ibv_gid_entry>(),
            )
        };
        if n < 0 {
            return Err(errno_err("ibv_query_gid_table", (-n) as i32));
        }
        table.truncate(n as usize);
        let raw = |e: &ffi::ibv_gid_entry| unsafe { e.gid.raw };
        let pick = if let Some(i) = std::env::var("FERMATA_RDMA_GID_INDEX")
            .ok()
            .and_then(|v| v.parse::<u32>().ok())
        {
            table.iter().find(|e| e.gid_index == i)
        } else {
            let v2 = |e: &&ffi::ibv_gid_entry| e.gid_type == ffi::IBV_GID_TYPE_ROCE_V2;
            let v4 = |e: &&ffi::ibv_gid_entry| {
                raw(e)[..12] == [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff]
            };
            table
                .iter()
                .find(|e| v2(e) && v4(e))
                .or_else(|| table.iter().find(v2))
                .or_else(|| table.first())
        };
        let e = pick.ok_or_else(|| io::Error::other("the port's GID table is empty"))?;
        Ok((raw(e), e.gid_index as u8))
    }

    /// A protection domain.
    pub struct Pd {
        pd: *mut ffi::ibv_pd,
        pub dev: Arc<Device>,
    }
    unsafe impl Send for Pd {}
    unsafe impl Sync for Pd {}

    impl Pd {
        pub fn new(dev: Arc<Device>) -> io::Result<Arc<Pd>> {
            let pd = unsafe { ffi::ibv_alloc_pd(dev.ctx) };
            if pd.is_null() {
                return Err(last_err("ibv_alloc_pd"));
            }
            Ok(Arc::new(Pd { pd, dev }))
        }
    }

    impl Drop for Pd {
        fn drop(&mut self) {
            unsafe { ffi::ibv_dealloc_pd(self.pd) };
        }
    }

    /// A completion queue.
    pub struct Cq {
        cq: *mut ffi::ibv_cq,
        _dev: Arc<Device>,
    }
    unsafe impl Send for Cq {}
    unsafe impl Sync for Cq {}

    /// One work completion (ibverbs-sys' `ibv_wc`, with accessors).
    pub type Wc = ffi::ibv_wc;

    /// A zeroed completion array for [`Cq::poll`].
    pub fn wc_array<const N: usize>() -> [Wc; N] {
        // SAFETY: ibv_wc is plain old data; all zeroes is a valid value.
        unsafe { std::mem::zeroed() }
    }

    impl Cq {
        pub fn new(dev: Arc<Device>, entries: i32) -> io::Result<Arc<Cq>> {
            let cq = unsafe {
                ffi::ibv_create_cq(dev.ctx, entries, ptr::null_mut(), ptr::null_mut(), 0)
            };
            if cq.is_null() {
                return Err(last_err("ibv_create_cq"));
            }
            Ok(Arc::new(Cq { cq, _dev: dev }))
        }

        /// Pops up to `out.len()` completions; how many.
        pub fn poll(&self, out: &mut [Wc]) -> io::Result<usize> {
            // SAFETY: ibv_poll_cq is inline in verbs.h; this is its body (as in the
            // ibverbs crate).
            let n = unsafe {
                let ctx = (*self.cq).context;
                let poll = (*ctx).ops.poll_cq.expect("provider without poll_cq");
                poll(self.cq, out.len() as i32, out.as_mut_ptr())
            };
            if n < 0 {
                return Err(io::Error::other("ibv_poll_cq failed"));
            }
            Ok(n as usize)
        }
    }

    impl Drop for Cq {
        fn drop(&mut self) {
            unsafe { ffi::ibv_destroy_cq(self.cq) };
        }
    }

    /// A registered memory region: either memory this struct owns (`Mr::alloc`) or
    /// memory of someone else that must outlive it (`Mr::register`).
    pub struct Mr {
        mr: *mut ffi::ibv_mr,
        addr: *mut u8,
        _owned: Option<Box<[u8]>>,
        _pd: Arc<Pd>,
    }
    unsafe impl Send for Mr {}
    unsafe impl Sync for Mr {}

    /// Access for local buffers (receives and READ targets need LOCAL_WRITE).
    pub fn local_access() -> u32 {
        ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0
    }
    /// Access for a region that peers read.
    pub fn remote_read_access() -> u32 {
        ffi::ibv_access_flags::IBV_ACCESS_REMOTE_READ.0
    }

    impl Mr {
        /// Allocates `len` zeroed bytes and registers them for local access.
        pub fn alloc(pd: &Arc<Pd>, len: usize) -> io::Result<Mr> {
            let mut mem = vec![0u8; len].into_boxed_slice();
            let addr = mem.as_mut_ptr();
            // SAFETY: the box moves into the Mr (its heap memory does not move) and is
            // freed only after deregistration (field order in Drop).
            let mut mr = unsafe { Mr::register(pd, addr, len, local_access())? };
            mr._owned = Some(mem);
            Ok(mr)
        }

        /// Registers caller-owned memory.
        ///
        /// # Safety
        /// `addr..addr+len` must stay allocated (and not move) until the Mr is dropped.
        pub unsafe fn register(
            pd: &Arc<Pd>,
            addr: *mut u8,
            len: usize,
            access: u32,
        ) -> io::Result<Mr> {
            let mr = ffi::ibv_reg_mr(pd.pd, addr.cast(), len, access as i32);
            if mr.is_null() {
                return Err(last_err("ibv_reg_mr"));
            }
            Ok(Mr {
                mr,
                addr,
                _owned: None,
                _pd: pd.clone(),
            })
        }

        pub fn addr(&self) -> *mut u8 {
            self.addr
        }
        pub fn lkey(&self) -> u32 {
            unsafe { (*self.mr).lkey }
        }
        pub fn rkey(&self) -> u32 {
            unsafe { (*self.mr).rkey }
        }
    }

    impl Drop for Mr {
        fn drop(&mut self) {
            // Deregister before `_owned` (declared after `mr`) frees the memory.
            unsafe { ffi::ibv_dereg_mr(self.mr) };
        }
    }

    /// What a peer needs to connect its QP to ours.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct Endpoint {
        pub qpn: u32,
        pub psn: u32,
        pub lid: u16,
        pub gid: Option<[u8; 16]>,
        pub mtu: u8,
        /// RDMA READs this side accepts in flight as responder.
        pub rd_atom: u8,
    }

    pub const ENDPOINT_BYTES: usize = 4 + 4 + 2 + 1 + 16 + 1 + 1;

    impl Endpoint {
        pub fn to_bytes(self) -> [u8; ENDPOINT_BYTES] {
            let mut b = [0u8; ENDPOINT_BYTES];
            b[0..4].copy_from_slice(&self.qpn.to_le_bytes());
            b[4..8].copy_from_slice(&self.psn.to_le_bytes());
            b[8..10].copy_from_slice(&self.lid.to_le_bytes());
            b[10] = self.gid.is_some() as u8;
            b[11..27].copy_from_slice(&self.gid.unwrap_or_default());
            b[27] = self.mtu;
            b[28] = self.rd_atom;
            b
        }
        pub fn from_bytes(b: &[u8; ENDPOINT_BYTES]) -> Endpoint {
            let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4"));
            Endpoint {
                qpn: u32_at(0),
                psn: u32_at(4),
                lid: u16::from_le_bytes([b[8], b[9]]),
                gid: (b[10] != 0).then(|| b[11..27].try_into().expect("16")),
                mtu: b[27],
                rd_atom: b[28],
            }
        }
    }

    /// An RC queue pair (send and receive completions both go to `cq`).
    pub struct Qp {
        qp: *mut ffi::ibv_qp,
        psn: u32,
        pd: Arc<Pd>,
        _cq: Arc<Cq>,
    }
    unsafe impl Send for Qp {}
    unsafe impl Sync for Qp {}

    impl Qp {
        pub fn new_rc(pd: &Arc<Pd>, cq: &Arc<Cq>, max_send: u32, max_recv: u32) -> io::Result<Qp> {
            let cap = pd.dev.max_qp_wr;
            let mut attr = ffi::ibv_qp_init_attr {
                qp_context: ptr::null_mut(),
                send_cq: cq.cq,
                recv_cq: cq.cq,
                srq: ptr::null_mut(),
                cap: ffi::ibv_qp_cap {
                    max_send_wr: max_send.min(cap),
                    max_recv_wr: max_recv.min(cap),
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 0,
                },
                qp_type: ffi::ibv_qp_type::IBV_QPT_RC,
                sq_sig_all: 0,
            };
            let qp = unsafe { ffi::ibv_create_qp(pd.pd, &mut attr) };
            if qp.is_null() {
                return Err(last_err("ibv_create_qp"));
            }
            // A pseudo-random 24-bit starting PSN (any value works; random ones keep
            // stale packets of an earlier QP with the same number out).
            let psn = (std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or(0)
                ^ unsafe { (*qp).qp_num })
                & 0xff_ffff;
            Ok(Qp {
                qp,
                psn,
                pd: pd.clone(),
                _cq: cq.clone(),
            })
        }

        pub fn endpoint(&self) -> Endpoint {
            let d = &self.pd.dev;
            Endpoint {
                qpn: unsafe { (*self.qp).qp_num },
                psn: self.psn,
                lid: d.lid,
                gid: d.gid.map(|g| g.0),
                mtu: d.mtu,
                rd_atom: d.max_rd_atom,
            }
        }

        /// INIT -> RTR -> RTS towards `remote`. `access`: what the peer may do to
        /// our memory through this QP (REMOTE_READ on a region server).
        pub fn connect(&self, remote: &Endpoint, access: u32) -> io::Result<()> {
            use ffi::ibv_qp_attr_mask as M;
            let d = &self.pd.dev;
            let mut a = ffi::ibv_qp_attr {
                qp_state: ffi::ibv_qp_state::IBV_QPS_INIT,
                pkey_index: 0,
                port_num: PORT,
                qp_access_flags: access,
                ..Default::default()
            };
            let mask =
                M::IBV_QP_STATE | M::IBV_QP_PKEY_INDEX | M::IBV_QP_PORT | M::IBV_QP_ACCESS_FLAGS;
            self.modify(&mut a, mask, "ibv_modify_qp(INIT)")?;

            let mut a = ffi::ibv_qp_attr {
                qp_state: ffi::ibv_qp_state::IBV_QPS_RTR,
                path_mtu: d.mtu.min(remote.mtu) as _,
                dest_qp_num: remote.qpn,
                rq_psn: remote.psn,
                max_dest_rd_atomic: d.max_rd_atom,
                // 12: 0.64 ms before a sender retries into an empty receive queue.
                min_rnr_timer: 12,
                ah_attr: ffi::ibv_ah_attr {
                    dlid: remote.lid,
                    sl: 0,
                    src_path_bits: 0,
                    port_num: PORT,
                    ..Default::default()
                },
                ..Default::default()
            };
            if let (Some(rg), Some((_, idx))) = (remote.gid, d.gid) {
                a.ah_attr.is_global = 1;
                a.ah_attr.grh.dgid.raw = rg;
                a.ah_attr.grh.sgid_index = idx;
                a.ah_attr.grh.hop_limit = 64;
            }
            let mask = M::IBV_QP_STATE
                | M::IBV_QP_AV
                | M::IBV_QP_PATH_MTU
                | M::IBV_QP_DEST_QPN
                | M::IBV_QP_RQ_PSN
                | M::IBV_QP_MAX_DEST_RD_ATOMIC
                | M::IBV_QP_MIN_RNR_TIMER;
            self.modify(&mut a, mask, "ibv_modify_qp(RTR)")?;

            let mut a = ffi::ibv_qp_attr {
                qp_state: ffi::ibv_qp_state::IBV_QPS_RTS,
                sq_psn: self.psn,
                // 14: 4.096 us * 2^14 = 67 ms per transport retry; 7 retries.
                timeout: 14,
                retry_cnt: 7,
                // 7: retry forever while the receiver has no receive posted.
                rnr_retry: 7,
                max_rd_atomic: d.max_rd_atom.min(remote.rd_atom.max(1)),
                ..Default::default()
            };
            let mask = M::IBV_QP_STATE
                | M::IBV_QP_SQ_PSN
                | M::IBV_QP_TIMEOUT
                | M::IBV_QP_RETRY_CNT
                | M::IBV_QP_RNR_RETRY
                | M::IBV_QP_MAX_QP_RD_ATOMIC;
            self.modify(&mut a, mask, "ibv_modify_qp(RTS)")
        }

        /// Moves the QP to the error state: every outstanding work request
        /// completes (flushed) and nothing more is sent or received.
        pub fn set_error(&self) {
            let mut a = ffi::ibv_qp_attr {
                qp_state: ffi::ibv_qp_state::IBV_QPS_ERR,
                ..Default::default()
            };
            let _ = self.modify(
                &mut a,
                ffi::ibv_qp_attr_mask::IBV_QP_STATE,
                "ibv_modify_qp(ERR)",
            );
        }

        fn modify(
            &self,
            a: &mut ffi::ibv_qp_attr,
            mask: ffi::ibv_qp_attr_mask,
            what: &str,
        ) -> io::Result<()> {
            let rc = unsafe { ffi::ibv_modify_qp(self.qp, a, mask.0 as i32) };
            if rc != 0 {
                return Err(errno_err(what, rc));
            }
            Ok(())
        }

        /// Posts a receive of `len` bytes at `addr` (inside `mr`).
        ///
        /// # Safety
        /// The bytes must stay registered and untouched until the completion.
        pub unsafe fn post_recv(
            &self,
            wr_id: u64,
            mr: &Mr,
            addr: *mut u8,
            len: usize,
        ) -> io::Result<()> {
            let mut sge = ffi::ibv_sge {
                addr: addr as u64,
                length: len as u32,
                lkey: mr.lkey(),
            };
            let mut wr = ffi::ibv_recv_wr {
                wr_id,
                next: ptr::null_mut(),
                sg_list: &mut sge,
                num_sge: 1,
            };
            let mut bad = ptr::null_mut();
            let ctx = (*self.qp).context;
            let post = (*ctx).ops.post_recv.expect("provider without post_recv");
            let rc = post(self.qp, &mut wr, &mut bad);
            if rc != 0 {
                return Err(errno_err("ibv_post_recv", rc));
            }
            Ok(())
        }

        /// Posts a signalled SEND of `len` bytes at `addr` (inside `mr`), with
        /// immediate data when `imm` is given.
        ///
        /// # Safety
        /// The bytes must stay registered and untouched until the completion.
        pub unsafe fn post_send(
            &self,
            wr_id: u64,
            mr: &Mr,
            addr: *mut u8,
            len: usize,
            imm: Option<u32>,
        ) -> io::Result<()> {
            let mut wr = ffi::ibv_send_wr {
                opcode: if imm.is_some() {
                    ffi::ibv_wr_opcode::IBV_WR_SEND_WITH_IMM
                } else {
                    ffi::ibv_wr_opcode::IBV_WR_SEND
                },
                ..Default::default()
            };
            if let Some(imm) = imm {
                // Immediate data travels in network byte order.
                wr.__bindgen_anon_1.imm_data = imm.to_be();
            }
            self.post(wr_id, mr, addr, len, wr, "ibv_post_send(SEND)")
        }

        /// Posts a signalled RDMA READ of `len` bytes at remote address `raddr`
        /// (key `rkey`) into `addr` (inside `mr`).
        ///
        /// # Safety
        /// The local bytes must stay registered and untouched until the completion.
        pub unsafe fn post_read(
            &self,
            wr_id: u64,
            mr: &Mr,
            addr: *mut u8,
            len: usize,
            raddr: u64,
            rkey: u32,
        ) -> io::Result<()> {
            let mut wr = ffi::ibv_send_wr {
                opcode: ffi::ibv_wr_opcode::IBV_WR_RDMA_READ,
                ..Default::default()
            };
            wr.wr.rdma.remote_addr = raddr;
            wr.wr.rdma.rkey = rkey;
            self.post(wr_id, mr, addr, len, wr, "ibv_post_send(RDMA_READ)")
        }

        unsafe fn post(
            &self,
            wr_id: u64,
            mr: &Mr,
            addr: *mut u8,
            len: usize,
            mut wr: ffi::ibv_send_wr,
            what: &str,
        ) -> io::Result<()> {
            let mut sge = ffi::ibv_sge {
                addr: addr as u64,
                length: len as u32,
                lkey: mr.lkey(),
            };
            wr.wr_id = wr_id;
            wr.next = ptr::null_mut();
            wr.sg_list = &mut sge;
            wr.num_sge = 1;
            wr.send_flags = ffi::ibv_send_flags::IBV_SEND_SIGNALED.0;
            let mut bad = ptr::null_mut();
            let ctx = (*self.qp).context;
            let post = (*ctx).ops.post_send.expect("provider without post_send");
            let rc = post(self.qp, &mut wr, &mut bad);
            if rc != 0 {
                return Err(errno_err(what, rc));
            }
            Ok(())
        }
    }

    impl Drop for Qp {
        fn drop(&mut self) {
            unsafe { ffi::ibv_destroy_qp(self.qp) };
        }
    }

    /// Human-readable work completion status.
    pub fn wc_status_str(wc: &Wc) -> String {
        match wc.error() {
            None => "success".into(),
            Some((st, vendor)) => {
                let s = unsafe { ffi::ibv_wc_status_str(st) };
                let s = if s.is_null() {
                    format!("status {st}")
                } else {
                    unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
                };
                format!("{s} (vendor error {vendor:#x})")
            }
        }
    }
}

// =====================================================================================
// TCP side channel: endpoint exchange and liveness
// =====================================================================================

const HELLO_MAGIC: [u8; 4] = *b"FRD1";
const KIND_CTRL: u8 = 1;
const KIND_REGION: u8 = 2;
/// Region description a region server appends to its hello (zeroes elsewhere).
const REGION_BYTES: usize = 4 + 8 + 8 + 4;
const HELLO_BYTES: usize = 4 + 1 + verbs::ENDPOINT_BYTES + REGION_BYTES;

/// What a region server tells a reader in its hello.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct RegionDesc {
    region: u32,
    len: u64,
    base: u64,
    rkey: u32,
}

/// Sends our hello, reads the peer's; checks magic and kind.
fn exchange_hello(
    tcp: &mut TcpStream,
    kind: u8,
    ours: &verbs::Endpoint,
    region: RegionDesc,
) -> anyhow::Result<(verbs::Endpoint, RegionDesc)> {
    let mut b = [0u8; HELLO_BYTES];
    b[0..4].copy_from_slice(&HELLO_MAGIC);
    b[4] = kind;
    let e = 5 + verbs::ENDPOINT_BYTES;
    b[5..e].copy_from_slice(&ours.to_bytes());
    b[e..e + 4].copy_from_slice(&region.region.to_le_bytes());
    b[e + 4..e + 12].copy_from_slice(&region.len.to_le_bytes());
    b[e + 12..e + 20].copy_from_slice(&region.base.to_le_bytes());
    b[e + 20..e + 24].copy_from_slice(&region.rkey.to_le_bytes());
    tcp.write_all(&b)?;
    let mut p = [0u8; HELLO_BYTES];
    tcp.read_exact(&mut p)?;
    if p[0..4] != HELLO_MAGIC {
        anyhow::bail!("the peer is not a fermata rdma endpoint (bad hello)");
    }
    if p[4] != kind {
        anyhow::bail!(
            "the peer expects a {} connection, this is a {} one (control address and region \
             address mixed up?)",
            kind_name(p[4]),
            kind_name(kind)
        );
    }
    let ep = verbs::Endpoint::from_bytes(p[5..e].try_into().expect("endpoint bytes"));
    let u64_at = |i: usize| u64::from_le_bytes(p[i..i + 8].try_into().expect("8"));
    let u32_at = |i: usize| u32::from_le_bytes(p[i..i + 4].try_into().expect("4"));
    let desc = RegionDesc {
        region: u32_at(e),
        len: u64_at(e + 4),
        base: u64_at(e + 12),
        rkey: u32_at(e + 20),
    };
    Ok((ep, desc))
}

fn kind_name(k: u8) -> &'static str {
    match k {
        KIND_CTRL => "control",
        KIND_REGION => "region",
        _ => "unknown",
    }
}

/// Both sides' "my receives are posted" byte.
fn exchange_ready(tcp: &mut TcpStream) -> anyhow::Result<()> {
    tcp.write_all(&[1])?;
    let mut b = [0u8; 1];
    tcp.read_exact(&mut b)?;
    anyhow::ensure!(b[0] == 1, "bad ready byte from the peer");
    Ok(())
}

fn tcp_connect(addr: &str) -> anyhow::Result<TcpStream> {
    let mut last = None;
    for sa in addr
        .to_socket_addrs()
        .map_err(|e| anyhow::anyhow!("bad address `{addr}`: {e}"))?
    {
        match TcpStream::connect_timeout(&sa, HANDSHAKE_TIMEOUT) {
            Ok(s) => return Ok(s),
            Err(e) => last = Some(e),
        }
    }
    match last {
        Some(e) => anyhow::bail!("cannot connect to `{addr}`: {e}"),
        None => anyhow::bail!("address `{addr}` resolves to nothing"),
    }
}

fn handshake_timeouts(tcp: &TcpStream, on: bool) -> std::io::Result<()> {
    let t = on.then_some(HANDSHAKE_TIMEOUT);
    tcp.set_read_timeout(t)?;
    tcp.set_write_timeout(t)?;
    tcp.set_nodelay(true)
}

/// Blocks until the peer closes `tcp` (or it breaks).
fn wait_eof(mut tcp: TcpStream) {
    let mut b = [0u8; 64];
    loop {
        match tcp.read(&mut b) {
            Ok(0) => return,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return,
        }
    }
}

/// Accepts on `listener` until `stop`, running `on_conn` on a thread per connection.
fn accept_loop(
    listener: TcpListener,
    stop: Arc<AtomicBool>,
    on_conn: impl Fn(TcpStream, String) + Send + Sync + 'static,
) -> std::io::Result<JoinHandle<()>> {
    listener.set_nonblocking(true)?;
    let on_conn = Arc::new(on_conn);
    std::thread::Builder::new()
        .name("rdma-accept".into())
        .spawn(move || {
            while !stop.load(Ordering::Acquire) {
                match listener.accept() {
                    Ok((s, peer)) => {
                        if s.set_nonblocking(false).is_err() {
                            continue;
                        }
                        let f = on_conn.clone();
                        let peer = peer.to_string();
                        let _ = std::thread::Builder::new()
                            .name("rdma-conn".into())
                            .spawn(move || f(s, peer));
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        })
}

// =====================================================================================
// The transport
// =====================================================================================

/// State shared by the transport, its connections and its polling thread.
struct Shared {
    pd: Arc<verbs::Pd>,
    /// Completion queue of every control connection.
    ctrl_cq: Arc<verbs::Cq>,
    /// Entries of `ctrl_cq` (each connection can have CTRL_RECVS + CTRL_SENDS).
    ctrl_cq_entries: usize,
    conns: Mutex<HashMap<ConnId, Arc<CtrlConn>>>,
    /// Connections whose TCP side channel ended: closed by the polling thread after
    /// it emptied the CQ, so their last messages are delivered before `Closed`.
    lost: Mutex<Vec<ConnId>>,
    next_id: AtomicU64,
    stop: AtomicBool,
}

/// The RDMA transport. See the module documentation.
pub struct Rdma {
    shared: Arc<Shared>,
    poller: Mutex<Option<JoinHandle<()>>>,
}

impl Rdma {
    /// Opens RDMA device `device` (else `$FERMATA_RDMA_DEVICE`, else the first one).
    /// Fails with a clear message when the machine has none.
    pub fn open(device: Option<&str>) -> anyhow::Result<Rdma> {
        let names: Vec<String> = {
            let list = ibverbs::devices().map_err(|e| {
                if e.raw_os_error() == Some(libc::ENOSYS) {
                    // What libibverbs says when /sys/class/infiniband is missing.
                    no_device(&format!("the kernel has no RDMA support: {e}"))
                } else {
                    no_device(&format!("listing RDMA devices failed: {e}"))
                }
            })?;
            list.iter()
                .filter_map(|d| d.name().map(|n| n.to_string_lossy().into_owned()))
                .collect()
        };
        if names.is_empty() {
            return Err(no_device("ibverbs lists none"));
        }
        let env = std::env::var("FERMATA_RDMA_DEVICE")
            .ok()
            .filter(|s| !s.is_empty());
        let name = match device.map(str::to_string).or(env) {
            Some(want) if names.contains(&want) => want,
            Some(want) => anyhow::bail!(
                "RDMA device `{want}` not found; this machine has: {}",
                names.join(", ")
            ),
            None => names[0].clone(),
        };
        let dev = Arc::new(
            verbs::Device::open(&name)
                .map_err(|e| anyhow::anyhow!("cannot open RDMA device `{name}`: {e}"))?,
        );
        let pd = verbs::Pd::new(dev.clone())?;
        let entries = dev.max_cqe.clamp(1, 1 << 15);
        let ctrl_cq = verbs::Cq::new(dev, entries)?;
        let shared = Arc::new(Shared {
            pd,
            ctrl_cq,
            ctrl_cq_entries: entries as usize,
            conns: Mutex::new(HashMap::new()),
            lost: Mutex::new(Vec::new()),
            next_id: AtomicU64::new(1),
            stop: AtomicBool::new(false),
        });
        let s = shared.clone();
        let poller = std::thread::Builder::new()
            .name("rdma-poll".into())
            .spawn(move || poll_loop(&s))?;
        Ok(Rdma {
            shared,
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
        self.shared.stop.store(true, Ordering::Release);
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

// ---- control connections ----------------------------------------------------------

/// A control connection.
struct CtrlConn {
    id: ConnId,
    peer: String,
    // Field order is drop order: the QP goes before the buffers it points into.
    qp: verbs::Qp,
    recv: verbs::Mr,
    tx: Mutex<SendSide>,
    rx: Mutex<FrameReader>,
    events: EventTx,
    /// `Closed` was delivered (exactly once).
    closed: AtomicBool,
    reason: Mutex<String>,
    /// The TCP side channel (shut down when the connection ends).
    tcp: TcpStream,
}

struct SendSide {
    mr: verbs::Mr,
    free: Vec<usize>,
    backlog: VecDeque<Out>,
    backlog_bytes: usize,
    /// A close marker was queued: shut the TCP channel once everything is sent.
    closing: bool,
}

enum Out {
    /// Encoded frames; `.1` bytes of it already posted.
    Bytes(Vec<u8>, usize),
    /// The close marker with its reason.
    Close(String),
}

const WR_RECV: u64 = 1 << 15;
// Slots must fit below the kind bit; the staging buffer must hold the largest slot.
const _: () = assert!(CTRL_RECVS < WR_RECV as usize);
const _: () = assert!(CTRL_SENDS < WR_RECV as usize);
const _: () = assert!(STAGING >= crate::transport::region::MAX_SLOT);

fn wr_id(conn: ConnId, recv: bool, slot: usize) -> u64 {
    (conn << 16) | if recv { WR_RECV } else { 0 } | slot as u64
}

impl CtrlConn {
    /// Copies as much of the backlog as there are free send slots and posts it.
    fn pump(&self, tx: &mut SendSide) -> std::io::Result<()> {
        while let Some(front) = tx.backlog.front_mut() {
            let Some(slot) = tx.free.pop() else {
                break;
            };
            // SAFETY: slot < CTRL_SENDS, so the slot lies inside the send buffer; a
            // free slot has no send outstanding.
            let dst = unsafe { tx.mr.addr().add(slot * CTRL_BUF) };
            let (n, imm, done) = match front {
                Out::Bytes(v, off) => {
                    let n = (v.len() - *off).min(CTRL_BUF);
                    unsafe { std::ptr::copy_nonoverlapping(v.as_ptr().add(*off), dst, n) };
                    *off += n;
                    (n, None, *off == v.len())
                }
                Out::Close(reason) => {
                    let r = reason.as_bytes();
                    let n = r.len().min(CTRL_BUF);
                    unsafe { std::ptr::copy_nonoverlapping(r.as_ptr(), dst, n) };
                    (n, Some(IMM_CLOSE), true)
                }
            };
            let posted = unsafe {
                self.qp
                    .post_send(wr_id(self.id, false, slot), &tx.mr, dst, n, imm)
            };
            if let Err(e) = posted {
                tx.free.push(slot);
                return Err(e);
            }
            if done {
                if let Some(Out::Bytes(v, _)) = tx.backlog.pop_front() {
                    tx.backlog_bytes -= v.len();
                }
            }
        }
        Ok(())
    }

    /// Posts receive buffer `slot` (again).
    fn post_recv(&self, slot: usize) -> std::io::Result<()> {
        // SAFETY: slot < CTRL_RECVS; the buffer is not in use until its completion.
        unsafe {
            let p = self.recv.addr().add(slot * CTRL_BUF);
            self.qp
                .post_recv(wr_id(self.id, true, slot), &self.recv, p, CTRL_BUF)
        }
    }

    fn emit_closed(&self, reason: String) -> bool {
        if self.closed.swap(true, Ordering::AcqRel) {
            return false;
        }
        *self.reason.lock().expect("lock") = reason.clone();
        let _ = self.events.send_detached(Event::Closed(self.id, reason));
        true
    }

    /// Ends the connection without telling the peer in band (it sees the TCP side
    /// channel close): errors, a lost peer, teardown.
    fn fail(&self, reason: &str) {
        self.emit_closed(reason.to_string());
        self.qp.set_error();
        let _ = self.tcp.shutdown(Shutdown::Both);
    }

    /// One completion of this connection (called by the polling thread).
    fn on_completion(&self, wc: &verbs::Wc) {
        let recv = wc.wr_id() & WR_RECV != 0;
        let slot = (wc.wr_id() & (WR_RECV - 1)) as usize;
        if let Some((status, _)) = wc.error() {
            if status != ibverbs_sys::ibv_wc_status::IBV_WC_WR_FLUSH_ERR {
                let what = if recv { "receive" } else { "send" };
                self.fail(&format!("rdma {what} failed: {}", verbs::wc_status_str(wc)));
            }
            return;
        }
        if !recv {
            let mut tx = self.tx.lock().expect("lock");
            tx.free.push(slot);
            if let Err(e) = self.pump(&mut tx) {
                drop(tx);
                self.fail(&format!("rdma send failed: {e}"));
                return;
            }
            if tx.closing && tx.backlog.is_empty() && tx.free.len() == CTRL_SENDS {
                // Our close marker went out: the peer has it; end the side channel.
                let _ = self.tcp.shutdown(Shutdown::Both);
            }
            return;
        }
        let n = wc.len().min(CTRL_BUF);
        // SAFETY: the NIC wrote `n` bytes into this slot and is done with it until
        // the slot is posted again below.
        let data = unsafe { std::slice::from_raw_parts(self.recv.addr().add(slot * CTRL_BUF), n) };
        if wc.imm_data().map(u32::from_be) == Some(IMM_CLOSE) {
            let reason = String::from_utf8_lossy(data).into_owned();
            self.emit_closed(format!("peer closed: {reason}"));
            let _ = self.tcp.shutdown(Shutdown::Both);
            return;
        }
        let mut rx = self.rx.lock().expect("lock");
        rx.feed(data);
        if let Err(e) = self.post_recv(slot) {
            drop(rx);
            self.fail(&format!("rdma receive could not be reposted: {e}"));
            return;
        }
        while let Some(m) = rx.next_msg() {
            match m {
                Ok(m) => {
                    if self.closed.load(Ordering::Acquire) {
                        break;
                    }
                    let _ = self.events.send(Event::Msg(self.id, m));
                }
                Err(e) => {
                    drop(rx);
                    self.close(&format!("undecodable frame from the peer: {e}"));
                    return;
                }
            }
        }
    }
}

impl Conn for CtrlConn {
    fn id(&self) -> ConnId {
        self.id
    }
    fn peer(&self) -> String {
        self.peer.clone()
    }
    fn send(&self, msg: Msg) -> Result<(), SendError> {
        if self.closed.load(Ordering::Acquire) {
            return Err(SendError::Closed(self.reason.lock().expect("lock").clone()));
        }
        let frame = crate::wire::encode_to_vec(&msg);
        let mut tx = self.tx.lock().expect("lock");
        if tx.closing {
            return Err(SendError::Closed("closing".into()));
        }
        if tx.backlog_bytes + frame.len() > BACKLOG_MAX {
            return Err(SendError::Full);
        }
        tx.backlog_bytes += frame.len();
        // Frames queued behind a partly sent one just join the stream.
        tx.backlog.push_back(Out::Bytes(frame, 0));
        if let Err(e) = self.pump(&mut tx) {
            drop(tx);
            let r = format!("rdma send failed: {e}");
            self.fail(&r);
            return Err(SendError::Closed(r));
        }
        Ok(())
    }
    fn close(&self, reason: &str) {
        {
            let mut tx = self.tx.lock().expect("lock");
            if tx.closing || self.closed.load(Ordering::Acquire) {
                drop(tx);
                self.emit_closed(reason.to_string());
                return;
            }
            tx.closing = true;
            tx.backlog.push_back(Out::Close(reason.to_string()));
            if self.pump(&mut tx).is_err() {
                let _ = self.tcp.shutdown(Shutdown::Both);
            }
        }
        self.emit_closed(reason.to_string());
    }
}

/// Builds a control connection on a connected TCP socket: QP, endpoint exchange,
/// receives posted, then (acceptor) `Accepted` is sent before the ready bytes, so it
/// precedes every message of the connection.
fn establish(
    shared: &Arc<Shared>,
    mut tcp: TcpStream,
    peer: String,
    events: EventTx,
    accepted: bool,
) -> anyhow::Result<Arc<CtrlConn>> {
    let per_conn = CTRL_RECVS + CTRL_SENDS;
    {
        let n = shared.conns.lock().expect("lock").len();
        anyhow::ensure!(
            (n + 1) * per_conn <= shared.ctrl_cq_entries,
            "too many rdma control connections ({n}; the completion queue holds {})",
            shared.ctrl_cq_entries
        );
    }
    handshake_timeouts(&tcp, true)?;
    let pd = &shared.pd;
    let qp = verbs::Qp::new_rc(pd, &shared.ctrl_cq, CTRL_SENDS as u32, CTRL_RECVS as u32)?;
    let recv = verbs::Mr::alloc(pd, CTRL_RECVS * CTRL_BUF)?;
    let send = verbs::Mr::alloc(pd, CTRL_SENDS * CTRL_BUF)?;
    let (remote, _) = exchange_hello(&mut tcp, KIND_CTRL, &qp.endpoint(), RegionDesc::default())?;
    qp.connect(&remote, 0)?;
    let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
    let conn = Arc::new(CtrlConn {
        id,
        peer,
        qp,
        recv,
        tx: Mutex::new(SendSide {
            mr: send,
            free: (0..CTRL_SENDS).rev().collect(),
            backlog: VecDeque::new(),
            backlog_bytes: 0,
            closing: false,
        }),
        rx: Mutex::new(FrameReader::new()),
        events: events.clone(),
        closed: AtomicBool::new(false),
        reason: Mutex::new(String::new()),
        tcp: tcp.try_clone()?,
    });
    for slot in 0..CTRL_RECVS {
        conn.post_recv(slot)?;
    }
    shared.conns.lock().expect("lock").insert(id, conn.clone());
    let ready = (|| {
        if accepted && events.send_detached(Event::Accepted(conn.clone())).is_err() {
            anyhow::bail!("the listener's event loop is gone");
        }
        exchange_ready(&mut tcp)?;
        handshake_timeouts(&tcp, false)?;
        Ok(())
    })();
    if let Err(e) = ready {
        shared.conns.lock().expect("lock").remove(&id);
        if accepted {
            // `Accepted` may have gone out: end it the documented way.
            conn.fail(&format!("rdma connection set-up failed: {e}"));
        }
        return Err(e);
    }
    // The side channel's end is this connection's end (see `Shared::lost`).
    let s = Arc::downgrade(shared);
    std::thread::Builder::new()
        .name("rdma-watch".into())
        .spawn(move || {
            wait_eof(tcp);
            if let Some(s) = s.upgrade() {
                s.lost.lock().expect("lock").push(id);
            }
        })?;
    Ok(conn)
}

/// The completion-polling thread of a transport.
fn poll_loop(shared: &Shared) {
    let mut wcs = verbs::wc_array::<32>();
    let mut idle = 0u32;
    while !shared.stop.load(Ordering::Acquire) {
        let n = match shared.ctrl_cq.poll(&mut wcs) {
            Ok(n) => n,
            Err(e) => {
                // A broken CQ breaks every connection.
                let conns: Vec<_> = shared.conns.lock().expect("lock").drain().collect();
                for (_, c) in conns {
                    c.fail(&format!("rdma completion queue failed: {e}"));
                }
                return;
            }
        };
        for wc in &wcs[..n] {
            let id = wc.wr_id() >> 16;
            let conn = shared.conns.lock().expect("lock").get(&id).cloned();
            // None: a completion of a connection already gone; nothing to do.
            if let Some(c) = conn {
                c.on_completion(wc);
            }
        }
        if n > 0 {
            idle = 0;
            continue;
        }
        // The CQ is empty: now end the connections whose side channel closed.
        let lost: Vec<ConnId> = std::mem::take(&mut *shared.lost.lock().expect("lock"));
        for id in lost {
            let c = shared.conns.lock().expect("lock").remove(&id);
            if let Some(c) = c {
                c.fail("connection lost (its TCP side channel closed)");
            }
        }
        idle = idle.saturating_add(1);
        if idle < SPIN_POLLS {
            std::hint::spin_loop();
        } else {
            std::thread::sleep(IDLE_SLEEP);
        }
    }
}

struct RdmaListener {
    addr: String,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Listener for RdmaListener {
    fn local_addr(&self) -> String {
        self.addr.clone()
    }
}

impl Drop for RdmaListener {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(h) = self.thread.take() {
            let _ = h.join();
        }
    }
}

// ---- regions ----------------------------------------------------------------------

/// A served region: its registration and the QPs readers connected.
struct RegionShared {
    // Drop order: QPs, then the registration, then the region memory.
    links: Mutex<HashMap<u64, (verbs::Qp, TcpStream)>>,
    _mr: verbs::Mr,
    pd: Arc<verbs::Pd>,
    cq: Arc<verbs::Cq>,
    desc: RegionDesc,
    next: AtomicU64,
    _region: Arc<Region>,
}

struct RdmaRegionServer {
    info: RegionInfo,
    shared: Arc<RegionShared>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl RegionServer for RdmaRegionServer {
    fn info(&self) -> RegionInfo {
        self.info.clone()
    }
}

impl Drop for RdmaRegionServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(h) = self.thread.take() {
            let _ = h.join();
        }
        // Readers' QPs go to the error state and are destroyed; their TCP channels
        // close, so readers see the region as gone. The registration goes with the
        // last reference (the watcher threads hold one until their socket ends).
        let links: Vec<_> = self.shared.links.lock().expect("lock").drain().collect();
        for (_, (qp, tcp)) in links {
            qp.set_error();
            let _ = tcp.shutdown(Shutdown::Both);
        }
    }
}

/// One reader connecting to a served region.
fn region_accept(rs: &Arc<RegionShared>, mut tcp: TcpStream) -> anyhow::Result<()> {
    handshake_timeouts(&tcp, true)?;
    let qp = verbs::Qp::new_rc(&rs.pd, &rs.cq, 1, 1)?;
    let (remote, _) = exchange_hello(&mut tcp, KIND_REGION, &qp.endpoint(), rs.desc)?;
    qp.connect(&remote, verbs::remote_read_access())?;
    exchange_ready(&mut tcp)?;
    handshake_timeouts(&tcp, false)?;
    let id = rs.next.fetch_add(1, Ordering::Relaxed);
    rs.links
        .lock()
        .expect("lock")
        .insert(id, (qp, tcp.try_clone()?));
    wait_eof(tcp);
    rs.links.lock().expect("lock").remove(&id);
    Ok(())
}

/// One attached region on the reader's side.
struct ReadLink {
    // Drop order: the QP first (after it is destroyed the NIC no longer writes into
    // the staging buffer for it).
    qp: verbs::Qp,
    tcp: TcpStream,
    alive: Arc<AtomicBool>,
    desc: RegionDesc,
}

impl Drop for ReadLink {
    fn drop(&mut self) {
        let _ = self.tcp.shutdown(Shutdown::Both);
    }
}

struct Peer {
    info: RegionInfo,
    link: Option<ReadLink>,
}

struct ReaderInner {
    peers: HashMap<u32, Peer>,
    staging: verbs::Mr,
    /// Call counter, in the top 32 bits of every wr_id: completions of an earlier
    /// call (a QP destroyed after a timeout) are recognised and ignored.
    seq: u64,
}

struct RdmaReader {
    pd: Arc<verbs::Pd>,
    cq: Arc<verbs::Cq>,
    inner: Mutex<ReaderInner>,
}

impl RdmaReader {
    fn connect(&self, info: &RegionInfo) -> anyhow::Result<ReadLink> {
        let mut tcp = tcp_connect(&info.addr)?;
        handshake_timeouts(&tcp, true)?;
        let qp = verbs::Qp::new_rc(&self.pd, &self.cq, READ_WAVE as u32, 1)?;
        let (remote, desc) =
            exchange_hello(&mut tcp, KIND_REGION, &qp.endpoint(), RegionDesc::default())?;
        anyhow::ensure!(
            desc.region == info.region
                && desc.len == info.len
                && desc.rkey == info.rkey
                && desc.base == info.base,
            "the region served at `{}` is not the one announced (stale RegionInfo?): served \
             {desc:?}, announced region {} len {} rkey {:#x} base {:#x}",
            info.addr,
            info.region,
            info.len,
            info.rkey,
            info.base
        );
        qp.connect(&remote, 0)?;
        exchange_ready(&mut tcp)?;
        handshake_timeouts(&tcp, false)?;
        let alive = Arc::new(AtomicBool::new(true));
        let (a, t) = (alive.clone(), tcp.try_clone()?);
        std::thread::Builder::new()
            .name("rdma-read-watch".into())
            .spawn(move || {
                wait_eof(t);
                a.store(false, Ordering::Release);
            })?;
        Ok(ReadLink {
            qp,
            tcp,
            alive,
            desc,
        })
    }
}

impl RegionReader for RdmaReader {
    fn attach(&self, peer: u32, info: &RegionInfo) -> anyhow::Result<()> {
        let link = self.connect(info)?;
        self.inner.lock().expect("lock").peers.insert(
            peer,
            Peer {
                info: info.clone(),
                link: Some(link),
            },
        );
        Ok(())
    }

    fn detach(&self, peer: u32) {
        self.inner.lock().expect("lock").peers.remove(&peer);
    }

    fn read_many(&self, reqs: &[ReadReq], timeout: Duration) -> Vec<Result<Vec<u8>, ReadError>> {
        let deadline = Instant::now() + timeout;
        let mut out: Vec<Option<Result<Vec<u8>, ReadError>>> = vec![None; reqs.len()];
        let mut guard = self.inner.lock().expect("lock");
        let inner = &mut *guard;
        inner.seq = inner.seq.wrapping_add(1) & 0xffff_ffff;
        let seq = inner.seq;

        // Check every request; reconnect peers whose link broke (once per call).
        let mut todo = Vec::new();
        let mut tried = Vec::new();
        for (i, r) in reqs.iter().enumerate() {
            let Some(p) = inner.peers.get_mut(&r.peer) else {
                out[i] = Some(Err(ReadError::Unreachable(format!(
                    "peer {} not attached",
                    r.peer
                ))));
                continue;
            };
            if r.offset
                .checked_add(r.len as u64)
                .is_none_or(|e| e > p.info.len)
            {
                out[i] = Some(Err(ReadError::OutOfBounds));
                continue;
            }
            if r.len as usize > STAGING {
                out[i] = Some(Err(ReadError::Unreachable(format!(
                    "a read of {} bytes is larger than the staging buffer",
                    r.len
                ))));
                continue;
            }
            if r.len == 0 {
                out[i] = Some(Ok(Vec::new()));
                continue;
            }
            let dead = p
                .link
                .as_ref()
                .is_none_or(|l| !l.alive.load(Ordering::Acquire));
            if dead && !tried.contains(&r.peer) {
                tried.push(r.peer);
                p.link = None;
                match self.connect(&p.info) {
                    Ok(l) => p.link = Some(l),
                    Err(e) => {
                        out[i] = Some(Err(ReadError::Unreachable(format!(
                            "peer {}'s region: {e:#}",
                            r.peer
                        ))));
                        continue;
                    }
                }
            }
            if p.link.is_none() {
                out[i] = Some(Err(ReadError::Unreachable(format!(
                    "peer {}'s region is gone",
                    r.peer
                ))));
                continue;
            }
            todo.push(i);
        }

        // Waves: post as many READs as fit the staging buffer and READ_WAVE, then
        // poll until they all completed or the deadline passed.
        let mut wcs = verbs::wc_array::<64>();
        let mut next = 0;
        while next < todo.len() {
            if Instant::now() >= deadline {
                break;
            }
            // (request index, staging offset, done)
            let mut wave: Vec<(usize, usize, bool)> = Vec::new();
            let mut used = 0usize;
            let mut outstanding = 0usize;
            while next < todo.len() && wave.len() < READ_WAVE {
                let i = todo[next];
                let r = reqs[i];
                let len = r.len as usize;
                if used + len > STAGING {
                    break;
                }
                next += 1;
                let p = inner.peers.get_mut(&r.peer).expect("checked above");
                let Some(l) = p.link.as_ref() else {
                    out[i] = Some(Err(ReadError::Unreachable(format!(
                        "peer {}'s link broke",
                        r.peer
                    ))));
                    continue;
                };
                let w = wave.len() as u64;
                // SAFETY: `used..used+len` lies inside the staging buffer and no
                // other READ of this call targets it; earlier calls' READs are
                // complete or their QPs destroyed (see the timeout below).
                let posted = unsafe {
                    let dst = inner.staging.addr().add(used);
                    l.qp.post_read(
                        (seq << 32) | w,
                        &inner.staging,
                        dst,
                        len,
                        l.desc.base + r.offset,
                        l.desc.rkey,
                    )
                };
                match posted {
                    Ok(()) => {
                        wave.push((i, used, false));
                        used += len;
                        outstanding += 1;
                    }
                    Err(e) => {
                        out[i] = Some(Err(ReadError::Unreachable(format!("peer {}: {e}", r.peer))));
                        p.link = None;
                    }
                }
            }
            // Peers whose QP failed a READ: dropped after the wave (their other
            // outstanding READs complete flushed first, so they fail fast).
            let mut broken: Vec<u32> = Vec::new();
            let mut spins = 0u32;
            while outstanding > 0 {
                let n = self.cq.poll(&mut wcs).unwrap_or(0);
                for wc in &wcs[..n] {
                    if wc.wr_id() >> 32 != seq {
                        continue; // a late completion of an earlier call
                    }
                    let w = (wc.wr_id() & 0xffff_ffff) as usize;
                    let Some(entry) = wave.get_mut(w) else {
                        continue;
                    };
                    if entry.2 {
                        continue;
                    }
                    entry.2 = true;
                    outstanding -= 1;
                    let (i, off) = (entry.0, entry.1);
                    let r = reqs[i];
                    out[i] = Some(if wc.is_valid() {
                        // SAFETY: the READ completed; the bytes are in staging.
                        let b = unsafe {
                            std::slice::from_raw_parts(
                                inner.staging.addr().add(off),
                                r.len as usize,
                            )
                        };
                        Ok(b.to_vec())
                    } else {
                        // The QP is in the error state now: reconnect next time.
                        broken.push(r.peer);
                        Err(ReadError::Unreachable(format!(
                            "rdma read from peer {} failed: {}",
                            r.peer,
                            verbs::wc_status_str(wc)
                        )))
                    });
                }
                if n == 0 {
                    if Instant::now() >= deadline {
                        break;
                    }
                    spins += 1;
                    if spins.is_multiple_of(64) {
                        std::thread::yield_now();
                    } else {
                        std::hint::spin_loop();
                    }
                }
            }
            for peer in broken {
                if let Some(p) = inner.peers.get_mut(&peer) {
                    p.link = None;
                }
            }
            if outstanding > 0 {
                // Timed out with READs in flight: destroy the QPs they were posted on
                // (the NIC stops writing into staging once a QP is destroyed) and time
                // the requests out; those peers reconnect on their next read.
                for &(i, _, done) in &wave {
                    if !done {
                        out[i] = Some(Err(ReadError::Timeout));
                        if let Some(p) = inner.peers.get_mut(&reqs[i].peer) {
                            p.link = None;
                        }
                    }
                }
                break;
            }
        }
        out.into_iter()
            .map(|o| o.unwrap_or(Err(ReadError::Timeout)))
            .collect()
    }
}

impl Transport for Rdma {
    fn name(&self) -> &'static str {
        "rdma"
    }

    fn listen(&self, addr: &str, events: EventTx) -> anyhow::Result<Box<dyn Listener>> {
        let l = TcpListener::bind(addr)
            .map_err(|e| anyhow::anyhow!("cannot listen at `{addr}`: {e}"))?;
        let local = l.local_addr()?.to_string();
        let stop = Arc::new(AtomicBool::new(false));
        let shared = Arc::downgrade(&self.shared);
        let thread = accept_loop(l, stop.clone(), move |tcp, peer| {
            let Some(s) = shared.upgrade() else {
                return;
            };
            if let Err(e) = establish(&s, tcp, peer.clone(), events.clone(), true) {
                tracing::warn!(%peer, error = %format!("{e:#}"), "rdma: connection failed");
            }
        })?;
        Ok(Box::new(RdmaListener {
            addr: local,
            stop,
            thread: Some(thread),
        }))
    }

    fn connect(&self, addr: &str, events: EventTx) -> anyhow::Result<Arc<dyn Conn>> {
        let tcp = tcp_connect(addr)?;
        let conn = establish(&self.shared, tcp, addr.to_string(), events, false)?;
        Ok(conn)
    }

    fn serve_region(
        &self,
        region: Arc<Region>,
        addr: &str,
    ) -> anyhow::Result<Box<dyn RegionServer>> {
        let l = TcpListener::bind(addr)
            .map_err(|e| anyhow::anyhow!("cannot serve a region at `{addr}`: {e}"))?;
        let local = l.local_addr()?.to_string();
        let (ptr, len) = region.raw();
        let pd = self.shared.pd.clone();
        // SAFETY: the region's memory never moves and lives as long as the Arc that
        // RegionShared keeps (declared after `mr`, so it is dropped after it).
        let mr = unsafe { verbs::Mr::register(&pd, ptr, len, verbs::remote_read_access())? };
        let desc = RegionDesc {
            region: region.id(),
            len: len as u64,
            base: ptr as u64,
            rkey: mr.rkey(),
        };
        let cq = verbs::Cq::new(pd.dev.clone(), 16)?;
        let rs = Arc::new(RegionShared {
            links: Mutex::new(HashMap::new()),
            _mr: mr,
            pd,
            cq,
            desc,
            next: AtomicU64::new(0),
            _region: region,
        });
        let stop = Arc::new(AtomicBool::new(false));
        let weak: Weak<RegionShared> = Arc::downgrade(&rs);
        let thread = accept_loop(l, stop.clone(), move |tcp, peer| {
            let Some(rs) = weak.upgrade() else {
                return;
            };
            if let Err(e) = region_accept(&rs, tcp) {
                tracing::warn!(%peer, error = %format!("{e:#}"), "rdma: region reader failed");
            }
        })?;
        Ok(Box::new(RdmaRegionServer {
            info: RegionInfo {
                addr: local,
                region: desc.region,
                len: desc.len,
                rkey: desc.rkey,
                base: desc.base,
            },
            shared: rs,
            stop,
            thread: Some(thread),
        }))
    }

    fn reader(&self) -> anyhow::Result<Arc<dyn RegionReader>> {
        let pd = self.shared.pd.clone();
        let entries = pd.dev.max_cqe.clamp(1, 4096);
        let cq = verbs::Cq::new(pd.dev.clone(), entries)?;
        let staging = verbs::Mr::alloc(&pd, STAGING)?;
        Ok(Arc::new(RdmaReader {
            pd,
            cq,
            inner: Mutex::new(ReaderInner {
                peers: HashMap::new(),
                staging,
                seq: 0,
            }),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_bytes_round_trip() {
        let e = verbs::Endpoint {
            qpn: 0x12_3456,
            psn: 0xab_cdef,
            lid: 7,
            gid: Some([9; 16]),
            mtu: 5,
            rd_atom: 16,
        };
        assert_eq!(verbs::Endpoint::from_bytes(&e.to_bytes()), e);
        let e = verbs::Endpoint { gid: None, ..e };
        assert_eq!(verbs::Endpoint::from_bytes(&e.to_bytes()), e);
    }

    #[test]
    fn wr_ids_keep_conn_kind_and_slot() {
        let w = wr_id(0xdead_beef, true, CTRL_RECVS - 1);
        assert_eq!(w >> 16, 0xdead_beef);
        assert_ne!(w & WR_RECV, 0);
        assert_eq!((w & (WR_RECV - 1)) as usize, CTRL_RECVS - 1);
        assert_eq!(wr_id(3, false, 5) & WR_RECV, 0);
    }
}
