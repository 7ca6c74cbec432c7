//! The TCP transport over real loopback sockets: control connections (order,
//! batching, close, garbage on the wire, a stalled peer) and one-sided region reads
//! (several servers, bounds, detach, a server going away, timeouts).

use crossbeam_channel::Receiver;
use fermata::transport::event_channel;
use fermata::transport::tcp::Tcp;
use fermata::transport::{
    Conn, ConnId, Event, ReadError, ReadReq, Region, SendError, SlotHeader, Transport, PROBE_CAP,
};
use fermata::wire::{Dur, Msg, Time};
use std::io::{Read, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(10);

/// One end of a connection and its events.
type End = (Arc<dyn Conn>, Receiver<Event>);

/// A listener and one connection to it: (client, its events), (server side, its events).
fn pair(tr: &Tcp) -> (End, End) {
    let (stx, srx) = event_channel();
    let l = tr.listen("127.0.0.1:0", stx).unwrap();
    let (ctx, crx) = event_channel();
    let c = tr.connect(&l.local_addr(), ctx).unwrap();
    let Event::Accepted(s) = srx.recv_timeout(T).unwrap() else {
        panic!("expected Accepted")
    };
    // The listener may go: accepted connections live on.
    drop(l);
    ((c, crx), (s, srx))
}

fn ping(seq: u64) -> Msg {
    Msg::Ping {
        seq,
        sent: Time(seq as i64 * 3),
        ctrl_delay: Dur::ZERO,
        pull: Dur::ZERO,
        pull_per_mib: Dur::ZERO,
        pull_hold: Dur::ZERO,
        pull_hold_per_mib: Dur::ZERO,
        term: 0,
    }
}

fn recv_msg(rx: &Receiver<Event>, conn: ConnId) -> Msg {
    match rx.recv_timeout(T).expect("an event") {
        Event::Msg(id, m) => {
            assert_eq!(id, conn);
            m
        }
        Event::Closed(_, r) => panic!("closed: {r}"),
        Event::Accepted(_) => panic!("unexpected Accepted"),
    }
}

fn recv_closed(rx: &Receiver<Event>, conn: ConnId) -> String {
    loop {
        match rx.recv_timeout(T).expect("Closed") {
            Event::Closed(id, r) => {
                assert_eq!(id, conn);
                return r;
            }
            Event::Msg(..) => continue,
            Event::Accepted(_) => panic!("unexpected Accepted"),
        }
    }
}

fn assert_quiet(rx: &Receiver<Event>) {
    if let Ok(e) = rx.recv_timeout(Duration::from_millis(200)) {
        let what = match e {
            Event::Accepted(_) => "Accepted".to_string(),
            Event::Msg(_, m) => format!("Msg {}", m.kind()),
            Event::Closed(_, r) => format!("Closed({r})"),
        };
        panic!("expected no more events, got {what}");
    }
}

#[test]
fn messages_both_ways_in_order() {
    let tr = Tcp::new().unwrap();
    let ((c, crx), (s, srx)) = pair(&tr);
    assert_ne!(c.id(), s.id());
    for i in 0..1000 {
        c.send(ping(i)).unwrap();
        s.send(Msg::Pong {
            seq: i,
            echo: Time(1),
            sched: Time(2),
            term: 1,
        })
        .unwrap();
    }
    for i in 0..1000 {
        assert_eq!(recv_msg(&srx, s.id()), ping(i));
        match recv_msg(&crx, c.id()) {
            Msg::Pong { seq, .. } => assert_eq!(seq, i),
            m => panic!("got {}", m.kind()),
        }
    }
    // The peer names are real socket addresses.
    assert!(c.peer().starts_with("127.0.0.1:"), "{}", c.peer());
    assert!(s.peer().starts_with("127.0.0.1:"), "{}", s.peer());
}

#[test]
fn many_messages_batched_large_and_small() {
    let tr = Tcp::new().unwrap();
    let ((c, _crx), (s, srx)) = pair(&tr);
    let n = 50_000u64;
    let big = |i: u64| Msg::Infer {
        req: i,
        model: "resnet".into(),
        slo: Dur::ZERO,
        input: vec![(i % 251) as u8; 150 * 1024].into(),
    };
    let t0 = Instant::now();
    for i in 0..n {
        let m = if i % 1000 == 0 { big(i) } else { ping(i) };
        c.send(m).unwrap();
    }
    for i in 0..n {
        let m = recv_msg(&srx, s.id());
        if i % 1000 == 0 {
            assert_eq!(m, big(i));
        } else {
            assert_eq!(m, ping(i));
        }
    }
    eprintln!("{n} messages in {:?}", t0.elapsed());
}

#[test]
fn close_is_seen_once_on_both_sides() {
    let tr = Tcp::new().unwrap();
    // Client closes.
    let ((c, crx), (s, srx)) = pair(&tr);
    c.send(ping(1)).unwrap();
    c.close("done");
    assert_eq!(recv_closed(&crx, c.id()), "done");
    // What was sent before the close arrives, then the end.
    assert_eq!(recv_msg(&srx, s.id()), ping(1));
    let r = recv_closed(&srx, s.id());
    assert!(r.contains("peer closed"), "{r}");
    c.close("again");
    s.close("too late");
    assert_quiet(&crx);
    assert_quiet(&srx);
    assert!(matches!(c.send(ping(2)), Err(SendError::Closed(r)) if r == "done"));
    assert!(matches!(s.send(ping(2)), Err(SendError::Closed(_))));

    // Server closes.
    let ((c, crx), (s, srx)) = pair(&tr);
    s.close("bye");
    assert_eq!(recv_closed(&srx, s.id()), "bye");
    recv_closed(&crx, c.id());
    assert_quiet(&crx);
    assert_quiet(&srx);

    // Both at once.
    let ((c, crx), (s, srx)) = pair(&tr);
    let t = std::thread::spawn({
        let c = c.clone();
        move || c.close("left")
    });
    s.close("right");
    t.join().unwrap();
    recv_closed(&crx, c.id());
    recv_closed(&srx, s.id());
    assert_quiet(&crx);
    assert_quiet(&srx);
}

#[test]
fn garbage_closes_only_its_connection() {
    let tr = Tcp::new().unwrap();
    let (stx, srx) = event_channel();
    let l = tr.listen("127.0.0.1:0", stx).unwrap();
    let (ctx, _crx) = event_channel();
    let good = tr.connect(&l.local_addr(), ctx).unwrap();
    let Event::Accepted(good_s) = srx.recv_timeout(T).unwrap() else {
        panic!("accept")
    };

    // A frame that does not decode; then one announcing more than MAX_FRAME.
    let bad_frame: &[u8] = &[5, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff];
    let huge: &[u8] = b"GARBAGE GARBAGE";
    for (bytes, why) in [(bad_frame, "bad frame"), (huge, "over the limit")] {
        let mut raw = std::net::TcpStream::connect(l.local_addr()).unwrap();
        raw.write_all(bytes).unwrap();
        let Event::Accepted(bad_s) = srx.recv_timeout(T).unwrap() else {
            panic!("accept")
        };
        let reason = recv_closed(&srx, bad_s.id());
        assert!(reason.contains(why), "{reason}");
        // The server says why in an Error, then shuts the socket: the raw
        // peer reads the Error, then EOF.
        raw.set_read_timeout(Some(T)).unwrap();
        let mut got = Vec::new();
        raw.read_to_end(&mut got).unwrap();
        let len = u32::from_le_bytes(got[..4].try_into().unwrap()) as usize;
        match fermata::wire::decode(&got[4..4 + len]) {
            Ok(fermata::wire::Msg::Error { message }) => {
                assert!(message.contains(why), "{message}")
            }
            other => panic!("not an Error: {other:?}"),
        }
        assert_eq!(got.len(), 4 + len, "then EOF");
        assert!(bad_s.send(ping(0)).is_err());
    }

    // The other connection still works, both ways.
    good.send(ping(7)).unwrap();
    assert_eq!(recv_msg(&srx, good_s.id()), ping(7));
    good_s.send(ping(8)).unwrap();
    assert_eq!(recv_msg(&_crx, good.id()), ping(8));
    // And the listener still accepts.
    let (ctx2, _crx2) = event_channel();
    let other = tr.connect(&l.local_addr(), ctx2).unwrap();
    let Event::Accepted(other_s) = srx.recv_timeout(T).unwrap() else {
        panic!("accept")
    };
    other.send(ping(9)).unwrap();
    assert_eq!(recv_msg(&srx, other_s.id()), ping(9));
}

#[test]
fn send_queue_fills_when_the_peer_stalls() {
    let tr = Tcp::new().unwrap();
    // A peer that accepts and never reads.
    let raw = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = raw.local_addr().unwrap().to_string();
    let (ctx, crx) = event_channel();
    let c = tr.connect(&addr, ctx).unwrap();
    let (_held, _) = raw.accept().unwrap();
    let mut full = false;
    for i in 0..5_000_000u64 {
        match c.send(ping(i)) {
            Ok(()) => {}
            Err(SendError::Full) => {
                full = true;
                break;
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert!(full, "a stalled peer must fill the queue");
    // Closing does not hang on the stalled peer.
    let t0 = Instant::now();
    c.close("stalled");
    assert_eq!(recv_closed(&crx, c.id()), "stalled");
    assert!(t0.elapsed() < Duration::from_secs(1));
}

#[test]
fn dropping_the_transport_handle_keeps_connections() {
    let tr = Tcp::new().unwrap();
    let ((c, _crx), (s, srx)) = pair(&tr);
    drop(tr);
    c.send(ping(3)).unwrap();
    assert_eq!(recv_msg(&srx, s.id()), ping(3));
}

// ---------------------------------------------------------------------------
// Region reads

/// A region with `n` slots of `size` payload bytes; task ids 100 + i.
fn region(id: u32, n: usize, size: usize) -> (Arc<Region>, Vec<ReadReq>) {
    let reg = Arc::new(Region::new(id, ((size + 64) * n + 4096) as u64).unwrap());
    let reqs = (0..n)
        .map(|i| {
            let payload: Vec<u8> = (0..size).map(|j| (i * 7 + j + id as usize) as u8).collect();
            let r = reg.put(100 + i as u64, cap_of(i), &payload).unwrap();
            ReadReq {
                peer: 0,
                offset: r.offset,
                len: r.len,
                cap: cap_of(i),
            }
        })
        .collect();
    (reg, reqs)
}

/// Slot `i`'s read capability.
fn cap_of(i: usize) -> u64 {
    1000 + i as u64
}

fn check_slot(out: &Result<Vec<u8>, ReadError>, region: u32, i: usize, size: usize) {
    let bytes = out.as_ref().expect("read ok");
    let payload = SlotHeader::check(bytes, 100 + i as u64, cap_of(i)).unwrap();
    assert_eq!(payload.len(), size);
    assert!(payload
        .iter()
        .enumerate()
        .all(|(j, &b)| b == (i * 7 + j + region as usize) as u8));
}

#[test]
fn region_reads_from_two_servers() {
    let tr = Tcp::new().unwrap();
    let size = 150 * 1024;
    let (r1, q1) = region(1, 12, size);
    let (r2, q2) = region(2, 12, size);
    let s1 = tr.serve_region(r1.clone(), "127.0.0.1:0").unwrap();
    let s2 = tr.serve_region(r2.clone(), "127.0.0.1:0").unwrap();
    let info = s1.info();
    assert_eq!(
        (info.region, info.len, info.rkey, info.base),
        (1, r1.len(), 0, 0)
    );
    assert!(!info.addr.ends_with(":0"));
    let rd = tr.reader().unwrap();
    rd.attach(10, &s1.info()).unwrap();
    rd.attach(20, &s2.info()).unwrap();

    // Interleaved over both peers, with a bad one in the middle.
    let mut reqs = Vec::new();
    let mut expect = Vec::new();
    for i in 0..12 {
        reqs.push(ReadReq { peer: 10, ..q1[i] });
        expect.push(Some((1, i)));
        reqs.push(ReadReq { peer: 20, ..q2[i] });
        expect.push(Some((2, i)));
        if i == 5 {
            reqs.push(ReadReq {
                peer: 20,
                offset: r2.len() - 10,
                len: 11,
                cap: cap_of(i),
            });
            expect.push(None);
        }
    }
    let out = rd.read_many(&reqs, T);
    assert_eq!(out.len(), reqs.len());
    for (o, e) in out.iter().zip(&expect) {
        match e {
            Some((reg, i)) => check_slot(o, *reg, *i, size),
            None => assert_eq!(o, &Err(ReadError::OutOfBounds)),
        }
    }

    // Several threads on one reader at once.
    std::thread::scope(|sc| {
        for t in 0..4 {
            let rd = rd.clone();
            let (q1, q2) = (&q1, &q2);
            sc.spawn(move || {
                for round in 0..20 {
                    let i = (t + round) % 12;
                    let out = rd.read_many(
                        &[ReadReq { peer: 10, ..q1[i] }, ReadReq { peer: 20, ..q2[i] }],
                        T,
                    );
                    check_slot(&out[0], 1, i, size);
                    check_slot(&out[1], 2, i, size);
                }
            });
        }
    });

    // A zero-length probe and a read past the end computed with overflow.
    let out = rd.read_many(
        &[
            ReadReq {
                peer: 10,
                offset: 0,
                len: 0,
                cap: PROBE_CAP,
            },
            ReadReq {
                peer: 10,
                offset: u64::MAX,
                len: 2,
                cap: cap_of(0),
            },
        ],
        T,
    );
    assert_eq!(out[0], Ok(vec![]));
    assert_eq!(out[1], Err(ReadError::OutOfBounds));

    // Detach: reads of that peer fail, the other peer's still work.
    rd.detach(10);
    let out = rd.read_many(
        &[ReadReq { peer: 10, ..q1[0] }, ReadReq { peer: 20, ..q2[0] }],
        T,
    );
    assert!(
        matches!(out[0], Err(ReadError::Unreachable(_))),
        "{:?}",
        out[0]
    );
    check_slot(&out[1], 2, 0, size);
    // Attach again works (and a timeout too long to add to now means none).
    rd.attach(10, &s1.info()).unwrap();
    check_slot(
        &rd.read_many(&[ReadReq { peer: 10, ..q1[3] }], Duration::MAX)[0],
        1,
        3,
        size,
    );
}

#[test]
fn attach_errors_are_clear() {
    let tr = Tcp::new().unwrap();
    let (r1, _) = region(1, 1, 10);
    let s1 = tr.serve_region(r1, "127.0.0.1:0").unwrap();
    let rd = tr.reader().unwrap();
    let mut wrong = s1.info();
    wrong.region = 9;
    let e = rd.attach(1, &wrong).unwrap_err();
    assert!(
        format!("{e:#}").contains("does not serve region 9"),
        "{e:#}"
    );
    let addr = s1.info().addr;
    drop(s1);
    std::thread::sleep(Duration::from_millis(50));
    let mut gone = wrong.clone();
    gone.region = 1;
    let e = rd.attach(1, &gone).unwrap_err();
    assert!(format!("{e:#}").contains(&addr), "{e:#}");
    let e = tr.serve_region(Arc::new(Region::new(3, 64).unwrap()), "256.0.0.1:1");
    assert!(format!("{:#}", e.err().unwrap()).contains("256.0.0.1:1"));
}

#[test]
fn region_server_dropped_mid_way_fails_reads_quickly() {
    let tr = Tcp::new().unwrap();
    let size = 150 * 1024;
    let (r1, q1) = region(1, 32, size);
    let s1 = tr.serve_region(r1, "127.0.0.1:0").unwrap();
    let rd = tr.reader().unwrap();
    rd.attach(1, &s1.info()).unwrap();
    let reqs: Vec<ReadReq> = q1.iter().map(|q| ReadReq { peer: 1, ..*q }).collect();
    // Readers hammer the server while it goes away.
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|sc| {
        let h = sc.spawn(|| {
            let mut failed = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let t0 = Instant::now();
                let out = rd.read_many(&reqs, T);
                assert!(t0.elapsed() < Duration::from_secs(5), "a read hung");
                for (i, o) in out.iter().enumerate() {
                    match o {
                        Ok(_) => check_slot(o, 1, i, size),
                        Err(ReadError::Unreachable(_)) => failed += 1,
                        Err(e) => panic!("{e}"),
                    }
                }
                if failed > 0 {
                    break;
                }
            }
            failed
        });
        std::thread::sleep(Duration::from_millis(100));
        drop(s1);
        let failed = h.join().unwrap();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(failed > 0);
    });
    let t0 = Instant::now();
    let out = rd.read_many(&reqs, T);
    assert!(t0.elapsed() < Duration::from_secs(1));
    assert!(out
        .iter()
        .all(|o| matches!(o, Err(ReadError::Unreachable(_)))));
}

#[test]
fn read_timeout_is_honored() {
    let tr = Tcp::new().unwrap();
    // A fake region server: greets, then never answers.
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let fake = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut hello = [0u8; 8];
        s.read_exact(&mut hello).unwrap();
        let mut w = Vec::new();
        w.extend_from_slice(&hello[..4]); // magic
        w.extend_from_slice(&0u32.to_le_bytes());
        w.extend_from_slice(&(1u64 << 20).to_le_bytes());
        s.write_all(&w).unwrap();
        // Hold the connection open until the reader goes.
        let mut sink = Vec::new();
        let _ = s.read_to_end(&mut sink);
    });
    let info = fermata::wire::RegionInfo {
        addr,
        region: 4,
        len: 1 << 20,
        rkey: 0,
        base: 0,
    };
    let rd = tr.reader().unwrap();
    rd.attach(1, &info).unwrap();
    let (r2, q2) = region(2, 2, 1000);
    let s2 = tr.serve_region(r2, "127.0.0.1:0").unwrap();
    rd.attach(2, &s2.info()).unwrap();
    let t0 = Instant::now();
    let out = rd.read_many(
        &[
            ReadReq {
                peer: 1,
                offset: 0,
                len: 100,
                cap: 1,
            },
            ReadReq { peer: 2, ..q2[1] },
            ReadReq {
                peer: 1,
                offset: 1 << 20,
                len: 1,
                cap: 1,
            },
        ],
        Duration::from_millis(300),
    );
    let took = t0.elapsed();
    assert!(took >= Duration::from_millis(300), "{took:?}");
    assert!(took < Duration::from_secs(2), "{took:?}");
    assert_eq!(out[0], Err(ReadError::Timeout));
    check_slot(&out[1], 2, 1, 1000);
    assert_eq!(out[2], Err(ReadError::OutOfBounds));
    drop(rd);
    fake.join().unwrap();
}

/// A small event channel that fills up: the reader waits (counted) and loses
/// nothing; closing the connection from the full side's own thread never waits,
/// and `Closed` still comes once, after the messages delivered before it.
#[test]
fn a_full_event_channel_slows_the_reader_and_loses_nothing() {
    let tr = Tcp::new().unwrap();
    let (stx, srx) = event_channel();
    let l = tr.listen("127.0.0.1:0", stx).unwrap();
    let (small, crx) = crossbeam_channel::bounded(4);
    let ctx = fermata::transport::EventTx::from(small);
    let c = tr.connect(&l.local_addr(), ctx.clone()).unwrap();
    let Event::Accepted(s) = srx.recv_timeout(T).unwrap() else {
        panic!("expected Accepted")
    };
    for i in 0..200 {
        s.send(ping(i)).unwrap();
    }
    // Nobody reads: the channel fills and the reader waits.
    let t0 = Instant::now();
    while ctx.full_count() == 0 {
        assert!(t0.elapsed() < T, "the channel never filled");
        std::thread::sleep(Duration::from_millis(5));
    }
    for i in 0..100 {
        assert_eq!(recv_msg(&crx, c.id()), ping(i));
    }
    // Close from "the loop" while the channel may be full again: returns at once.
    let t1 = Instant::now();
    c.close("done");
    assert!(
        t1.elapsed() < Duration::from_secs(1),
        "close waited on the channel"
    );
    let mut next = 100;
    loop {
        match crx.recv_timeout(T).expect("an event") {
            Event::Msg(_, m) => {
                assert_eq!(m, ping(next), "in order, none lost");
                next += 1;
            }
            Event::Closed(id, r) => {
                assert_eq!((id, r.as_str()), (c.id(), "done"));
                break;
            }
            Event::Accepted(_) => panic!("unexpected Accepted"),
        }
    }
    assert!(next <= 200);
    assert!(
        crx.recv_timeout(Duration::from_millis(200)).is_err(),
        "nothing after Closed"
    );
}
