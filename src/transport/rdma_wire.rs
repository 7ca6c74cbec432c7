//! The RDMA transport's byte layouts that need no device, in every build (so
//! that the default test suite checks them): a queue pair's endpoint as the side
//! channel carries it, and the work request ids of control connections.

use super::ConnId;

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

/// An [`Endpoint`]'s size on the wire.
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

/// The bit of a control connection's work request id that marks a receive; the
/// slot is below it, the connection above bit 16.
pub const WR_RECV: u64 = 1 << 15;

/// The work request id of a control connection's slot: the connection, receive
/// or send, the slot (below [`WR_RECV`]).
pub fn wr_id(conn: ConnId, recv: bool, slot: usize) -> u64 {
    (conn << 16) | if recv { WR_RECV } else { 0 } | slot as u64
}

/// The connection, receive or send, and slot of a [`wr_id`].
pub fn wr_parts(w: u64) -> (ConnId, bool, usize) {
    (w >> 16, w & WR_RECV != 0, (w & (WR_RECV - 1)) as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_bytes_round_trip() {
        let e = Endpoint {
            qpn: 0x12_3456,
            psn: 0xab_cdef,
            lid: 7,
            gid: Some([9; 16]),
            mtu: 5,
            rd_atom: 16,
        };
        assert_eq!(Endpoint::from_bytes(&e.to_bytes()), e);
        let e = Endpoint { gid: None, ..e };
        assert_eq!(Endpoint::from_bytes(&e.to_bytes()), e);
        assert_eq!(e.to_bytes()[0..4], 0x12_3456u32.to_le_bytes());
    }

    #[test]
    fn wr_ids_keep_conn_kind_and_slot() {
        let last = WR_RECV as usize - 1;
        let w = wr_id(0xdead_beef, true, last);
        assert_eq!(wr_parts(w), (0xdead_beef, true, last));
        assert_eq!(wr_parts(wr_id(3, false, 5)), (3, false, 5));
        assert_eq!(wr_id(3, false, 5) & WR_RECV, 0);
    }
}
