//! The RDMA transport's only contact with libibverbs: thin, owning, safe wrappers
//! over the raw `ibverbs_sys` calls (device context, protection domain, completion
//! queue, RC queue pair, registered memory). **Every `unsafe` block of the RDMA
//! transport is in this file**, each with a `SAFETY` comment, and so are the
//! `unsafe impl Send`/`Sync`; a test in [`super`] checks that no other file of the
//! module says `unsafe`.
//!
//! What the wrappers guarantee to safe callers:
//! * **Drop order is always legal**: every object keeps what it was made from alive
//!   (QP -> CQ and PD, MR -> PD, PD and CQ -> device).
//! * **Memory the NIC may touch outlives it**: a [`Buf`] is freed only after it is
//!   deregistered and after every [`Qp`] a work request on it was posted to is
//!   destroyed (the QP keeps the buffer's memory); a [`RegionMr`] keeps its
//!   [`Region`] alive.
//! * **CPU accesses are bounds-checked** and go through raw copies: no Rust
//!   reference to memory the NIC may write is ever handed out. Writing needs
//!   `&mut Buf`, so two threads never copy into one buffer at once.
//!
//! What they leave to the callers (a broken rule gives wrong bytes, not memory
//! errors): posting a slot of a buffer only while no other work request uses it,
//! and reading it only after its completion. The callers keep free lists of slots
//! (control connections) or a table of the READs in flight (the reader) for that.
//!
//! Safety of `Send`/`Sync`: libibverbs objects may be used from any thread (the
//! library is thread safe, see rdmamojo "libibverbs thread safe level").

use crate::transport::rdma_wire::Endpoint;
use crate::transport::Region;
use ibverbs_sys as ffi;
use std::ffi::CStr;
use std::io;
use std::ptr;
use std::sync::{Arc, Mutex};

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

/// Ok for a zero return code, else the error `rc` of `what`.
fn check(rc: i32, what: &str) -> io::Result<()> {
    if rc != 0 {
        return Err(errno_err(what, rc));
    }
    Ok(())
}

/// The names of the RDMA devices libibverbs lists (through the safe `ibverbs`
/// crate); the error is libibverbs' (`ENOSYS` without kernel support).
pub fn device_names() -> io::Result<Vec<String>> {
    let list = ibverbs::devices()?;
    Ok(list
        .iter()
        .filter_map(|d| d.name().map(|n| n.to_string_lossy().into_owned()))
        .collect())
}

// ---- device --------------------------------------------------------------------

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
// SAFETY: the context is only passed to libibverbs, which is thread safe.
unsafe impl Send for Device {}
// SAFETY: as for Send; `&Device` gives no access to the context but through it.
unsafe impl Sync for Device {}

impl Device {
    /// Opens the device named `name` (as `ibv_get_device_name` gives it).
    pub fn open(name: &str) -> io::Result<Device> {
        let ctx = open_context(name)?;
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
        d.query_port()?;
        d.query_limits()?;
        Ok(d)
    }

    /// Port [`PORT`]: must be ACTIVE; its LID, MTU and (RoCE) GID.
    fn query_port(&mut self) -> io::Result<()> {
        let mut pa = ffi::ibv_port_attr::default();
        // SAFETY: same call as the ibverbs crate (ibv_port_attr starts with the
        // compat layout the exported symbol fills); `ctx` is open.
        let rc = unsafe { ffi::ibv_query_port(self.ctx, PORT, &mut pa as *mut _ as *mut _) };
        check(rc, "ibv_query_port")?;
        if pa.state != ffi::ibv_port_state::IBV_PORT_ACTIVE {
            return Err(io::Error::other(format!(
                "port {PORT} of {} is not ACTIVE (state {}); is the link up?",
                self.name, pa.state
            )));
        }
        self.lid = pa.lid;
        self.mtu = pa.active_mtu as u8;
        if u32::from(pa.link_layer) == ffi::IBV_LINK_LAYER_ETHERNET {
            self.gid = Some(pick_gid(self.ctx, pa.gid_tbl_len)?);
        }
        Ok(())
    }

    /// The device's limits on QPs and CQs.
    fn query_limits(&mut self) -> io::Result<()> {
        let mut da = ffi::ibv_device_attr::default();
        // SAFETY: `ctx` is open; `da` is a valid ibv_device_attr to fill.
        check(
            unsafe { ffi::ibv_query_device(self.ctx, &mut da) },
            "ibv_query_device",
        )?;
        self.max_rd_atom = da.max_qp_rd_atom.clamp(1, 16) as u8;
        self.max_qp_wr = da.max_qp_wr.max(1) as u32;
        self.max_cqe = da.max_cqe.max(1);
        Ok(())
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        // SAFETY: `ctx` came from ibv_open_device and is closed once; every object
        // made on it holds an Arc of this Device, so none is left.
        unsafe { ffi::ibv_close_device(self.ctx) };
    }
}

/// Opens a context on the device named `name`.
fn open_context(name: &str) -> io::Result<*mut ffi::ibv_context> {
    let mut n = 0i32;
    // SAFETY: the list is freed below; devices stay valid while a context on
    // them is open (ibv_free_device_list's contract).
    let list = unsafe { ffi::ibv_get_device_list(&mut n) };
    if list.is_null() {
        return Err(last_err("ibv_get_device_list"));
    }
    let mut ctx = ptr::null_mut();
    for i in 0..n.max(0) as usize {
        // SAFETY: the list holds `n` device pointers.
        let dev = unsafe { *list.add(i) };
        // SAFETY: `dev` is a listed device; the name is NUL-terminated (or null).
        let dn = unsafe { ffi::ibv_get_device_name(dev) };
        // SAFETY: checked non-null; it stays valid while the list does.
        if !dn.is_null() && unsafe { CStr::from_ptr(dn) }.to_string_lossy() == name {
            // SAFETY: a listed device, opened before the list is freed.
            ctx = unsafe { ffi::ibv_open_device(dev) };
            break;
        }
    }
    // SAFETY: freed once; no device of it is used after this but through `ctx`.
    unsafe { ffi::ibv_free_device_list(list) };
    if ctx.is_null() {
        return Err(io::Error::other(format!(
            "ibv_open_device({name}) failed or the device vanished"
        )));
    }
    Ok(ctx)
}

/// The raw bytes of a GID table entry.
fn gid_raw(e: &ffi::ibv_gid_entry) -> [u8; 16] {
    // SAFETY: ibv_gid is a union of 16 bytes and two u64s: every bit pattern is a
    // valid `raw`.
    unsafe { e.gid.raw }
}

/// RoCE needs a GID: `$FERMATA_RDMA_GID_INDEX` if set, else the first RoCE v2
/// entry holding an IPv4-mapped address, else the first RoCE v2 entry, else 0.
fn pick_gid(ctx: *mut ffi::ibv_context, len: i32) -> io::Result<([u8; 16], u8)> {
    let mut table = vec![ffi::ibv_gid_entry::default(); len.max(0) as usize];
    // SAFETY: `ctx` is open; the table has room for `table.len()` entries of the
    // size given.
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
    let pick = if let Some(i) = std::env::var("FERMATA_RDMA_GID_INDEX")
        .ok()
        .and_then(|v| v.parse::<u32>().ok())
    {
        table.iter().find(|e| e.gid_index == i)
    } else {
        let v2 = |e: &&ffi::ibv_gid_entry| e.gid_type == ffi::IBV_GID_TYPE_ROCE_V2;
        let v4 = |e: &&ffi::ibv_gid_entry| {
            gid_raw(e)[..12] == [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff]
        };
        table
            .iter()
            .find(|e| v2(e) && v4(e))
            .or_else(|| table.iter().find(v2))
            .or_else(|| table.first())
    };
    let e = pick.ok_or_else(|| io::Error::other("the port's GID table is empty"))?;
    Ok((gid_raw(e), e.gid_index as u8))
}

// ---- protection domain and completion queue -------------------------------------

/// A protection domain.
pub struct Pd {
    pd: *mut ffi::ibv_pd,
    pub dev: Arc<Device>,
}
// SAFETY: the PD is only passed to libibverbs, which is thread safe.
unsafe impl Send for Pd {}
// SAFETY: as for Send.
unsafe impl Sync for Pd {}

impl Pd {
    pub fn new(dev: Arc<Device>) -> io::Result<Arc<Pd>> {
        // SAFETY: the context is open (and stays so: the Pd holds the device).
        let pd = unsafe { ffi::ibv_alloc_pd(dev.ctx) };
        if pd.is_null() {
            return Err(last_err("ibv_alloc_pd"));
        }
        Ok(Arc::new(Pd { pd, dev }))
    }
}

impl Drop for Pd {
    fn drop(&mut self) {
        // SAFETY: allocated by ibv_alloc_pd, freed once; the QPs and MRs on it hold
        // an Arc of it, so none is left.
        unsafe { ffi::ibv_dealloc_pd(self.pd) };
    }
}

/// A completion queue.
pub struct Cq {
    cq: *mut ffi::ibv_cq,
    _dev: Arc<Device>,
}
// SAFETY: the CQ is only passed to libibverbs, which is thread safe.
unsafe impl Send for Cq {}
// SAFETY: as for Send.
unsafe impl Sync for Cq {}

/// One work completion (ibverbs-sys' `ibv_wc`, with its safe accessors).
pub type Wc = ffi::ibv_wc;

/// A zeroed completion array for [`Cq::poll`].
pub fn wc_array<const N: usize>() -> [Wc; N] {
    // SAFETY: ibv_wc is plain old data; all zeroes is a valid value.
    unsafe { std::mem::zeroed() }
}

/// Whether `wc` failed only because its QP went to the error state (flushed).
pub fn flushed(wc: &Wc) -> bool {
    matches!(wc.error(), Some((st, _)) if st == ffi::ibv_wc_status::IBV_WC_WR_FLUSH_ERR)
}

/// Human-readable work completion status.
pub fn wc_status_str(wc: &Wc) -> String {
    match wc.error() {
        None => "success".into(),
        Some((st, vendor)) => {
            // SAFETY: returns a static string (or null), whatever the status.
            let s = unsafe { ffi::ibv_wc_status_str(st) };
            let s = if s.is_null() {
                format!("status {st}")
            } else {
                // SAFETY: non-null, NUL-terminated and static.
                unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
            };
            format!("{s} (vendor error {vendor:#x})")
        }
    }
}

impl Cq {
    pub fn new(dev: Arc<Device>, entries: i32) -> io::Result<Arc<Cq>> {
        // SAFETY: the context is open; no completion channel, no context pointer.
        let cq =
            unsafe { ffi::ibv_create_cq(dev.ctx, entries, ptr::null_mut(), ptr::null_mut(), 0) };
        if cq.is_null() {
            return Err(last_err("ibv_create_cq"));
        }
        Ok(Arc::new(Cq { cq, _dev: dev }))
    }

    /// Pops up to `out.len()` completions; how many.
    pub fn poll(&self, out: &mut [Wc]) -> io::Result<usize> {
        // SAFETY: ibv_poll_cq is inline in verbs.h; this is its body (as in the
        // ibverbs crate). It writes at most `out.len()` entries.
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
        // SAFETY: created by ibv_create_cq, destroyed once; the QPs on it hold an
        // Arc of it, so none is left.
        unsafe { ffi::ibv_destroy_cq(self.cq) };
    }
}

// ---- registered memory ---------------------------------------------------------

/// Access for local buffers (receives and READ targets need LOCAL_WRITE).
fn local_access() -> u32 {
    ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0
}
/// Access for a region that peers read.
pub fn remote_read_access() -> u32 {
    ffi::ibv_access_flags::IBV_ACCESS_REMOTE_READ.0
}

/// One memory registration; deregistered on drop.
struct Registration {
    mr: *mut ffi::ibv_mr,
    _pd: Arc<Pd>,
}
// SAFETY: the MR is only passed to libibverbs (thread safe) or read (its keys).
unsafe impl Send for Registration {}
// SAFETY: as for Send.
unsafe impl Sync for Registration {}

impl Registration {
    /// Registers `addr..addr+len` with `access`. Whoever owns the memory must keep
    /// it allocated (and in place) until the registration is dropped.
    fn new(pd: &Arc<Pd>, addr: *mut u8, len: usize, access: u32) -> io::Result<Registration> {
        // SAFETY: registering only pins and maps the pages; the callers (Buf,
        // RegionMr) keep the memory alive past the registration (field order).
        let mr = unsafe { ffi::ibv_reg_mr(pd.pd, addr.cast(), len, access as i32) };
        if mr.is_null() {
            return Err(last_err("ibv_reg_mr"));
        }
        Ok(Registration {
            mr,
            _pd: pd.clone(),
        })
    }

    fn lkey(&self) -> u32 {
        // SAFETY: `mr` is registered until drop.
        unsafe { (*self.mr).lkey }
    }

    fn rkey(&self) -> u32 {
        // SAFETY: `mr` is registered until drop.
        unsafe { (*self.mr).rkey }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        // SAFETY: registered by ibv_reg_mr, deregistered once.
        unsafe { ffi::ibv_dereg_mr(self.mr) };
    }
}

/// Heap memory reached only through a raw pointer (no Rust reference to it
/// exists while the NIC may write it); freed on drop.
struct RawMem {
    addr: *mut u8,
    len: usize,
}
// SAFETY: plain heap memory; accesses are synchronised by `Buf`'s borrows.
unsafe impl Send for RawMem {}
// SAFETY: as for Send.
unsafe impl Sync for RawMem {}

impl RawMem {
    fn zeroed(len: usize) -> RawMem {
        let b: Box<[u8]> = vec![0u8; len].into_boxed_slice();
        RawMem {
            addr: Box::into_raw(b).cast::<u8>(),
            len,
        }
    }
}

impl Drop for RawMem {
    fn drop(&mut self) {
        // SAFETY: `addr` and `len` are those of the boxed slice made in `zeroed`,
        // freed once.
        drop(unsafe { Box::from_raw(ptr::slice_from_raw_parts_mut(self.addr, self.len)) });
    }
}

/// A [`Buf`]'s memory and its registration (dropped in that field order:
/// deregistered first, then freed).
struct BufMem {
    reg: Registration,
    mem: RawMem,
}

/// A registered buffer for local access (send slots, receive slots, READ
/// targets): memory allocated and zeroed here. Its memory lives on after the
/// `Buf` while a [`Qp`] that had a work request on it does.
pub struct Buf {
    mem: Arc<BufMem>,
}

impl Buf {
    /// Allocates `len` zeroed bytes and registers them for local access.
    pub fn alloc(pd: &Arc<Pd>, len: usize) -> io::Result<Buf> {
        let mem = RawMem::zeroed(len);
        let reg = Registration::new(pd, mem.addr, len, local_access())?;
        Ok(Buf {
            mem: Arc::new(BufMem { reg, mem }),
        })
    }

    /// The address of `off..off+len`, checked to lie inside the buffer.
    fn range(&self, off: usize, len: usize) -> io::Result<*mut u8> {
        if off.checked_add(len).is_none_or(|e| e > self.mem.mem.len) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "bytes {off}..+{len} are outside a registered buffer of {}",
                    self.mem.mem.len
                ),
            ));
        }
        // SAFETY: in bounds (checked above).
        Ok(unsafe { self.mem.mem.addr.add(off) })
    }

    /// Copies `data` into the buffer at `off`. Panics when it does not fit.
    pub fn write(&mut self, off: usize, data: &[u8]) {
        let dst = self
            .range(off, data.len())
            .expect("write inside the buffer");
        // SAFETY: in bounds; `data` is not in this buffer (no Rust reference to it
        // exists), so the two do not overlap; `&mut self` excludes other copies.
        unsafe { ptr::copy_nonoverlapping(data.as_ptr(), dst, data.len()) };
    }

    /// Appends `len` bytes at `off` to `out`. Panics when out of bounds.
    pub fn copy_into(&self, off: usize, len: usize, out: &mut Vec<u8>) {
        let src = self.range(off, len).expect("read inside the buffer");
        out.reserve(len);
        // SAFETY: `src..src+len` is in bounds; `out` has room for `len` more bytes
        // past its length and is not this buffer, so they do not overlap; a CPU
        // write into the buffer needs `&mut self`, excluded here.
        unsafe {
            ptr::copy_nonoverlapping(src, out.as_mut_ptr().add(out.len()), len);
            out.set_len(out.len() + len);
        }
    }

    /// `len` bytes at `off`, copied out. Panics when out of bounds.
    pub fn copy_out(&self, off: usize, len: usize) -> Vec<u8> {
        let mut v = Vec::with_capacity(len);
        self.copy_into(off, len, &mut v);
        v
    }
}

/// A served [`Region`] registered for remote reads; keeps the region alive.
pub struct RegionMr {
    // Field order: deregistered before the region can go.
    reg: Registration,
    base: u64,
    len: usize,
    _region: Arc<Region>,
}

impl RegionMr {
    pub fn new(pd: &Arc<Pd>, region: Arc<Region>) -> io::Result<RegionMr> {
        let (addr, len) = region.raw();
        // The region's memory never moves and lives as long as `_region`, which is
        // dropped after `reg`.
        let reg = Registration::new(pd, addr, len, remote_read_access())?;
        Ok(RegionMr {
            reg,
            base: addr as u64,
            len,
            _region: region,
        })
    }

    /// The address readers READ at (plus an offset).
    pub fn base(&self) -> u64 {
        self.base
    }

    /// The region's length in bytes.
    pub fn size(&self) -> usize {
        self.len
    }

    pub fn rkey(&self) -> u32 {
        self.reg.rkey()
    }
}

// ---- queue pairs ---------------------------------------------------------------

/// An RC queue pair (send and receive completions both go to `cq`).
pub struct Qp {
    qp: *mut ffi::ibv_qp,
    qpn: u32,
    psn: u32,
    pd: Arc<Pd>,
    _cq: Arc<Cq>,
    /// The buffers work requests were posted into: their memory stays until the
    /// QP is destroyed (after which the NIC no longer touches it).
    pinned: Mutex<Vec<Arc<BufMem>>>,
}
// SAFETY: the QP is only passed to libibverbs, which is thread safe.
unsafe impl Send for Qp {}
// SAFETY: as for Send.
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
        // SAFETY: the PD and CQ are alive (and stay so: the Qp holds both).
        let qp = unsafe { ffi::ibv_create_qp(pd.pd, &mut attr) };
        if qp.is_null() {
            return Err(last_err("ibv_create_qp"));
        }
        // SAFETY: ibv_create_qp returned a valid QP.
        let qpn = unsafe { (*qp).qp_num };
        // A pseudo-random 24-bit starting PSN (any value works; random ones keep
        // stale packets of an earlier QP with the same number out).
        let psn = (std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0)
            ^ qpn)
            & 0xff_ffff;
        Ok(Qp {
            qp,
            qpn,
            psn,
            pd: pd.clone(),
            _cq: cq.clone(),
            pinned: Mutex::new(Vec::new()),
        })
    }

    pub fn endpoint(&self) -> Endpoint {
        let d = &self.pd.dev;
        Endpoint {
            qpn: self.qpn,
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
        self.to_init(access)?;
        self.to_rtr(remote)?;
        self.to_rts(remote)
    }

    fn to_init(&self, access: u32) -> io::Result<()> {
        use ffi::ibv_qp_attr_mask as M;
        let mut a = ffi::ibv_qp_attr {
            qp_state: ffi::ibv_qp_state::IBV_QPS_INIT,
            pkey_index: 0,
            port_num: PORT,
            qp_access_flags: access,
            ..Default::default()
        };
        let mask = M::IBV_QP_STATE | M::IBV_QP_PKEY_INDEX | M::IBV_QP_PORT | M::IBV_QP_ACCESS_FLAGS;
        self.modify(&mut a, mask, "ibv_modify_qp(INIT)")
    }

    fn to_rtr(&self, remote: &Endpoint) -> io::Result<()> {
        use ffi::ibv_qp_attr_mask as M;
        let d = &self.pd.dev;
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
        self.modify(&mut a, mask, "ibv_modify_qp(RTR)")
    }

    fn to_rts(&self, remote: &Endpoint) -> io::Result<()> {
        use ffi::ibv_qp_attr_mask as M;
        let d = &self.pd.dev;
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
        // SAFETY: the QP is alive; `a` is a valid attribute struct for `mask`.
        check(
            unsafe { ffi::ibv_modify_qp(self.qp, a, mask.0 as i32) },
            what,
        )
    }

    /// The provider's operations (the bodies of verbs.h's inline functions).
    fn ops(&self) -> &ffi::ibv_context_ops {
        // SAFETY: a live QP points at its context, which outlives the QP (the QP
        // holds the device through its PD).
        unsafe { &(*(*self.qp).context).ops }
    }

    /// Keeps `buf`'s memory until the QP is destroyed.
    fn pin(&self, buf: &Buf) {
        let mut p = self.pinned.lock().expect("qp lock");
        if !p.iter().any(|m| Arc::ptr_eq(m, &buf.mem)) {
            p.push(buf.mem.clone());
        }
    }

    /// A scatter/gather entry for `off..off+len` of `buf` (checked to be in
    /// bounds), with `buf` pinned to this QP.
    fn sge(&self, buf: &Buf, off: usize, len: usize) -> io::Result<ffi::ibv_sge> {
        let addr = buf.range(off, len)?;
        self.pin(buf);
        Ok(ffi::ibv_sge {
            addr: addr as u64,
            length: len as u32,
            lkey: buf.mem.reg.lkey(),
        })
    }

    /// Posts a receive into `off..off+len` of `buf`. The slot should not be read
    /// or posted again until its completion.
    pub fn post_recv(&self, wr_id: u64, buf: &Buf, off: usize, len: usize) -> io::Result<()> {
        let mut sge = self.sge(buf, off, len)?;
        let mut wr = ffi::ibv_recv_wr {
            wr_id,
            next: ptr::null_mut(),
            sg_list: &mut sge,
            num_sge: 1,
        };
        let mut bad = ptr::null_mut();
        let post = self.ops().post_recv.expect("provider without post_recv");
        // SAFETY: ibv_post_recv's body (inline in verbs.h). The QP is alive; `wr`
        // and `sge` outlive the call (the provider copies them); the bytes are
        // registered, in bounds and pinned until the QP is destroyed.
        check(unsafe { post(self.qp, &mut wr, &mut bad) }, "ibv_post_recv")
    }

    /// Posts a signalled SEND of `off..off+len` of `buf`, with immediate data
    /// when `imm` is given. The slot should not be rewritten until its completion.
    pub fn post_send(
        &self,
        wr_id: u64,
        buf: &Buf,
        off: usize,
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
        self.post(wr_id, buf, off, len, wr, "ibv_post_send(SEND)")
    }

    /// Posts a signalled RDMA READ of `len` bytes at remote address `raddr` (key
    /// `rkey`) into `off..off+len` of `buf`. Those bytes should not be read until
    /// its completion.
    pub fn post_read(
        &self,
        wr_id: u64,
        buf: &Buf,
        off: usize,
        len: usize,
        raddr: u64,
        rkey: u32,
    ) -> io::Result<()> {
        let mut wr = ffi::ibv_send_wr {
            opcode: ffi::ibv_wr_opcode::IBV_WR_RDMA_READ,
            ..Default::default()
        };
        // Writing a union field is safe; these are the RDMA variant's.
        wr.wr.rdma.remote_addr = raddr;
        wr.wr.rdma.rkey = rkey;
        self.post(wr_id, buf, off, len, wr, "ibv_post_send(RDMA_READ)")
    }

    fn post(
        &self,
        wr_id: u64,
        buf: &Buf,
        off: usize,
        len: usize,
        mut wr: ffi::ibv_send_wr,
        what: &str,
    ) -> io::Result<()> {
        let mut sge = self.sge(buf, off, len)?;
        wr.wr_id = wr_id;
        wr.next = ptr::null_mut();
        wr.sg_list = &mut sge;
        wr.num_sge = 1;
        wr.send_flags = ffi::ibv_send_flags::IBV_SEND_SIGNALED.0;
        let mut bad = ptr::null_mut();
        let post = self.ops().post_send.expect("provider without post_send");
        // SAFETY: ibv_post_send's body (inline in verbs.h). The QP is alive; `wr`
        // and `sge` outlive the call (the provider copies them); the local bytes
        // are registered, in bounds and pinned until the QP is destroyed. Remote
        // addresses are checked by the peer's NIC (rkey).
        check(unsafe { post(self.qp, &mut wr, &mut bad) }, what)
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        // SAFETY: created by ibv_create_qp, destroyed once; after this the NIC no
        // longer touches the pinned buffers, which are released after (field drop).
        unsafe { ffi::ibv_destroy_qp(self.qp) };
    }
}
