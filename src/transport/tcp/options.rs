//! The TCP transport's sizes, timeouts and its environment settings
//! (`FERMATA_TCP_THREADS`, `FERMATA_TCP_PULL_STREAMS`). The public ones are
//! re-exported by [`super`].

use std::time::Duration;

/// Messages a connection queues before `send` answers
/// [`SendError::Full`](crate::transport::SendError::Full).
pub const SEND_QUEUE: usize = 65536;
/// How long `close` keeps trying to send what was queued before it.
pub const CLOSE_FLUSH: Duration = Duration::from_secs(1);
/// How long `connect` and `attach` wait for the peer.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The writer writes once this much is encoded even if more is queued.
pub(super) const WRITE_CHUNK: usize = 1 << 20;
/// Smallest read a connection's reader asks the socket for.
pub(super) const READ_CHUNK: usize = 64 << 10;
/// How long a reader waits before it tries a full event channel again.
pub(super) const EVENTS_FULL_WAIT: Duration = Duration::from_micros(200);

/// A region reader's buffer for answer headers (and small answers); larger answers
/// bypass it, straight into their own `Vec`.
pub(super) const ANSWER_BUF: usize = 8 << 10;
/// A region server writes its answers once this much is buffered.
pub(super) const ANSWER_CHUNK: usize = 256 << 10;
/// A `read_many` asking one peer for at least this many bytes spreads its
/// requests over the reader's connections to that peer (each gets at least
/// about half of this); a smaller one goes whole to one connection.
pub(super) const STRIPE_MIN: u64 = 512 << 10;

/// The most connections a region reader keeps to one peer.
pub(super) const PULL_STREAMS_MAX: usize = 16;

/// The count in environment variable `name` when it is one of 1..=`max`,
/// else `default`.
fn env_count(name: &str, max: usize, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|n| (1..=max).contains(n))
        .unwrap_or(default)
}

/// Worker threads of each TCP transport's tokio runtime: `FERMATA_TCP_THREADS`
/// (1 to 64), default 2.
pub(super) fn tcp_threads() -> usize {
    env_count("FERMATA_TCP_THREADS", 64, 2)
}

/// Connections a region reader keeps to each attached peer:
/// `FERMATA_TCP_PULL_STREAMS` (1 to 16), default 1. With K of them and K worker
/// threads ([`tcp_threads`]) at both ends, a large pull is sealed, sent and
/// opened on K workers at once rather than on one; on two cores one connection
/// through the channel already keeps both busy (docs/operations.md).
pub(super) fn pull_streams() -> usize {
    env_count("FERMATA_TCP_PULL_STREAMS", PULL_STREAMS_MAX, 1)
}
