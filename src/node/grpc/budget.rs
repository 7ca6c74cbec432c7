//! gRPC messages in the frontend's buffered-bytes budget ([`BodyBudget`],
//! shared with the HTTP server): every request body passes through
//! [`Budgeted`], which takes each chunk's bytes before tonic buffers them and
//! gives a message's bytes back once it is whole (tonic decodes it at once).
//! So a message being received counts from its first byte; one that does not
//! fit gets UNAVAILABLE, and one that stopped arriving gives way when others
//! need the room (UNAVAILABLE, its stream ends), as an HTTP body does.

use crate::node::http::body_budget::Held;
use crate::node::http::BodyBudget;
use hyper::body::{Body as HttpBody, Frame};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tonic::codegen::{http, Bytes, Service};
use tonic::server::NamedService;
use tonic::Status;

/// A gRPC service whose request bodies are held to a [`BodyBudget`].
#[derive(Clone)]
pub(super) struct Budgeted<S> {
    pub(super) inner: S,
    pub(super) budget: Arc<BodyBudget>,
}

impl<S: NamedService> NamedService for Budgeted<S> {
    const NAME: &'static str = S::NAME;
}

impl<S> Service<http::Request<tonic::body::Body>> for Budgeted<S>
where
    S: Service<http::Request<tonic::body::Body>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        let held = self.budget.hold();
        self.inner.call(req.map(|b| {
            tonic::body::Body::new(BudgetedBody {
                inner: b,
                held,
                framing: Framing::default(),
                waiting: None,
            })
        }))
    }
}

/// Where the stream is in its length-prefixed messages (1 flag byte, 4 bytes
/// of length, the message).
#[derive(Debug, Default)]
struct Framing {
    header: [u8; 5],
    header_len: usize,
    /// Bytes of the current message received (its header included).
    got: usize,
    /// Its size with the header, once the header is whole.
    size: Option<usize>,
}

impl Framing {
    /// Takes `data`; the bytes of the messages it made whole.
    fn feed(&mut self, mut data: &[u8]) -> usize {
        let mut whole = 0;
        while !data.is_empty() {
            let size = match self.size {
                Some(s) => s,
                None => {
                    let k = (5 - self.header_len).min(data.len());
                    self.header[self.header_len..self.header_len + k].copy_from_slice(&data[..k]);
                    self.header_len += k;
                    self.got += k;
                    data = &data[k..];
                    if self.header_len < 5 {
                        break;
                    }
                    let len = u32::from_be_bytes(self.header[1..5].try_into().expect("4 bytes"));
                    let s = 5 + len as usize;
                    self.size = Some(s);
                    s
                }
            };
            let k = (size - self.got).min(data.len());
            self.got += k;
            data = &data[k..];
            if self.got == size {
                whole += size;
                *self = Framing::default();
            }
        }
        whole
    }
}

type Wait = Pin<Box<dyn Future<Output = bool> + Send>>;

/// A request body whose bytes are held in the budget while their message is
/// being received.
struct BudgetedBody {
    inner: tonic::body::Body,
    held: Held,
    framing: Framing,
    /// A chunk that found no room, and the wait for room.
    waiting: Option<(Wait, Bytes)>,
}

impl BudgetedBody {
    /// `data`'s bytes are held: passes them on, giving back whole messages.
    fn pass(&mut self, data: Bytes) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let whole = self.framing.feed(&data);
        self.held.give_back(whole);
        Poll::Ready(Some(Ok(Frame::data(data))))
    }
}

fn no_room(b: &BodyBudget, n: usize) -> Status {
    Status::unavailable(format!(
        "the server buffers {} of its {} bytes of request bodies (--http-max-buffered-bytes); {n} more bytes do not fit now, retry",
        b.held(),
        b.limit()
    ))
}

impl HttpBody for BudgetedBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = self.get_mut();
        if this.held.poll_evicted(cx).is_ready() {
            return Poll::Ready(Some(Err(Status::unavailable(format!(
                "the request message stopped arriving while the server's {} bytes of buffered bodies (--http-max-buffered-bytes) were needed by others; it was dropped, retry",
                this.held.budget().limit()
            )))));
        }
        if let Some((w, _)) = &mut this.waiting {
            let room = std::task::ready!(w.as_mut().poll(cx));
            let (_, data) = this.waiting.take().expect("waiting");
            if room && this.held.take(data.len()) {
                return this.pass(data);
            }
            return Poll::Ready(Some(Err(no_room(this.held.budget(), data.len()))));
        }
        match std::task::ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
            Some(Ok(f)) => match f.into_data() {
                Ok(data) => {
                    if this.held.take(data.len()) {
                        return this.pass(data);
                    }
                    let w: Wait = Box::pin(this.held.budget().clone().room_for(data.len()));
                    this.waiting = Some((w, data));
                    // Polls the wait (registers its wake-ups).
                    Pin::new(this).poll_frame(cx)
                }
                Err(f) => Poll::Ready(Some(Ok(f))),
            },
            other => Poll::Ready(other),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.waiting.is_none() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn framing_tells_whole_messages_across_chunks() {
        let msg = |n: u32| {
            let mut v = vec![0u8];
            v.extend_from_slice(&n.to_be_bytes());
            v.extend(std::iter::repeat_n(7u8, n as usize));
            v
        };
        let mut f = Framing::default();
        let (a, b) = (msg(10), msg(3));
        // Header split across chunks, then the rest with the next message.
        assert_eq!(f.feed(&a[..2]), 0);
        assert_eq!(f.feed(&a[2..9]), 0);
        let mut rest = a[9..].to_vec();
        rest.extend_from_slice(&b);
        rest.extend_from_slice(&msg(100)[..20]);
        assert_eq!(f.feed(&rest), 15 + 8);
        assert_eq!(f.got, 20);
        assert_eq!(f.feed(&msg(0)[..0]), 0);
        let mut g = Framing::default();
        assert_eq!(g.feed(&msg(0)), 5);
    }
}
