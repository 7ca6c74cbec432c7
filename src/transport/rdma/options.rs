//! The RDMA transport's sizes and timeouts. The public ones are re-exported by
//! [`super`].

use std::time::Duration;

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
pub(super) const SPIN_POLLS: u32 = 2000;
/// Limit on TCP connect and the endpoint exchange.
pub(super) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

// The staging buffer must hold the largest slot.
const _: () = assert!(STAGING >= crate::transport::region::MAX_SLOT);
