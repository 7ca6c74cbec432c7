//! The TCP region protocol's frames (see [`super::tcp`]'s module docs), as pure
//! functions: what a region server and reader send each other, and the server's
//! answer to a run of requests. Every byte here comes from a peer: nothing
//! panics, a request outside the region gets an out-of-bounds answer, and what is
//! not a whole request waits for more bytes. Fuzzed by `fuzz/` (target
//! `region_frames`) and by `tests/fuzz_smoke.rs`.

use super::region::Region;

/// "FTRG": the first four bytes of a hello and a welcome.
pub const REGION_MAGIC: u32 = u32::from_le_bytes(*b"FTRG");
pub const HELLO_LEN: usize = 8;
pub const WELCOME_LEN: usize = 16;
/// A read request: u64 id, u64 offset, u32 len, u64 capability.
pub const REQ_LEN: usize = 28;
/// An answer's header: u64 id, u32 status, u32 len (then `len` bytes when ok).
pub const ANS_LEN: usize = 16;
pub const ST_OK: u32 = 0;
/// An answer's status: the read is outside the region.
pub const ST_OOB: u32 = 1;
/// An answer's status: the capability does not open a live slot there
/// ([`Region::read_slot`]).
pub const ST_DENIED: u32 = 2;
/// A welcome's status: the server does not serve the region asked for.
pub const ST_WRONG_REGION: u32 = 1;

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// A reader's hello for `region`.
pub fn hello(region: u32) -> [u8; HELLO_LEN] {
    let mut h = [0u8; HELLO_LEN];
    h[..4].copy_from_slice(&REGION_MAGIC.to_le_bytes());
    h[4..].copy_from_slice(&region.to_le_bytes());
    h
}

/// The region a hello asks for; Err when it is not a region reader's.
pub fn parse_hello(h: &[u8; HELLO_LEN]) -> Result<u32, String> {
    if u32_at(h, 0) != REGION_MAGIC {
        return Err("not a region reader (bad magic)".into());
    }
    Ok(u32_at(h, 4))
}

/// A server's welcome: `status` and the region's length.
pub fn welcome(status: u32, len: u64) -> [u8; WELCOME_LEN] {
    let mut w = [0u8; WELCOME_LEN];
    w[..4].copy_from_slice(&REGION_MAGIC.to_le_bytes());
    w[4..8].copy_from_slice(&status.to_le_bytes());
    w[8..].copy_from_slice(&len.to_le_bytes());
    w
}

/// (status, region length) of a welcome; Err when it is not a region server's.
pub fn parse_welcome(w: &[u8; WELCOME_LEN]) -> Result<(u32, u64), String> {
    if u32_at(w, 0) != REGION_MAGIC {
        return Err("not a Fermata region server".into());
    }
    Ok((u32_at(w, 4), u64_at(w, 8)))
}

/// One read request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub id: u64,
    pub offset: u64,
    pub len: u32,
    /// The task's capability ([`super::PROBE_CAP`]: a probe, answered with zeros).
    pub cap: u64,
}

impl Request {
    pub fn encode(&self) -> [u8; REQ_LEN] {
        let mut r = [0u8; REQ_LEN];
        r[..8].copy_from_slice(&self.id.to_le_bytes());
        r[8..16].copy_from_slice(&self.offset.to_le_bytes());
        r[16..20].copy_from_slice(&self.len.to_le_bytes());
        r[20..].copy_from_slice(&self.cap.to_le_bytes());
        r
    }

    pub fn decode(r: &[u8; REQ_LEN]) -> Request {
        Request {
            id: u64_at(r, 0),
            offset: u64_at(r, 8),
            len: u32_at(r, 16),
            cap: u64_at(r, 20),
        }
    }
}

/// An answer's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AnswerHeader {
    pub id: u64,
    pub status: u32,
    /// Bytes that follow (0 unless the status is [`ST_OK`]).
    pub len: u32,
}

impl AnswerHeader {
    /// The header of a failed read: its status, no bytes.
    pub fn failed(id: u64, e: super::ReadError) -> AnswerHeader {
        let status = match e {
            super::ReadError::Denied => ST_DENIED,
            _ => ST_OOB,
        };
        AnswerHeader { id, status, len: 0 }
    }

    pub fn encode(&self) -> [u8; ANS_LEN] {
        let mut h = [0u8; ANS_LEN];
        h[..8].copy_from_slice(&self.id.to_le_bytes());
        h[8..12].copy_from_slice(&self.status.to_le_bytes());
        h[12..].copy_from_slice(&self.len.to_le_bytes());
        h
    }

    pub fn decode(h: &[u8; ANS_LEN]) -> AnswerHeader {
        AnswerHeader {
            id: u64_at(h, 0),
            status: u32_at(h, 8),
            len: u32_at(h, 12),
        }
    }
}

/// The request at the start of `inb` when it is whole, asks for at least
/// `min` bytes and is not a probe: one a server may answer from the region's
/// memory straight into its socket's records instead of through `out`
/// ([`serve_requests_streamed`] answers the rest).
pub fn large_request(inb: &[u8], min: u32) -> Option<Request> {
    let r: &[u8; REQ_LEN] = inb.get(..REQ_LEN)?.try_into().ok()?;
    let req = Request::decode(r);
    (req.len >= min && req.cap != super::PROBE_CAP).then_some(req)
}

/// Answers every whole request at the start of `inb` from `region`, appending
/// the answers to `out`; returns the bytes of `inb` used (a multiple of
/// [`REQ_LEN`]; the rest waits for more). Stops early, having used a whole
/// number of requests, once `out` holds `flush_at` bytes or more, so the caller
/// can write them and call again.
pub fn serve_requests(inb: &[u8], region: &Region, out: &mut Vec<u8>, flush_at: usize) -> usize {
    let mut pos = 0;
    loop {
        let (used, zeros) = serve_requests_streamed(&inb[pos..], region, out, flush_at);
        pos += used;
        if zeros == 0 {
            return pos;
        }
        out.resize(out.len() + zeros as usize, 0);
    }
}

/// [`serve_requests`], except that a probe's answer ([`super::PROBE_CAP`]:
/// zeros) is not copied into `out`: its header is appended and it returns at
/// once with the count of zeros the caller writes after `out`. So a reader
/// that asks for many probes of the largest slot and never reads the answers
/// makes its server hold `flush_at` bytes and a chunk of zeros, not a slot's
/// length per request. Returns (bytes of `inb` used, zeros to write).
pub fn serve_requests_streamed(
    inb: &[u8],
    region: &Region,
    out: &mut Vec<u8>,
    flush_at: usize,
) -> (usize, u32) {
    serve_requests_streamed_below(inb, region, out, flush_at, None)
}

/// [`serve_requests_streamed`], stopping also before a request that
/// [`large_request`] gives for `large` (the caller answers it).
pub fn serve_requests_streamed_below(
    inb: &[u8],
    region: &Region,
    out: &mut Vec<u8>,
    flush_at: usize,
    large: Option<u32>,
) -> (usize, u32) {
    let mut pos = 0;
    while inb.len() - pos >= REQ_LEN && out.len() < flush_at {
        if large.is_some_and(|min| large_request(&inb[pos..], min).is_some()) {
            break;
        }
        let mut r = [0u8; REQ_LEN];
        r.copy_from_slice(&inb[pos..pos + REQ_LEN]);
        pos += REQ_LEN;
        let req = Request::decode(&r);
        let hdr_at = out.len();
        let ok = AnswerHeader {
            id: req.id,
            status: ST_OK,
            len: req.len,
        };
        out.extend_from_slice(&ok.encode());
        let probe = req.cap == super::PROBE_CAP;
        let e = match region.read_slot(req.offset, req.len, req.cap, |b| {
            if !probe {
                out.extend_from_slice(b)
            }
        }) {
            Ok(()) if probe && req.len > 0 => return (pos, req.len),
            Ok(()) => continue,
            Err(e) => e,
        };
        out[hdr_at..hdr_at + ANS_LEN].copy_from_slice(&AnswerHeader::failed(req.id, e).encode());
    }
    (pos, 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_bad_magic_is_refused() {
        assert_eq!(parse_hello(&hello(7)), Ok(7));
        assert_eq!(
            parse_welcome(&welcome(ST_OK, 1 << 40)),
            Ok((ST_OK, 1 << 40))
        );
        assert!(parse_hello(&[0; HELLO_LEN]).is_err());
        assert!(parse_welcome(&[0; WELCOME_LEN]).is_err());
        let r = Request {
            id: u64::MAX,
            offset: 3,
            len: 9,
            cap: u64::MAX - 1,
        };
        assert_eq!(Request::decode(&r.encode()), r);
    }

    /// Serving stops before a large read (left to the caller) and not before
    /// a small one or a probe of any size; the caller's header for it is the
    /// one the gathered answer starts with.
    #[test]
    fn a_large_read_is_left_to_the_caller() {
        let region = Region::new(1, 1 << 22).unwrap();
        let small = region.put(1, 11, &[7u8; 100]).unwrap();
        let big = region.put(2, 22, &vec![9u8; 200_000]).unwrap();
        let req = |id, at: &crate::transport::InputRef, cap| Request {
            id,
            offset: at.offset,
            len: at.len,
            cap,
        };
        let mut inb = Vec::new();
        inb.extend_from_slice(&req(1, &small, 11).encode());
        inb.extend_from_slice(&req(2, &small, super::super::PROBE_CAP).encode());
        inb.extend_from_slice(&req(3, &big, 22).encode());
        inb.extend_from_slice(&req(4, &small, 11).encode());
        let mut out = Vec::new();
        let (used, zeros) =
            serve_requests_streamed_below(&inb, &region, &mut out, 1 << 20, Some(1 << 16));
        assert_eq!(
            (used, zeros),
            (2 * REQ_LEN, small.len),
            "stopped at the probe's zeros"
        );
        let (used2, zeros2) =
            serve_requests_streamed_below(&inb[used..], &region, &mut out, 1 << 20, Some(1 << 16));
        assert_eq!((used2, zeros2), (0, 0), "stopped before the large read");
        let rest = &inb[used..];
        assert_eq!(large_request(rest, 1 << 16), Some(req(3, &big, 22)));
        assert_eq!(
            large_request(rest, big.len + 1),
            None,
            "under the threshold"
        );
        assert_eq!(large_request(&rest[..REQ_LEN - 1], 1), None, "not whole");
        // The read after it is served as before.
        let (used3, _) = serve_requests_streamed_below(
            &rest[REQ_LEN..],
            &region,
            &mut out,
            1 << 20,
            Some(1 << 16),
        );
        assert_eq!(used3, REQ_LEN);
        let mut gathered = Vec::new();
        serve_requests(&rest[..REQ_LEN], &region, &mut gathered, usize::MAX);
        let hdr = AnswerHeader {
            id: 3,
            status: ST_OK,
            len: big.len,
        };
        assert_eq!(gathered[..ANS_LEN], hdr.encode());
        assert_eq!(AnswerHeader::decode(&hdr.encode()), hdr);
    }

    #[test]
    fn a_probes_zeros_are_left_to_the_caller_and_the_answers_are_the_same() {
        let region = Region::new(1, 1 << 26).unwrap();
        let at = region.put(5, 55, b"hello").unwrap();
        let mut inb = Vec::new();
        for (id, offset, len, cap) in [
            (1, 0, super::super::region::MAX_SLOT as u32, 0),
            (2, at.offset, at.len, 55),
            (3, 0, 0, 0),
            (4, 0, u32::MAX, 0),
            (5, 64, 1000, 0),
        ] {
            inb.extend_from_slice(
                &Request {
                    id,
                    offset,
                    len,
                    cap,
                }
                .encode(),
            );
        }
        // Streamed, as a server writes it: what `out` holds, then the zeros.
        let (mut pos, mut wire, mut out, mut probes) = (0, Vec::new(), Vec::new(), 0);
        let mut held = 0;
        loop {
            let (used, z) = serve_requests_streamed(&inb[pos..], &region, &mut out, 1 << 18);
            held = held.max(out.len());
            wire.append(&mut out);
            wire.resize(wire.len() + z as usize, 0);
            probes += usize::from(z > 0);
            pos += used;
            if used == 0 {
                break;
            }
        }
        assert_eq!(pos, inb.len());
        assert_eq!(probes, 2, "two probes answered");
        assert!(
            held < 1 << 16,
            "never a probe's length in the buffer: {held}"
        );
        let mut whole = Vec::new();
        assert_eq!(
            serve_requests(&inb, &region, &mut whole, usize::MAX),
            inb.len()
        );
        assert_eq!(wire, whole, "the same bytes on the wire");
    }

    #[test]
    fn requests_are_answered_in_order_and_out_of_bounds_is_an_answer() {
        let region = Region::new(1, 4096).unwrap();
        let at = region.put(5, 55, b"hello").unwrap();
        let mut inb = Vec::new();
        inb.extend_from_slice(
            &Request {
                id: 1,
                offset: at.offset,
                len: at.len,
                cap: 55,
            }
            .encode(),
        );
        inb.extend_from_slice(
            &Request {
                id: 2,
                offset: u64::MAX - 3,
                len: u32::MAX,
                cap: 55,
            }
            .encode(),
        );
        inb.extend_from_slice(&[9; 7]); // part of a third
        let mut out = Vec::new();
        let used = serve_requests(&inb, &region, &mut out, usize::MAX);
        assert_eq!(used, 2 * REQ_LEN);
        let h1 = AnswerHeader::decode(out[..ANS_LEN].try_into().unwrap());
        assert_eq!((h1.id, h1.status, h1.len), (1, ST_OK, at.len));
        let data = &out[ANS_LEN..ANS_LEN + at.len as usize];
        assert_eq!(&data[data.len() - 5..], b"hello");
        let rest = &out[ANS_LEN + at.len as usize..];
        let h2 = AnswerHeader::decode(rest[..ANS_LEN].try_into().unwrap());
        assert_eq!((h2.id, h2.status, h2.len), (2, ST_OOB, 0));
        assert_eq!(rest.len(), ANS_LEN);
    }
}
