//! TCP transport (tokio, loopback or LAN).
//!
//! A [`Tcp`] value owns a small tokio runtime (two named worker threads); every
//! method is a plain synchronous call that can be made from any thread, inside tokio
//! or not. Every socket has `TCP_NODELAY` set.
//!
//! # Control connections
//! Each [`Conn`] has two tasks:
//! * a **writer** draining a bounded queue ([`SEND_QUEUE`] messages;
//!   [`SendError::Full`] beyond): it encodes everything queued into one buffer
//!   (frames of [`crate::wire::encode`]) and writes it at once, so a burst of sends
//!   costs a few system calls;
//! * a **reader** splitting the byte stream into frames, decoding them and pushing
//!   [`Event::Msg`]s. A frame longer than [`MAX_FRAME`] or one that does not decode
//!   closes that connection (the reason is logged on stderr); nothing else is
//!   affected.
//!
//! A connection ends once, for whichever comes first: [`Conn::close`], the peer's
//! end (EOF), a read or write error, a bad frame. Its event channel then gets one
//! [`Event::Closed`] and nothing after it. `close` sends what was queued before it
//! (for at most [`CLOSE_FLUSH`]) and shuts the socket down; the peer sees EOF.
//! Dropping a `Conn` handle does not close the connection (as in-process).
//! Events are pushed from the runtime's threads without blocking them: at a full
//! event channel ([`EVENTS_MAX`]) a reader waits and tries again (it reads no more
//! meanwhile, so TCP flow control slows the peer down); the waits are counted.
//!
//! # Region server (one-sided reads without the application)
//! [`Transport::serve_region`] runs its own listener; a task per reader connection
//! answers fixed-size binary requests straight from the [`Region`] (copied with
//! [`Region::read_slot`] into the socket's write buffer, which serves a read only
//! when its capability opens the live slot it names). With a cluster key the
//! connection first proves membership ([`crate::transport::auth`]). The protocol
//! (all little endian) is not [`Msg`]:
//!
//! ```text
//! hello    reader -> server   u32 magic "FTRG", u32 region id
//! welcome  server -> reader   u32 magic, u32 status (0 ok, 1 wrong region), u64 region len
//! request  reader -> server   u64 request id, u64 offset, u32 len, u64 cap  (28 bytes)
//! answer   server -> reader   u64 request id, u32 status (0 ok, 1 out of bounds,
//!                             2 denied), u32 len, then len bytes when ok    (16 bytes + data)
//! ```
//!
//! Requests are pipelined: a reader sends every request of a [`RegionReader::read_many`]
//! at once and answers come back in order on each connection. The [`RegionReader`]
//! keeps `FERMATA_TCP_PULL_STREAMS` connections per attached peer (made in
//! `attach`; default 1): with several, a `read_many` asking a peer for 512 KiB or
//! more splits its requests into runs of about equal bytes, one per connection,
//! so that the server seals them and the reader opens them on several workers at
//! once; a smaller one goes whole to the connections in turn. Once one of a
//! peer's connections breaks, every read of that peer fails as
//! [`ReadError::Unreachable`] until the peer is attached again. The caller of
//! `read_many` sleeps on a condition variable until the last answer (one wake-up
//! per call), so it may be any plain thread.
//!
//! Addresses are reported as bound: a listener or region server bound to
//! `0.0.0.0:0` reports `0.0.0.0:PORT`, which peers on other hosts cannot use; bind
//! to the address peers should connect to.
//!
//! # Files
//! * `options`: sizes, timeouts, `FERMATA_TCP_THREADS`;
//! * `runtime`: the tokio runtime shared by everything a [`Tcp`] made;
//! * `net`: address resolution, blocking connect, binding;
//! * `conn`, `conn_writer`, `conn_reader`: a control connection, its writer
//!   and its reader task;
//! * `listener`: accepting control connections;
//! * `region_server`: serving a region to readers;
//! * `reader`, `reader_peer`: the pull side, and its connection to one peer.
//!
//! [`SendError::Full`]: super::SendError::Full
//! [`Event::Msg`]: super::Event::Msg
//! [`MAX_FRAME`]: crate::wire::MAX_FRAME
//! [`Event::Closed`]: super::Event::Closed
//! [`EVENTS_MAX`]: super::EVENTS_MAX
//! [`Msg`]: crate::wire::Msg
//! [`ReadError::Unreachable`]: super::ReadError::Unreachable

mod conn;
mod conn_reader;
mod conn_writer;
mod listener;
mod net;
mod options;
mod reader;
mod reader_peer;
mod region_server;
mod runtime;

pub use options::{CLOSE_FLUSH, CONNECT_TIMEOUT, SEND_QUEUE};

use super::auth::ClusterKey;
use super::{Conn, EventTx, Listener, Region, RegionReader, RegionServer, Transport};
use std::sync::Arc;

/// The TCP transport. Clones share one runtime, which lives as long as the last
/// clone or anything made with it (connections, listeners, servers, readers).
#[derive(Clone)]
pub struct Tcp {
    inner: Arc<runtime::Inner>,
}

impl Tcp {
    /// A transport with its own runtime (2 worker threads named `fermata-tcp`),
    /// without peer authentication: for tests and tools outside a cluster.
    pub fn new() -> anyhow::Result<Tcp> {
        Self::keyed(None)
    }

    /// A transport whose every connection, made or accepted, opens with the
    /// cluster handshake over `key` ([`crate::transport::auth`]).
    pub fn keyed(key: Option<ClusterKey>) -> anyhow::Result<Tcp> {
        Ok(Tcp {
            inner: Arc::new(runtime::Inner::start(key)?),
        })
    }

    /// [`Tcp::keyed`] whose region readers keep `streams` connections (1 to 16)
    /// to each peer instead of `FERMATA_TCP_PULL_STREAMS`' number.
    pub fn keyed_with_pull_streams(key: Option<ClusterKey>, streams: usize) -> anyhow::Result<Tcp> {
        anyhow::ensure!(
            (1..=options::PULL_STREAMS_MAX).contains(&streams),
            "pull streams must be 1 to {}, not {streams}",
            options::PULL_STREAMS_MAX
        );
        let mut inner = runtime::Inner::start(key)?;
        inner.pull_streams = streams;
        Ok(Tcp {
            inner: Arc::new(inner),
        })
    }
}

impl Transport for Tcp {
    fn name(&self) -> &'static str {
        "tcp"
    }

    fn listen(&self, addr: &str, events: EventTx) -> anyhow::Result<Box<dyn Listener>> {
        listener::listen(&self.inner, addr, events)
    }

    fn connect(&self, addr: &str, events: EventTx) -> anyhow::Result<Arc<dyn Conn>> {
        conn::connect(&self.inner, addr, events)
    }

    fn serve_region(
        &self,
        region: Arc<Region>,
        addr: &str,
    ) -> anyhow::Result<Box<dyn RegionServer>> {
        region_server::serve(&self.inner, region, addr)
    }

    fn reader(&self) -> anyhow::Result<Arc<dyn RegionReader>> {
        Ok(Arc::new(reader::TcpReader::new(self.inner.clone())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// The in-process transport's test scenario, over loopback TCP.
    #[test]
    fn messages_regions_and_close() {
        crate::transport::conformance(&Tcp::new().unwrap(), "127.0.0.1:0", "127.0.0.1:0");
    }

    /// The same through the secure channel (a transport with a cluster key).
    #[test]
    fn messages_regions_and_close_through_the_channel() {
        let tr = Tcp::keyed(Some(ClusterKey::generate())).unwrap();
        crate::transport::conformance(&tr, "127.0.0.1:0", "127.0.0.1:0");
    }

    /// `inputs` in a region (input t as task t with capability `cap`) that
    /// `tr` serves, a reader with it attached as peer 0, and a read of each
    /// input (read `denied` with another capability).
    fn served(
        tr: &Tcp,
        inputs: &[Vec<u8>],
        cap: u64,
        denied: usize,
    ) -> (
        Box<dyn RegionServer>,
        Arc<dyn RegionReader>,
        Vec<crate::transport::ReadReq>,
    ) {
        let reg = Arc::new(Region::new(1, 16 << 20).unwrap());
        let srv = tr.serve_region(reg.clone(), "127.0.0.1:0").unwrap();
        let rd = tr.reader().unwrap();
        rd.attach(0, &srv.info()).unwrap();
        let reqs = inputs
            .iter()
            .enumerate()
            .map(|(t, b)| {
                let r = reg.put(t as u64, cap, b).unwrap();
                crate::transport::ReadReq {
                    peer: 0,
                    offset: r.offset,
                    len: r.len,
                    cap: if t == denied { cap + 1 } else { cap },
                }
            })
            .collect();
        (srv, rd, reqs)
    }

    /// A pull of several MiB is split over the reader's connections to the
    /// peer; every input comes back whole and in its place, a refused read
    /// among them included, in the clear and through the channel (where the
    /// large slots are sealed straight from the region and the small ones
    /// gathered first), into new buffers and into recycled ones.
    #[test]
    fn large_pulls_spread_over_connections_come_back_whole() {
        use crate::transport::{ReadError, SlotHeader};
        for key in [None, Some(ClusterKey::generate())] {
            let tr = Tcp::keyed_with_pull_streams(key, 3).unwrap();
            const CAP: u64 = 77;
            // Large and small inputs in turn (every third one small).
            let inputs: Vec<Vec<u8>> = (0..10u64)
                .map(|t| {
                    let n = if t % 3 == 2 { 1_000 } else { 300_000 };
                    (0..n).map(|i| (i as u64 * 31 + t) as u8).collect()
                })
                .collect();
            // The fifth asked with another capability: refused alone.
            let (srv, rd, reqs) = served(&tr, &inputs, CAP, 4);
            for _ in 0..3 {
                let out = rd.read_many(&reqs, Duration::from_secs(5));
                for (t, o) in out.iter().enumerate() {
                    if t == 4 {
                        assert_eq!(*o, Err(ReadError::Denied));
                        continue;
                    }
                    let slot = o.as_ref().unwrap();
                    assert_eq!(
                        SlotHeader::check(slot, t as u64, CAP).unwrap(),
                        &inputs[t][..]
                    );
                }
            }
            // Into the caller's buffers: each answer lands in one of them.
            let bufs: Vec<Vec<u8>> = (0..reqs.len())
                .map(|_| Vec::with_capacity(400_000))
                .collect();
            let given: std::collections::HashSet<usize> =
                bufs.iter().map(|b| b.as_ptr() as usize).collect();
            let out = rd.read_many_into(&reqs, Duration::from_secs(5), bufs);
            for (t, o) in out.iter().enumerate().filter(|(t, _)| *t != 4) {
                let slot = o.as_ref().unwrap();
                assert!(
                    given.contains(&(slot.as_ptr() as usize)),
                    "input {t} in a new buffer"
                );
                assert_eq!(
                    SlotHeader::check(slot, t as u64, CAP).unwrap(),
                    &inputs[t][..]
                );
            }
            // Into recycled buffers holding other bytes, shorter and longer
            // than the answers: nothing of what they held is left.
            let bufs: Vec<Vec<u8>> = (0..reqs.len())
                .map(|i| vec![0xA5; if i % 2 == 0 { 100_000 } else { 500_000 }])
                .collect();
            let out = rd.read_many_into(&reqs, Duration::from_secs(5), bufs);
            for (t, o) in out.iter().enumerate().filter(|(t, _)| *t != 4) {
                let slot = o.as_ref().unwrap();
                assert_eq!(
                    SlotHeader::check(slot, t as u64, CAP).unwrap(),
                    &inputs[t][..]
                );
            }
            // The server gone, every read of the peer fails.
            drop(srv);
            let out = rd.read_many(&reqs, Duration::from_secs(5));
            assert!(
                out.iter()
                    .all(|o| matches!(o, Err(ReadError::Unreachable(_)))),
                "{out:?}"
            );
        }
    }

    /// Inputs read into the rows of one buffer, in the clear and through
    /// the channel: each payload lands in its row (the other rows' bytes
    /// untouched), its header comes back to be checked; a slot of another
    /// size than its row is not read, a refused read and an unattached
    /// peer fail alone; and over and over, so the connections stay in step.
    #[test]
    fn large_pulls_land_in_their_rows() {
        use crate::transport::{ReadError, ReadReq, SlotHeader, SLOT_HEADER};
        const ROW: usize = 300_000;
        const CAP: u64 = 78;
        for key in [None, Some(ClusterKey::generate())] {
            let tr = Tcp::keyed_with_pull_streams(key, 2).unwrap();
            // Input 3 is of another size; 5 is asked with another capability.
            let inputs: Vec<Vec<u8>> = (0..8u64)
                .map(|t| {
                    let n = if t == 3 { ROW - 8 } else { ROW };
                    (0..n).map(|i| (i as u64 * 13 + t * 7) as u8).collect()
                })
                .collect();
            let (_srv, rd, mut reqs) = served(&tr, &inputs, CAP, 5);
            // And one from a peer not attached.
            reqs.push(ReadReq { peer: 9, ..reqs[0] });
            for round in 0..3u8 {
                let mut buf = vec![0xC3 ^ round; ROW * reqs.len()];
                let mut rows: Vec<&mut [u8]> = buf.chunks_exact_mut(ROW).collect();
                let (out, in_place, _) =
                    rd.read_many_rows(&reqs, Duration::from_secs(5), Vec::new(), &mut rows);
                assert!(in_place, "read straight into the rows");
                for (t, o) in out.iter().enumerate() {
                    let row = &buf[t * ROW..(t + 1) * ROW];
                    match t {
                        3 => assert_eq!(*o, Err(ReadError::OutOfBounds)),
                        5 => assert_eq!(*o, Err(ReadError::Denied)),
                        8 => assert!(matches!(o, Err(ReadError::Unreachable(_))), "{o:?}"),
                        _ => {
                            let head = o.as_ref().unwrap();
                            assert_eq!(SlotHeader::check_head(head, t as u64, CAP), Ok(ROW));
                            assert!(row == &inputs[t][..], "input {t} in its row");
                            continue;
                        }
                    }
                    assert!(row.iter().all(|&b| b == 0xC3 ^ round), "row {t} untouched");
                }
                assert_eq!(SLOT_HEADER + ROW, reqs[0].len as usize);
            }
        }
    }

    /// A region server that answers a read with its header and part of its
    /// slot, then stalls: the call that reads it into a row times out, waits
    /// a grace for the answer under way, then breaks the connection and
    /// returns only once nothing writes the row; the peer's reads fail
    /// after.
    #[test]
    fn a_row_read_that_stalls_mid_answer_ends_and_lets_its_row_go() {
        use crate::transport::region_wire::{self as rw, AnswerHeader, ST_OK};
        use crate::transport::{ReadError, ReadReq, SLOT_HEADER};
        use std::io::{Read, Write};
        const ROW: usize = 200_000;
        let lis = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = lis.local_addr().unwrap().to_string();
        let server = std::thread::spawn(move || {
            let (mut s, _) = lis.accept().unwrap();
            let mut hello = [0u8; rw::HELLO_LEN];
            s.read_exact(&mut hello).unwrap();
            s.write_all(&rw::welcome(ST_OK, 1 << 20)).unwrap();
            let mut req = [0u8; rw::REQ_LEN];
            s.read_exact(&mut req).unwrap();
            let req = rw::Request::decode(&req);
            let head = AnswerHeader {
                id: req.id,
                status: ST_OK,
                len: req.len,
            };
            s.write_all(&head.encode()).unwrap();
            s.write_all(&vec![1u8; SLOT_HEADER + ROW / 2]).unwrap();
            // Stalls with the answer half sent, until the reader gives up.
            let mut rest = Vec::new();
            let _ = s.read_to_end(&mut rest);
        });
        let tr = Tcp::new().unwrap();
        let rd = tr.reader().unwrap();
        let info = crate::wire::RegionInfo {
            addr,
            region: 0,
            len: 1 << 20,
            rkey: 0,
            base: 0,
        };
        rd.attach(0, &info).unwrap();
        let req = ReadReq {
            peer: 0,
            offset: 0,
            len: (SLOT_HEADER + ROW) as u32,
            cap: 1,
        };
        let mut buf = vec![0u8; ROW];
        let t0 = std::time::Instant::now();
        let (out, _, _) = rd.read_many_rows(
            &[req],
            Duration::from_millis(100),
            Vec::new(),
            &mut [&mut buf[..]],
        );
        let took = t0.elapsed();
        assert_eq!(out, vec![Err(ReadError::Timeout)]);
        assert!(
            took >= Duration::from_millis(1000) && took < Duration::from_secs(10),
            "returned after {took:?}"
        );
        assert!(buf[..ROW / 2].iter().all(|&b| b == 1), "the half that came");
        let (out, _, _) = rd.read_many_rows(
            &[req],
            Duration::from_millis(100),
            Vec::new(),
            &mut [&mut buf[..]],
        );
        assert!(matches!(out[0], Err(ReadError::Unreachable(_))), "{out:?}");
        drop(rd);
        server.join().unwrap();
    }

    /// Large inputs (written from the message, after the frame's head) and
    /// small messages between them arrive whole and in order, in the clear
    /// and through the channel.
    #[test]
    fn large_inputs_and_small_messages_arrive_in_order() {
        use crate::transport::Event;
        use crate::wire::Msg;
        let t = Duration::from_secs(5);
        for key in [None, Some(ClusterKey::generate())] {
            let tr = Tcp::keyed(key).unwrap();
            let (stx, srx) = crate::transport::event_channel();
            let l = tr.listen("127.0.0.1:0", stx).unwrap();
            let (ctx, _crx) = crate::transport::event_channel();
            let c = tr.connect(&l.local_addr(), ctx).unwrap();
            assert!(matches!(srx.recv_timeout(t).unwrap(), Event::Accepted(_)));
            let sent: Vec<Msg> = (0..12u64)
                .map(|i| {
                    if i % 3 == 2 {
                        return Msg::ListModels;
                    }
                    let n = if i % 2 == 0 { 602_112 } else { 100 };
                    Msg::Infer {
                        req: i,
                        model: format!("m{i}"),
                        slo: crate::core::Dur(i as i64),
                        input: (0..n)
                            .map(|k| (k as u64 * 7 + i) as u8)
                            .collect::<Vec<u8>>()
                            .into(),
                    }
                })
                .collect();
            // Twice: the second time the reader's frame buffers are taken
            // back, every other message held meanwhile (its bytes must not be
            // read over while it lives).
            let mut held = Vec::new();
            for round in 0..2 {
                for m in &sent {
                    c.send(m.clone()).unwrap();
                }
                for (i, m) in sent.iter().enumerate() {
                    match srx.recv_timeout(t).unwrap() {
                        Event::Msg(_, got) => {
                            assert!(got == *m, "{} changed", m.kind());
                            if (i + round) % 2 == 0 {
                                held.push((got, m));
                            }
                        }
                        _ => panic!("a message was expected"),
                    }
                }
            }
            for (got, m) in &held {
                assert!(got == *m, "a held {} was read over", m.kind());
            }
        }
    }

    /// A malformed frame closes its connection, and the peer is told why
    /// with an `Error` first.
    #[test]
    fn a_malformed_frame_gets_an_error_then_the_end() {
        use std::io::{Read, Write};
        let tr = Tcp::new().unwrap();
        let (tx, rx) = crate::transport::event_channel();
        let l = tr.listen("127.0.0.1:0", tx).unwrap();
        let mut s = std::net::TcpStream::connect(l.local_addr()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        // A 3-byte frame whose kind is no message's.
        s.write_all(&[3, 0, 0, 0, 0xee, 1, 2]).unwrap();
        let mut got = Vec::new();
        s.read_to_end(&mut got).unwrap();
        assert!(got.len() > 4, "an answer came: {got:?}");
        let len = u32::from_le_bytes(got[..4].try_into().unwrap()) as usize;
        match crate::wire::decode(&got[4..4 + len]).unwrap() {
            crate::wire::Msg::Error { message } => {
                assert!(message.contains("bad frame"), "{message}")
            }
            m => panic!("not an Error: {m:?}"),
        }
        assert_eq!(got.len(), 4 + len, "then the end");
        assert!(matches!(
            rx.recv_timeout(Duration::from_secs(5)).unwrap(),
            crate::transport::Event::Accepted(_)
        ));
    }

    #[test]
    fn bind_and_connect_errors_name_the_address() {
        let tr = Tcp::new().unwrap();
        let (tx, _rx) = crate::transport::event_channel();
        let l = tr.listen("127.0.0.1:0", tx.clone()).unwrap();
        let e = tr.listen(&l.local_addr(), tx.clone()).err().unwrap();
        assert!(format!("{e:#}").contains(&l.local_addr()), "{e:#}");
        let addr = l.local_addr();
        drop(l);
        // Let the accept task see the abort and close the socket.
        let mut refused = None;
        for _ in 0..100 {
            match tr.connect(&addr, tx.clone()) {
                Err(e) => {
                    refused = Some(e);
                    break;
                }
                Ok(c) => {
                    c.close("test");
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        }
        let e = refused.expect("a dropped listener stops accepting");
        assert!(format!("{e:#}").contains(&addr), "{e:#}");
        let e = tr.listen("not an address", tx).err().unwrap();
        assert!(format!("{e:#}").contains("not an address"), "{e:#}");
    }
}
