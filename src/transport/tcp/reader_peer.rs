//! The region reader's connection to one attached peer's region server
//! ([`Peer`]): the greeting, the reads waiting for an answer, a writer task that
//! sends pipelined requests and a reader task that reads the answers straight into
//! their buffers and completes them in their [`Batch`]es.

use super::net::{connect_std, quick_ack, QUICK_ACK_FROM};
use super::options::{ANSWER_BUF, CONNECT_TIMEOUT};
use super::reader::Batch;
use super::runtime::{stopped, Inner};
use crate::transport::auth::{Channel, Service};
use crate::transport::region_wire::{self as rw, AnswerHeader, ANS_LEN, ST_DENIED, ST_OK};
use crate::transport::secure_io::{self, SecureRead, SecureStd, SecureWrite};
use crate::transport::{ReadError, SLOT_HEADER};
use crate::wire::RegionInfo;
use anyhow::Context as _;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::{mpsc, watch};

/// A read sent and not answered yet.
pub(super) struct Pending {
    pub(super) idx: usize,
    pub(super) len: u32,
    /// Where the answer's bytes go.
    pub(super) dest: Dest,
    pub(super) batch: Arc<Batch>,
}

/// Where a read's answer is read to.
pub(super) enum Dest {
    /// A buffer of capacity `len`, handed back with the answer.
    Buf(Vec<u8>),
    /// A row the caller lent: the slot's header is handed back, the rest
    /// read into the row.
    Row(Row),
}

/// A row of the caller's memory that one read's payload is read into
/// ([`super::reader::TcpReader`]'s `read_many_rows`). The caller lent it
/// for the call only: while a `Row` lives its batch counts it as held, and
/// the call does not return until no row of its batch is held, so the
/// memory is neither freed nor read while a reader task writes it.
pub(super) struct Row {
    ptr: *mut u8,
    len: usize,
    batch: Arc<Batch>,
}

// SAFETY: a Row is the only way to the bytes it points to while it lives
// (the caller's `&mut` borrow outlives every Row made from it; see above),
// so moving it to a reader task's thread is moving that exclusive access.
unsafe impl Send for Row {}

impl Row {
    /// A row of `row` for a read of `batch`, held until dropped.
    pub(super) fn new(row: &mut [u8], batch: &Arc<Batch>) -> Row {
        batch.hold_row();
        Row {
            ptr: row.as_mut_ptr(),
            len: row.len(),
            batch: batch.clone(),
        }
    }

    fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` and `len` came from a `&mut [u8]` that stays
        // borrowed, untouched by anything else, while this Row lives (see
        // the type's comment); the slice borrows the Row.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for Row {
    fn drop(&mut self) {
        self.batch.release_row();
    }
}

#[derive(Default)]
pub(super) struct PeerState {
    pub(super) pending: HashMap<u64, Pending>,
    /// Why the connection is unusable (broken or detached).
    pub(super) broken: Option<String>,
}

pub(super) struct Peer {
    pub(super) addr: String,
    pub(super) region_len: u64,
    pub(super) state: Mutex<PeerState>,
    /// Encoded requests for the writer task.
    pub(super) requests: mpsc::UnboundedSender<Vec<u8>>,
    stop: watch::Sender<bool>,
}

impl Peer {
    /// Marks the connection unusable and fails every read waiting on it.
    pub(super) fn fail(&self, reason: String) {
        let mut st = self.state.lock().expect("peer lock");
        let reason = st.broken.get_or_insert(reason).clone();
        for (_, p) in st.pending.drain() {
            p.batch
                .complete(p.idx, Err(ReadError::Unreachable(reason.clone())));
        }
        drop(st);
        self.stop.send_replace(true);
    }

    /// Connects to the region server `info` names, checks it serves the region and
    /// starts the connection's two tasks on `inner`'s runtime.
    pub(super) fn connect(inner: &Inner, info: &RegionInfo) -> anyhow::Result<Arc<Peer>> {
        let addr = &info.addr;
        let (s, ch, len) = greet(inner, info)?;
        s.set_nonblocking(true)?;
        let stream = inner
            .stream(s)
            .with_context(|| format!("registering the socket to `{addr}`"))?;
        let (rd, wr) = stream.into_split();
        let (opener, sealer) = secure_io::split(ch);
        let (rd, wr) = (SecureRead::new(rd, opener), SecureWrite::new(wr, sealer));
        let (requests, req_rx) = mpsc::unbounded_channel();
        let (stop, stop_rx) = watch::channel(false);
        let peer = Arc::new(Peer {
            addr: addr.clone(),
            region_len: len,
            state: Mutex::new(PeerState::default()),
            requests,
            stop,
        });
        inner
            .handle
            .spawn(peer_writer(peer.clone(), wr, req_rx, stop_rx.clone()));
        inner.handle.spawn(peer_reader(peer.clone(), rd, stop_rx));
        Ok(peer)
    }
}

/// Connects (blocking) and greets the region server; the socket (timeouts off
/// again), its channel and the region's length.
fn greet(
    inner: &Inner,
    info: &RegionInfo,
) -> anyhow::Result<(std::net::TcpStream, Option<Channel>, u64)> {
    use std::io::{Read, Write};
    let addr = &info.addr;
    let mut s = connect_std(addr).context("attaching a region")?;
    let ch = inner.authenticate_std(&mut s, addr, Service::Region)?;
    s.set_read_timeout(Some(CONNECT_TIMEOUT))?;
    s.set_write_timeout(Some(CONNECT_TIMEOUT))?;
    let mut welcome = [0u8; rw::WELCOME_LEN];
    let (s, ch) = match ch {
        Some(ch) => {
            let mut ss = SecureStd::new(s, ch);
            ss.write_all(&rw::hello(info.region))
                .and_then(|_| ss.read_exact(&mut welcome))
                .with_context(|| format!("greeting the region server at `{addr}`"))?;
            let (s, ch) = ss
                .into_parts()
                .with_context(|| format!("greeting the region server at `{addr}`"))?;
            (s, Some(ch))
        }
        None => {
            s.write_all(&rw::hello(info.region))
                .and_then(|_| s.read_exact(&mut welcome))
                .with_context(|| format!("greeting the region server at `{addr}`"))?;
            (s, None)
        }
    };
    let (status, len) =
        rw::parse_welcome(&welcome).map_err(|e| anyhow::anyhow!("`{addr}`: {e}"))?;
    if status != ST_OK {
        anyhow::bail!(
            "the region server at `{addr}` does not serve region {}",
            info.region
        );
    }
    s.set_read_timeout(None)?;
    s.set_write_timeout(None)?;
    Ok((s, ch, len))
}

async fn peer_writer(
    peer: Arc<Peer>,
    mut wr: SecureWrite<OwnedWriteHalf>,
    mut requests: mpsc::UnboundedReceiver<Vec<u8>>,
    mut stop: watch::Receiver<bool>,
) {
    let work = async {
        let mut buf = Vec::new();
        while let Some(first) = requests.recv().await {
            buf.clear();
            buf.extend_from_slice(&first);
            while let Ok(more) = requests.try_recv() {
                buf.extend_from_slice(&more);
            }
            if let Err(e) = wr.write_all(&buf).await {
                peer.fail(format!(
                    "sending read requests to the region server at {} failed: {e}",
                    peer.addr
                ));
                return;
            }
        }
    };
    tokio::select! {
        _ = stopped(&mut stop) => {}
        _ = work => {}
    }
    let _ = wr.shutdown().await;
}

async fn peer_reader(
    peer: Arc<Peer>,
    rd: SecureRead<OwnedReadHalf>,
    mut stop: watch::Receiver<bool>,
) {
    let reason = tokio::select! {
        _ = stopped(&mut stop) => return,
        r = read_answers(&peer, rd) => r,
    };
    peer.fail(reason);
}

type Answers = BufReader<SecureRead<OwnedReadHalf>>;

/// The reason when the region server closed the connection.
fn closed(peer: &Peer) -> String {
    format!("the region server at {} closed the connection", peer.addr)
}

/// The reason when reading from the region server failed.
fn failed(peer: &Peer, e: &std::io::Error) -> String {
    format!(
        "reading from the region server at {} failed: {e}",
        peer.addr
    )
}

/// Why reading from the region server stopped with `e`: it closed the
/// connection (an end of the stream) or the read failed.
fn ended(peer: &Peer, e: &std::io::Error) -> String {
    if e.kind() == std::io::ErrorKind::UnexpectedEof {
        closed(peer)
    } else {
        failed(peer, e)
    }
}

/// Reads answers until the connection ends; the reason it ended.
async fn read_answers(peer: &Peer, rd: SecureRead<OwnedReadHalf>) -> String {
    let mut rd = BufReader::with_capacity(ANSWER_BUF, rd);
    let mut hdr = [0u8; ANS_LEN];
    loop {
        if let Err(e) = rd.read_exact(&mut hdr).await {
            return ended(peer, &e);
        }
        let AnswerHeader { id, status, len } = AnswerHeader::decode(&hdr);
        if len as usize >= QUICK_ACK_FROM {
            quick_ack(rd.get_ref().get_ref().as_ref());
        }
        let p = peer.state.lock().expect("peer lock").pending.remove(&id);
        if status != ST_OK {
            if let Some(p) = p {
                let e = if status == ST_DENIED {
                    ReadError::Denied
                } else {
                    ReadError::OutOfBounds
                };
                p.batch.complete(p.idx, Err(e));
            }
            continue;
        }
        let res = match p {
            Some(p) => receive_answer(peer, &mut rd, p, len).await,
            // Its read timed out (or was detached): skip the bytes.
            None => skip_answer(peer, &mut rd, len).await,
        };
        if let Err(reason) = res {
            return reason;
        }
    }
}

/// Reads the `len` bytes of `p`'s answer into its buffer and completes it; Err:
/// why the connection is unusable now (`p` failed with it).
async fn receive_answer(peer: &Peer, rd: &mut Answers, p: Pending, len: u32) -> Result<(), String> {
    if p.len != len {
        p.batch
            .complete(p.idx, Err(ReadError::Unreachable("protocol error".into())));
        return Err(format!(
            "region server at {} answered {len} bytes for a read of {}",
            peer.addr, p.len
        ));
    }
    let res = match p.dest {
        // The buffer's initialized bytes (a recycled buffer's, see
        // `TcpReader::send_on`) are read over, so that the channel reads and
        // opens records straight into them; a new buffer is zeroed first.
        Dest::Buf(mut buf) => {
            buf.truncate(len as usize);
            read_into(rd, &mut buf, len as usize).await.map(|()| buf)
        }
        Dest::Row(mut row) => {
            let mut head = [0u8; SLOT_HEADER];
            // The slot's header, then its payload straight into the row
            // (the region server seals the header with the answer's, so
            // the payload's records begin on their own).
            match rd.read_exact(&mut head).await {
                Ok(_) => read_slice(rd, row.bytes()).await.map(|()| head.to_vec()),
                Err(e) => Err(e),
            }
        }
    };
    match res {
        Ok(got) => {
            p.batch.complete(p.idx, Ok(got));
            Ok(())
        }
        Err(e) => {
            let reason = ended(peer, &e);
            p.batch
                .complete(p.idx, Err(ReadError::Unreachable(reason.clone())));
            Err(reason)
        }
    }
}

/// Reads `len` bytes into `buf`, over the bytes it holds (grown to `len`,
/// the growth zeroed): see [`read_slice`].
async fn read_into(rd: &mut Answers, buf: &mut Vec<u8>, len: usize) -> std::io::Result<()> {
    buf.resize(len, 0);
    read_slice(rd, &mut buf[..len]).await
}

/// Fills `buf`: with what the buffered reader holds first, then from the
/// channel, which reads a large record straight into `buf` and opens it
/// there ([`SecureRead::read_direct`]). An end of the stream before it is
/// full: `UnexpectedEof`.
async fn read_slice(rd: &mut Answers, buf: &mut [u8]) -> std::io::Result<()> {
    let len = buf.len();
    let held = rd.buffer();
    let mut at = held.len().min(len);
    buf[..at].copy_from_slice(&held[..at]);
    tokio::io::AsyncBufReadExt::consume(rd, at);
    // Past what it held, the buffered reader is empty: reading past it
    // loses nothing.
    let ch = rd.get_mut();
    while at < len {
        let n = ch.read_direct(&mut buf[at..]).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        at += n;
    }
    Ok(())
}

/// Skips the `len` bytes of an answer nobody waits for.
async fn skip_answer(peer: &Peer, rd: &mut Answers, len: u32) -> Result<(), String> {
    let mut skip = (&mut *rd).take(len as u64);
    match tokio::io::copy(&mut skip, &mut tokio::io::sink()).await {
        Ok(n) if n == len as u64 => Ok(()),
        Ok(_) => Err(closed(peer)),
        Err(e) => Err(failed(peer, &e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::auth::tests::channel_pair;

    /// Answers as the region server writes them (a header, then a large
    /// slot sealed on its own, or a small one with its header) come back
    /// whole through `read_into`, over buffers holding other bytes or none,
    /// and the large slots' records are read straight into the buffers.
    #[test]
    fn answers_are_read_straight_into_their_buffers() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()
            .unwrap();
        rt.block_on(async {
            let (d, l) = channel_pair();
            let lis = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = lis.local_addr().unwrap();
            let client = tokio::net::TcpStream::connect(addr).await.unwrap();
            let (server, _) = lis.accept().await.unwrap();
            let lens = [602_128usize, 100, 150_560, 70_000, 3];
            let slot = |i: usize, n: usize| -> Vec<u8> {
                (0..n).map(|x| (x * 31 + i * 7) as u8).collect()
            };
            let writer = tokio::spawn(async move {
                let (_r, w) = server.into_split();
                let mut w = SecureWrite::new(w, Some(d.sealer));
                for (i, &n) in lens.iter().enumerate() {
                    let h = AnswerHeader {
                        id: i as u64,
                        status: ST_OK,
                        len: n as u32,
                    }
                    .encode();
                    let body = slot(i, n);
                    if n >= 64 << 10 {
                        // The answer's header with the slot's, then the
                        // payload on its own (as the region server seals).
                        let mut first = h.to_vec();
                        first.extend_from_slice(&body[..SLOT_HEADER]);
                        w.seal_now(&first).unwrap();
                        w.seal_now(&body[SLOT_HEADER..]).unwrap();
                    } else {
                        let mut both = h.to_vec();
                        both.extend_from_slice(&body);
                        w.write_all(&both).await.unwrap();
                    }
                }
                w.flush().await.unwrap();
                w
            });
            let (r, _w) = client.into_split();
            let mut rd = BufReader::with_capacity(ANSWER_BUF, SecureRead::new(r, Some(l.opener)));
            let mut hdr = [0u8; ANS_LEN];
            for (i, &n) in lens.iter().enumerate() {
                rd.read_exact(&mut hdr).await.unwrap();
                let h = AnswerHeader::decode(&hdr);
                assert_eq!((h.id, h.len as usize), (i as u64, n));
                // A recycled buffer holding other bytes, or a new one.
                let mut buf = if i % 2 == 0 {
                    vec![0xEE; n / 2]
                } else {
                    Vec::new()
                };
                read_into(&mut rd, &mut buf, n).await.unwrap();
                assert!(buf == slot(i, n), "answer {i} came back changed");
            }
            let direct = rd.get_ref().records_direct();
            // Past the slots' headers, 602,096, 150,528 and 69,968 bytes:
            // 9, 3 and 1 records of 16 KiB and more, each read straight into
            // its buffer unless it was whole in the channel's buffer already
            // (then opened from there into its buffer, one pass too).
            assert!(direct >= 10, "{direct} records read straight");
            drop(writer.await.unwrap());
        });
    }
}
