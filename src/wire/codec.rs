//! Binary encoding of [`Msg`] (see the framing in [`super`]). STUB: being written.

use super::Msg;

/// Why a frame could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeError {
    /// The frame ended inside a field.
    Truncated { need: usize, have: usize },
    /// A length field exceeds its limit.
    TooLarge {
        what: &'static str,
        len: usize,
        max: usize,
    },
    /// Another protocol version.
    Version { got: u16, want: u16 },
    /// Unknown message tag or enum value.
    BadTag { what: &'static str, tag: u8 },
    /// Invalid content (bad UTF-8, trailing bytes...).
    Invalid(String),
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self:?}")
    }
}
impl std::error::Error for DecodeError {}

/// Appends `msg` as one whole frame (length prefix included) to `out`.
pub fn encode(_msg: &Msg, _out: &mut Vec<u8>) {
    unimplemented!("codec being written")
}

/// `msg` as one whole frame.
pub fn encode_to_vec(msg: &Msg) -> Vec<u8> {
    let mut v = Vec::new();
    encode(msg, &mut v);
    v
}

/// Decodes one frame body (the bytes after the u32 length prefix).
pub fn decode(_body: &[u8]) -> Result<Msg, DecodeError> {
    unimplemented!("codec being written")
}

/// Splits a byte stream into frames and decodes them.
#[derive(Default)]
pub struct FrameReader {
    buf: Vec<u8>,
}

impl FrameReader {
    pub fn new() -> FrameReader {
        FrameReader::default()
    }
    /// Appends bytes read from the stream.
    pub fn feed(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }
    /// The next whole frame decoded, None when more bytes are needed. After an error
    /// the stream is unusable (close the connection).
    pub fn next_msg(&mut self) -> Option<Result<Msg, DecodeError>> {
        unimplemented!("codec being written")
    }
}
