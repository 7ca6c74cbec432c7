//! The cluster's secure channel: every internal connection (control
//! connections, region reads over TCP, the RDMA side channel) opens with a
//! Noise handshake keyed with the cluster secret, and every byte after it
//! travels in authenticated, encrypted records under keys of that connection
//! alone.
//!
//! # The construction, and why this one
//!
//! The handshake is the Noise protocol framework's `NNpsk0` pattern
//! (`Noise_NNpsk0_25519_AESGCM_SHA256`, revision 34, implemented by the
//! maintained `snow` crate; nothing here is a protocol of our own beyond
//! framing): both sides contribute a fresh X25519 ephemeral key, and the
//! pre-shared key (derived from the cluster secret) is mixed in before the
//! first message, so only holders of the secret can complete it and each
//! connection gets its own transport keys. The Noise *prologue*, which both
//! sides hash into the transcript, holds the dialer's role, the service it
//! dialed (control listener, region server, RDMA control or region side
//! channel) and the address it dialed; the dialer sends these in the clear
//! first, and the listener refuses a service that is not its own and an
//! address whose port is not the one it listens on. A man in the middle who
//! changes any of them makes the handshake fail; one who relays the bytes
//! unchanged to another member is refused by it (another service or
//! address), and one who relays them to the member they were meant for is
//! only a forwarder: it holds no key and can read, forge, replay or reorder
//! nothing (a record that does not verify ends the connection).
//!
//! Why Noise with a pre-shared key and not TLS 1.3 with mutual certificates
//! (rustls): the one secret file stays all an operator distributes (no CA, no
//! certificates to issue per node and renew; rustls has no external-PSK
//! mode); the handshake is one round trip plus the dialer's confirmation,
//! with no parsing of certificates; `snow` runs the handshake (X25519 from
//! the RustCrypto primitives, SHA-256 from ring), and the records after it
//! are Noise's transport messages sealed and opened with ring's AES-GCM
//! directly, in place ([`Channel`] says why; ring's AES-GCM uses the CPU's
//! AES and carry-less multiply instructions). What TLS would add, per-node
//! identities that can be revoked one by one, a shared secret cannot give:
//! every member can act as any other (docs/security.md).
//!
//! `NNpsk0`'s first message can be replayed by someone who recorded it; it
//! gets them nothing (the keys need the dialer's ephemeral secret), and the
//! listener only takes a connection as a member's once the dialer's first
//! record, a fixed confirmation, verifies under the connection's keys (it
//! needs the listener's fresh ephemeral key, so a replay cannot make it).
//!
//! # On the wire
//!
//! ```text
//! dialer   -> listener  u8[8] "FMTNOIS1", u8 service, u8 role len, role,
//!                       u8 address len, address            (clear, ≤ 300 bytes)
//! dialer   -> listener  u16 BE len, Noise message 1  (-> psk, e;     48 bytes)
//! listener -> dialer    u16 BE len, Noise message 2  (<- e, ee;      48 bytes)
//! dialer   -> listener  record: "fermata-confirm"
//! both ways             records: u16 BE len, AES-256-GCM of up to 65,519
//!                       bytes of the stream (nonce: the record's number in
//!                       its direction, from 0), 16-byte tag
//! ```
//!
//! The prologue is `"fermata-channel-v1" | header` (the clear bytes above).
//! The handshake must complete within [`HANDSHAKE_TIMEOUT`]; a listener holds
//! at most the header's few hundred bytes for a peer that never completes it.
//! Nothing here does I/O: [`Dial`] and [`Accept`] are byte-driven state
//! machines, [`Sealer`] and [`Opener`] turn a byte stream into records and
//! back; `crate::transport::secure_io` drives them on sockets.

use ring::aead::{Aad, LessSafeKey, Nonce, Tag, UnboundKey, AES_256_GCM};
use sha2::{Digest, Sha256};
use snow::params::NoiseParams;
use snow::HandshakeState;
use std::io::{Read, Write};
use std::path::Path;
use std::time::Duration;
use zeroize::Zeroize;

/// The Noise protocol every connection runs.
pub const NOISE: &str = "Noise_NNpsk0_25519_AESGCM_SHA256";
/// The clear header's magic.
const MAGIC: &[u8; 8] = b"FMTNOIS1";
/// Hashed before the header into the prologue.
const PROLOGUE_TAG: &[u8] = b"fermata-channel-v1";
/// The dialer's first record.
const CONFIRM: &[u8] = b"fermata-confirm";
/// A Noise message's most bytes (and so a record's).
pub const MAX_RECORD: usize = 65535;
/// An AEAD tag.
pub const TAG: usize = 16;
/// The most stream bytes one record carries.
pub const MAX_PLAIN: usize = MAX_RECORD - TAG;
/// The most bytes of a handshake message this side accepts (ours are 48).
const MAX_HANDSHAKE_MSG: usize = 256;
/// The longest role name.
pub const MAX_ROLE: usize = 32;
/// The longest dialed address.
pub const MAX_ADDR: usize = 255;
/// The role a key names until [`ClusterKey::with_role`] says otherwise.
const DEFAULT_ROLE: &str = "member";
/// The whole handshake must complete within this.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// The least secret, in bytes (after trimming the file's whitespace).
pub const MIN_SECRET: usize = 16;
/// The most secret read from a file.
const MAX_SECRET: u64 = 4096;

/// What a listener serves; the dialer names the one it means, and both bind
/// it into the handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Service {
    /// A control listener (scheduler, standby, frontend, backend).
    Control,
    /// A TCP region server.
    Region,
    /// The RDMA transport's side channel of a control connection.
    RdmaControl,
    /// The RDMA transport's side channel of a region.
    RdmaRegion,
}

impl Service {
    fn code(self) -> u8 {
        match self {
            Service::Control => 1,
            Service::Region => 2,
            Service::RdmaControl => 3,
            Service::RdmaRegion => 4,
        }
    }
    fn from_code(c: u8) -> Option<Service> {
        Some(match c {
            1 => Service::Control,
            2 => Service::Region,
            3 => Service::RdmaControl,
            4 => Service::RdmaRegion,
            _ => return None,
        })
    }
    /// Its name in messages.
    pub fn name(self) -> &'static str {
        match self {
            Service::Control => "control listener",
            Service::Region => "region server",
            Service::RdmaControl => "rdma control side channel",
            Service::RdmaRegion => "rdma region side channel",
        }
    }
}

/// The cluster secret every member holds (kept only as the pre-shared key
/// derived from it), and the role this process names when it dials.
#[derive(Clone)]
pub struct ClusterKey {
    psk: [u8; 32],
    role: &'static str,
}

impl std::fmt::Debug for ClusterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ClusterKey({}, ..)", self.role)
    }
}

/// The pre-shared key of a secret: SHA-256 over a label and the secret (the
/// secret file holds 32 random bytes as hex; any secret of at least
/// [`MIN_SECRET`] bytes is hashed to the 32 bytes Noise takes).
fn derive_psk(secret: &[u8]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(b"fermata-cluster-psk-v1");
    h.update(secret);
    h.finalize().into()
}

/// Why a handshake failed (the logged reason).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthError {
    /// The peer's first bytes are not a channel header: not a Fermata node of
    /// this version, or one started without the cluster secret.
    NotAMember,
    /// The peer's handshake does not verify: it holds another secret, or the
    /// bytes were changed on the way.
    WrongSecret,
    /// The dialer meant another service of this address.
    WrongService(String),
    /// The dialer dialed another address than the one this listens at.
    WrongAddress(String),
    /// A record after the handshake does not verify (changed, replayed,
    /// reordered or cut on the way), or is malformed.
    BadRecord(String),
    /// The peer closed the connection during the handshake: it refused us.
    Refused,
    /// The peer went away, or the handshake took too long.
    Io(String),
}

impl std::fmt::Display for AuthError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AuthError::NotAMember => f.write_str(
                "the peer did not open the cluster handshake (not a Fermata node of this version, or one started without --cluster-secret-file)",
            ),
            AuthError::WrongSecret => f.write_str(
                "the peer's handshake does not verify: it holds another cluster secret, or the handshake was changed on the way",
            ),
            AuthError::WrongService(s) => write!(f, "the peer dialed another service: {s}"),
            AuthError::WrongAddress(s) => write!(f, "the peer dialed another address: {s}"),
            AuthError::BadRecord(s) => write!(f, "a record does not verify: {s}"),
            AuthError::Refused => f.write_str(
                "the peer closed the connection during the handshake: it refused us (it holds another cluster secret, serves another service or port than the one dialed, or is not a Fermata node; its log names the reason)",
            ),
            AuthError::Io(e) => write!(f, "the handshake did not complete: {e}"),
        }
    }
}

impl std::error::Error for AuthError {}

/// Fresh random bytes from the OS.
fn random_bytes<const N: usize>() -> [u8; N] {
    use rand::RngCore;
    let mut b = [0u8; N];
    rand::rngs::OsRng.fill_bytes(&mut b);
    b
}

impl ClusterKey {
    /// A key of these secret bytes (at least [`MIN_SECRET`]).
    pub fn new(secret: &[u8]) -> anyhow::Result<ClusterKey> {
        if secret.len() < MIN_SECRET {
            anyhow::bail!(
                "the cluster secret is {} bytes; it must be at least {MIN_SECRET} (make one with `fermata secret PATH`)",
                secret.len()
            );
        }
        Ok(ClusterKey {
            psk: derive_psk(secret),
            role: DEFAULT_ROLE,
        })
    }

    /// A fresh random key (32 bytes, as 64 hex digits).
    pub fn generate() -> ClusterKey {
        let secret = hex(&random_bytes::<32>()).into_bytes();
        ClusterKey {
            psk: derive_psk(&secret),
            role: DEFAULT_ROLE,
        }
    }

    /// The key in the file at `path`: its content, whitespace trimmed at both
    /// ends. The file must not be readable by group or others (like ssh's keys).
    pub fn from_file(path: &Path) -> anyhow::Result<ClusterKey> {
        use anyhow::Context;
        use std::os::unix::fs::PermissionsExt;
        let f = std::fs::File::open(path)
            .with_context(|| format!("cannot open the cluster secret file {}", path.display()))?;
        let meta = f.metadata()?;
        if !meta.is_file() {
            anyhow::bail!("the cluster secret file {} is not a file", path.display());
        }
        let mode = meta.permissions().mode();
        if mode & 0o077 != 0 {
            anyhow::bail!(
                "the cluster secret file {} is readable by others (mode {:o}); run `chmod 600 {}`",
                path.display(),
                mode & 0o777,
                path.display()
            );
        }
        let mut b = Vec::new();
        f.take(MAX_SECRET + 1).read_to_end(&mut b)?;
        if b.len() as u64 > MAX_SECRET {
            anyhow::bail!(
                "the cluster secret file {} is over {MAX_SECRET} bytes",
                path.display()
            );
        }
        let s = b.trim_ascii();
        ClusterKey::new(s).with_context(|| format!("the cluster secret file {}", path.display()))
    }

    /// Writes a fresh key to a new file at `path` (mode 0600; an existing file
    /// is an error) and returns it.
    pub fn create_file(path: &Path) -> anyhow::Result<ClusterKey> {
        use anyhow::Context;
        use std::os::unix::fs::OpenOptionsExt;
        let secret = hex(&random_bytes::<32>()).into_bytes();
        let k = ClusterKey::new(&secret)?;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .with_context(|| format!("cannot create the cluster secret file {}", path.display()))?;
        f.write_all(&secret)?;
        f.write_all(b"\n")?;
        Ok(k)
    }

    /// The same key, naming the role of this process in every handshake it
    /// dials (`scheduler`, `backend`, ...; at most [`MAX_ROLE`] ASCII
    /// bytes).
    pub fn with_role(mut self, role: &'static str) -> ClusterKey {
        assert!(
            role.len() <= MAX_ROLE && role.is_ascii(),
            "a role is a short ASCII name"
        );
        self.role = role;
        self
    }

    /// The role this process names when it dials.
    pub fn role(&self) -> &'static str {
        self.role
    }
}

/// How often a refused peer is warned about: the first refusal at once, then
/// at most one warning per `every` with the count of those not warned about
/// (an outsider connecting in a loop must not fill the log). No clock of its
/// own: the caller passes the time.
#[derive(Debug)]
pub struct WarnLimit {
    every: Duration,
    last: Option<std::time::Instant>,
    suppressed: u64,
}

impl WarnLimit {
    pub const fn new(every: Duration) -> WarnLimit {
        WarnLimit {
            every,
            last: None,
            suppressed: 0,
        }
    }

    /// A refusal at `now`: Some(refusals not warned about since the last
    /// warning) when this one is to be warned about.
    pub fn hit(&mut self, now: std::time::Instant) -> Option<u64> {
        match self.last {
            Some(t) if now.saturating_duration_since(t) < self.every => {
                self.suppressed += 1;
                None
            }
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.suppressed))
            }
        }
    }
}

/// Peers this process refused (every listener, TCP and RDMA side channels).
static REFUSED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
/// The warnings about them: at most one per 10 s after the first.
static REFUSAL_WARNINGS: std::sync::Mutex<WarnLimit> =
    std::sync::Mutex::new(WarnLimit::new(Duration::from_secs(10)));

/// How many peers this process refused so far.
pub fn refused_total() -> u64 {
    REFUSED.load(std::sync::atomic::Ordering::Relaxed)
}

/// Counts a refused peer and says whether to warn about it: Some(refusals not
/// warned about since the last warning).
pub fn refusal() -> Option<u64> {
    REFUSED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    REFUSAL_WARNINGS
        .lock()
        .map(|mut w| w.hit(std::time::Instant::now()))
        .unwrap_or(None)
}

/// Lower-case hex.
fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn params() -> NoiseParams {
    NOISE.parse().expect("a valid Noise protocol name")
}

/// The clear header a dialer sends.
fn header(service: Service, role: &str, dialed: &str) -> Result<Vec<u8>, AuthError> {
    if dialed.len() > MAX_ADDR {
        return Err(AuthError::Io(format!(
            "the address `{dialed}` is over {MAX_ADDR} bytes"
        )));
    }
    let mut h = Vec::with_capacity(11 + role.len() + dialed.len());
    h.extend_from_slice(MAGIC);
    h.push(service.code());
    h.push(role.len() as u8);
    h.extend_from_slice(role.as_bytes());
    h.push(dialed.len() as u8);
    h.extend_from_slice(dialed.as_bytes());
    Ok(h)
}

fn prologue(header: &[u8]) -> Vec<u8> {
    let mut p = PROLOGUE_TAG.to_vec();
    p.extend_from_slice(header);
    p
}

fn noise_err(e: snow::Error) -> AuthError {
    match e {
        snow::Error::Decrypt => AuthError::WrongSecret,
        e => AuthError::Io(format!("noise: {e}")),
    }
}

fn build(key: &ClusterKey, header: &[u8], initiator: bool) -> Result<HandshakeState, AuthError> {
    let pro = prologue(header);
    let b = snow::Builder::new(params())
        .psk(0, &key.psk)
        .and_then(|b| b.prologue(&pro))
        .map_err(noise_err)?;
    if initiator {
        b.build_initiator()
    } else {
        b.build_responder()
    }
    .map_err(noise_err)
}

/// A handshake message, length-prefixed.
fn framed(msg: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(2 + msg.len());
    v.extend_from_slice(&(msg.len() as u16).to_be_bytes());
    v.extend_from_slice(msg);
    v
}

/// The port of `host:port` (`[v6]:port` too), if it names one.
fn port_of(addr: &str) -> Option<u16> {
    addr.rsplit_once(':').and_then(|(_, p)| p.parse().ok())
}

/// What a handshake asks its driver to do next.
#[derive(Debug)]
pub enum Step {
    /// Read exactly this many bytes and pass them to `take`.
    Read(usize),
    /// Send these bytes, then read exactly this many.
    SendThenRead(Vec<u8>, usize),
    /// Done: send these bytes (maybe none); the channel is open.
    Done(Vec<u8>, Channel),
}

/// The dialer's side of a handshake, without I/O.
pub struct Dial {
    hs: Option<HandshakeState>,
    state: DialState,
}

enum DialState {
    Len,
    Msg,
    Over,
}

impl Dial {
    /// Starts a handshake to `service` at `dialed` (the address as this side
    /// dialed it): the machine, and its first step (send the header and the
    /// first message).
    pub fn start(
        key: &ClusterKey,
        service: Service,
        dialed: &str,
    ) -> Result<(Dial, Step), AuthError> {
        let h = header(service, key.role, dialed)?;
        let mut hs = build(key, &h, true)?;
        let mut m = [0u8; MAX_HANDSHAKE_MSG];
        let n = hs.write_message(&[], &mut m).map_err(noise_err)?;
        let mut out = h;
        out.extend_from_slice(&framed(&m[..n]));
        Ok((
            Dial {
                hs: Some(hs),
                state: DialState::Len,
            },
            Step::SendThenRead(out, 2),
        ))
    }

    /// Takes the bytes the last step asked for.
    pub fn take(&mut self, bytes: &[u8]) -> Result<Step, AuthError> {
        match self.state {
            DialState::Len => {
                let n = u16_at(bytes)? as usize;
                if n == 0 || n > MAX_HANDSHAKE_MSG {
                    self.state = DialState::Over;
                    return Err(AuthError::NotAMember);
                }
                self.state = DialState::Msg;
                Ok(Step::Read(n))
            }
            DialState::Msg => {
                self.state = DialState::Over;
                let mut hs = self.hs.take().expect("in a handshake");
                let mut p = [0u8; MAX_HANDSHAKE_MSG];
                hs.read_message(bytes, &mut p).map_err(noise_err)?;
                let mut ch = Channel::of(hs)?;
                let mut confirm = Vec::new();
                ch.sealer.seal(CONFIRM, &mut confirm)?;
                Ok(Step::Done(confirm, ch))
            }
            DialState::Over => Err(AuthError::Io("the handshake is over".into())),
        }
    }
}

fn u16_at(b: &[u8]) -> Result<u16, AuthError> {
    match b {
        [a, b] => Ok(u16::from_be_bytes([*a, *b])),
        _ => Err(AuthError::Io("expected 2 bytes".into())),
    }
}

/// Who dialed, as its (authenticated) header said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dialer {
    pub role: String,
    pub dialed: String,
}

/// The listener's side of a handshake, without I/O.
pub struct Accept {
    key: ClusterKey,
    service: Service,
    port: u16,
    header: Vec<u8>,
    hs: Option<HandshakeState>,
    state: AcceptState,
    dialer: Option<Dialer>,
}

enum AcceptState {
    /// Magic, service, role length.
    Fixed,
    /// Role, address length.
    Role(usize),
    /// Address.
    Addr(usize),
    Msg1Len,
    Msg1,
    ConfirmLen,
    Confirm,
    Over,
}

/// The fixed start of a header: magic, service, role length.
const FIXED: usize = 10;

impl Accept {
    /// A handshake for a listener of `service` accepted on local port `port`;
    /// its first step is [`Accept::first`].
    pub fn new(key: &ClusterKey, service: Service, port: u16) -> Accept {
        Accept {
            key: key.clone(),
            service,
            port,
            header: Vec::new(),
            hs: None,
            state: AcceptState::Fixed,
            dialer: None,
        }
    }

    /// The bytes to read first.
    pub fn first(&self) -> usize {
        FIXED
    }

    /// The dialer, once its header was read.
    pub fn dialer(&self) -> Option<&Dialer> {
        self.dialer.as_ref()
    }

    /// Takes the bytes the last step asked for.
    pub fn take(&mut self, bytes: &[u8]) -> Result<Step, AuthError> {
        let r = self.step(bytes);
        if r.is_err() {
            self.state = AcceptState::Over;
        }
        r
    }

    fn step(&mut self, bytes: &[u8]) -> Result<Step, AuthError> {
        match self.state {
            AcceptState::Fixed => {
                if bytes.len() != FIXED || &bytes[..8] != MAGIC {
                    return Err(AuthError::NotAMember);
                }
                let service = Service::from_code(bytes[8]).ok_or(AuthError::NotAMember)?;
                if service != self.service {
                    return Err(AuthError::WrongService(format!(
                        "it asked for a {}, this is a {}",
                        service.name(),
                        self.service.name()
                    )));
                }
                let rl = bytes[9] as usize;
                if rl > MAX_ROLE {
                    return Err(AuthError::NotAMember);
                }
                self.header.extend_from_slice(bytes);
                self.state = AcceptState::Role(rl);
                Ok(Step::Read(rl + 1))
            }
            AcceptState::Role(rl) => {
                if bytes.len() != rl + 1 {
                    return Err(AuthError::NotAMember);
                }
                self.header.extend_from_slice(bytes);
                let al = bytes[rl] as usize;
                if al == 0 {
                    return Err(AuthError::NotAMember);
                }
                self.state = AcceptState::Addr(al);
                Ok(Step::Read(al))
            }
            AcceptState::Addr(al) => {
                if bytes.len() != al {
                    return Err(AuthError::NotAMember);
                }
                self.header.extend_from_slice(bytes);
                let rl = self.header[9] as usize;
                let role = std::str::from_utf8(&self.header[FIXED..FIXED + rl])
                    .map_err(|_| AuthError::NotAMember)?;
                let dialed = std::str::from_utf8(bytes).map_err(|_| AuthError::NotAMember)?;
                if port_of(dialed) != Some(self.port) {
                    return Err(AuthError::WrongAddress(format!(
                        "`{dialed}`, and this {} listens on port {}",
                        self.service.name(),
                        self.port
                    )));
                }
                self.dialer = Some(Dialer {
                    role: role.to_string(),
                    dialed: dialed.to_string(),
                });
                self.hs = Some(build(&self.key, &self.header, false)?);
                self.state = AcceptState::Msg1Len;
                Ok(Step::Read(2))
            }
            AcceptState::Msg1Len => {
                let n = u16_at(bytes)? as usize;
                if n == 0 || n > MAX_HANDSHAKE_MSG {
                    return Err(AuthError::NotAMember);
                }
                self.state = AcceptState::Msg1;
                Ok(Step::Read(n))
            }
            AcceptState::Msg1 => {
                let hs = self.hs.as_mut().expect("in a handshake");
                let mut p = [0u8; MAX_HANDSHAKE_MSG];
                hs.read_message(bytes, &mut p).map_err(noise_err)?;
                let mut m = [0u8; MAX_HANDSHAKE_MSG];
                let n = hs.write_message(&[], &mut m).map_err(noise_err)?;
                self.state = AcceptState::ConfirmLen;
                Ok(Step::SendThenRead(framed(&m[..n]), 2))
            }
            AcceptState::ConfirmLen => {
                let n = u16_at(bytes)? as usize;
                if n != CONFIRM.len() + TAG {
                    return Err(AuthError::WrongSecret);
                }
                self.state = AcceptState::Confirm;
                Ok(Step::Read(n))
            }
            AcceptState::Confirm => {
                self.state = AcceptState::Over;
                let hs = self.hs.take().expect("in a handshake");
                let mut ch = Channel::of(hs)?;
                let mut rec = (bytes.len() as u16).to_be_bytes().to_vec();
                rec.extend_from_slice(bytes);
                let mut plain = Vec::new();
                let used = ch
                    .opener
                    .open(&rec, &mut plain)
                    .map_err(|_| AuthError::WrongSecret)?;
                if used != rec.len() || plain != CONFIRM {
                    return Err(AuthError::WrongSecret);
                }
                Ok(Step::Done(Vec::new(), ch))
            }
            AcceptState::Over => Err(AuthError::Io("the handshake is over".into())),
        }
    }
}

/// An open channel: the two directions' record machines.
pub struct Channel {
    pub sealer: Sealer,
    pub opener: Opener,
}

impl Channel {
    /// The transport keys of a finished handshake: Noise's `Split()`, taken
    /// from `snow` as raw keys and bound to ring's AES-256-GCM here.
    ///
    /// Why not `snow`'s transport state: its AES-GCM (ring's, through its
    /// `ring-accelerated` resolver) seals and opens only into a second
    /// buffer, copying every record there first; opening a record where it
    /// was read saves a pass over every byte received, and a backend's input
    /// pulls are hundreds of kilobytes per input (profiled: that copy was
    /// 7.5% of the CPU of 602,112-byte inputs served over TCP). What is done
    /// here is Noise's transport phase exactly (revision 34, §5.1 and
    /// §12.4: `EncryptWithAd` with an empty `ad`, the nonce 4 zero bytes and
    /// the record's number big-endian, counted from 0 in each direction);
    /// `records_are_those_of_snow` checks it against `snow`'s own transport
    /// state: each side's records open with the other's, both ways.
    fn of(mut hs: HandshakeState) -> Result<Channel, AuthError> {
        if !hs.is_handshake_finished() {
            return Err(AuthError::Io("the handshake is not finished".into()));
        }
        let (mut k1, mut k2) = hs.dangerously_get_raw_split();
        // The first key is the initiator's (the dialer's) sending key.
        let (send, recv) = if hs.is_initiator() {
            (&k1, &k2)
        } else {
            (&k2, &k1)
        };
        let ch = Channel {
            sealer: Sealer {
                key: RecordKey::new(send),
                nonce: 0,
            },
            opener: Opener {
                key: RecordKey::new(recv),
                nonce: 0,
            },
        };
        k1.zeroize();
        k2.zeroize();
        Ok(ch)
    }
}

impl std::fmt::Debug for Channel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Channel(..)")
    }
}

/// One direction's transport key (AES-256-GCM, [`NOISE`]'s cipher), boxed:
/// its expanded key schedule is most of a channel's size.
struct RecordKey(Box<LessSafeKey>);

impl RecordKey {
    fn new(k: &[u8; 32]) -> RecordKey {
        RecordKey(Box::new(LessSafeKey::new(
            UnboundKey::new(&AES_256_GCM, k).expect("AES-256-GCM takes a 32-byte key"),
        )))
    }

    /// Noise's nonce for record `n`: 4 zero bytes, then `n` big-endian.
    /// `n` = 2^64 − 1 is reserved (Noise §5.1): the channel is then spent.
    fn nonce(n: u64) -> Result<Nonce, AuthError> {
        if n == u64::MAX {
            return Err(AuthError::BadRecord(
                "the channel has used all its nonces".into(),
            ));
        }
        let mut b = [0u8; 12];
        b[4..].copy_from_slice(&n.to_be_bytes());
        Ok(Nonce::assume_unique_for_key(b))
    }
}

/// Turns this side's outgoing stream into records.
pub struct Sealer {
    key: RecordKey,
    nonce: u64,
}

impl Sealer {
    /// The bytes `plain` takes once sealed: records of at most [`MAX_PLAIN`]
    /// bytes, each with its 2-byte length and its tag.
    pub fn sealed_len(plain: usize) -> usize {
        plain + plain.div_ceil(MAX_PLAIN) * (2 + TAG)
    }

    /// Seals `plain` as records of at most [`MAX_PLAIN`] bytes each into the
    /// start of `out` (at least [`Sealer::sealed_len`] bytes): the bytes
    /// written. Writing into a slice lets a caller keep one buffer and not
    /// zero it again for every write.
    pub fn seal_into(&mut self, plain: &[u8], out: &mut [u8]) -> Result<usize, AuthError> {
        let need = Self::sealed_len(plain.len());
        if out.len() < need {
            return Err(AuthError::BadRecord(format!(
                "sealing {} bytes needs {need} bytes of room, not {}",
                plain.len(),
                out.len()
            )));
        }
        let mut at = 0;
        for chunk in plain.chunks(MAX_PLAIN) {
            let n = chunk.len();
            out[at..at + 2].copy_from_slice(&((n + TAG) as u16).to_be_bytes());
            let body = &mut out[at + 2..at + 2 + n];
            body.copy_from_slice(chunk);
            let tag = self
                .key
                .0
                .seal_in_place_separate_tag(RecordKey::nonce(self.nonce)?, Aad::empty(), body)
                .map_err(|_| AuthError::BadRecord("sealing a record failed".into()))?;
            out[at + 2 + n..at + 2 + n + TAG].copy_from_slice(tag.as_ref());
            self.nonce += 1;
            at += 2 + n + TAG;
        }
        Ok(at)
    }

    /// Appends `plain` to `out` as records of at most [`MAX_PLAIN`] bytes
    /// each (none for no bytes).
    pub fn seal(&mut self, plain: &[u8], out: &mut Vec<u8>) -> Result<(), AuthError> {
        let at = out.len();
        out.resize(at + Self::sealed_len(plain.len()), 0);
        let n = self.seal_into(plain, &mut out[at..])?;
        out.truncate(at + n);
        Ok(())
    }
}

/// Turns the peer's records back into its stream, checking each.
pub struct Opener {
    key: RecordKey,
    nonce: u64,
}

impl Opener {
    /// Opens every whole record at the start of `raw`, appending its bytes to
    /// `out`; the bytes of `raw` used. A record that does not verify is an
    /// error, and the channel must not be used after it; `out` then ends with
    /// the last record that verified (nothing of the failed one is left in it).
    pub fn open(&mut self, raw: &[u8], out: &mut Vec<u8>) -> Result<usize, AuthError> {
        let mut pos = 0;
        while let Some(plain) = Self::whole(&raw[pos..])? {
            let at = out.len();
            out.resize(at + plain, 0);
            let need = Self::need(&raw[pos..]);
            match self.open_record(&raw[pos..pos + need], &mut out[at..]) {
                Ok(got) => out.truncate(at + got),
                Err(e) => {
                    out.truncate(at);
                    return Err(e);
                }
            }
            pos += need;
        }
        Ok(pos)
    }

    /// The plaintext bytes of the record at the start of `raw` when `raw`
    /// holds all of it (None: not yet); an error for a length no record has.
    pub fn whole(raw: &[u8]) -> Result<Option<usize>, AuthError> {
        let [a, b, rest @ ..] = raw else {
            return Ok(None);
        };
        let n = Self::plain_len([*a, *b])?;
        Ok((rest.len() >= n + TAG).then_some(n))
    }

    /// The plaintext bytes of a record whose 2-byte length is `head`; an
    /// error for a length no record has.
    pub fn plain_len(head: [u8; 2]) -> Result<usize, AuthError> {
        let n = u16::from_be_bytes(head) as usize;
        if n < TAG {
            return Err(AuthError::BadRecord(format!("a record of {n} bytes")));
        }
        Ok(n - TAG)
    }

    /// Opens the one record `record` (its 2-byte length included, as
    /// [`Opener::need`] measures it) into the start of `out`, which must hold
    /// its plaintext: the bytes written.
    pub fn open_record(&mut self, record: &[u8], out: &mut [u8]) -> Result<usize, AuthError> {
        let Some(plain) = Self::whole(record)? else {
            return Err(AuthError::BadRecord("a record cut short".into()));
        };
        if record.len() != 2 + plain + TAG || out.len() < plain {
            return Err(AuthError::BadRecord(format!(
                "a record of {} bytes opened into {} bytes",
                record.len(),
                out.len()
            )));
        }
        let body = &mut out[..plain];
        body.copy_from_slice(&record[2..2 + plain]);
        let tag: [u8; TAG] = record[2 + plain..].try_into().expect("TAG bytes");
        self.open_in_place(body, tag)?;
        Ok(plain)
    }

    /// Opens the next record, whose ciphertext is `body` and whose tag is
    /// `tag`, where it lies: `body` then holds its plaintext. A reader that
    /// reads a record's ciphertext straight into its caller's buffer opens it
    /// there. A record that does not verify is an error, and the channel
    /// must not be used after it (`body` then holds no plaintext).
    pub fn open_in_place(&mut self, body: &mut [u8], tag: [u8; TAG]) -> Result<(), AuthError> {
        self.key
            .0
            .open_in_place_separate_tag(
                RecordKey::nonce(self.nonce)?,
                Aad::empty(),
                Tag::from(tag),
                body,
                0..,
            )
            .map_err(|_| {
                AuthError::BadRecord(format!(
                    "record {} was changed, replayed or reordered on the way",
                    self.nonce
                ))
            })?;
        self.nonce += 1;
        Ok(())
    }

    /// The bytes the record starting `raw` needs in all (its header's 2 when
    /// `raw` has less).
    pub fn need(raw: &[u8]) -> usize {
        match raw {
            [a, b, ..] => 2 + u16::from_be_bytes([*a, *b]) as usize,
            _ => 2,
        }
    }
}

/// A read that failed during a handshake: the peer's end is a refusal.
fn read_err(e: std::io::Error) -> AuthError {
    match e.kind() {
        std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::ConnectionReset => {
            AuthError::Refused
        }
        _ => AuthError::Io(e.to_string()),
    }
}

/// Runs a handshake over blocking I/O: `step` first, reading and writing with
/// `s`.
fn drive_std<S: Read + Write>(
    s: &mut S,
    mut step: Step,
    mut take: impl FnMut(&[u8]) -> Result<Step, AuthError>,
) -> Result<Channel, AuthError> {
    let io = |e: std::io::Error| AuthError::Io(e.to_string());
    let mut buf = Vec::new();
    loop {
        let n = match step {
            Step::Read(n) => n,
            Step::SendThenRead(out, n) => {
                s.write_all(&out).map_err(io)?;
                n
            }
            Step::Done(out, ch) => {
                if !out.is_empty() {
                    s.write_all(&out).map_err(io)?;
                }
                return Ok(ch);
            }
        };
        buf.resize(n, 0);
        s.read_exact(&mut buf).map_err(read_err)?;
        step = take(&buf)?;
    }
}

/// Dials the handshake on a blocking socket (timeouts set to
/// [`HANDSHAKE_TIMEOUT`] meanwhile, and left unset).
pub fn dial_std(
    s: &mut std::net::TcpStream,
    key: &ClusterKey,
    service: Service,
    dialed: &str,
) -> Result<Channel, AuthError> {
    let io = |e: std::io::Error| AuthError::Io(e.to_string());
    s.set_read_timeout(Some(HANDSHAKE_TIMEOUT)).map_err(io)?;
    s.set_write_timeout(Some(HANDSHAKE_TIMEOUT)).map_err(io)?;
    let (mut d, first) = Dial::start(key, service, dialed)?;
    let ch = drive_std(s, first, |b| d.take(b))?;
    s.set_read_timeout(None).map_err(io)?;
    s.set_write_timeout(None).map_err(io)?;
    Ok(ch)
}

/// Accepts the handshake on a blocking socket (timeouts as in [`dial_std`]);
/// the channel and who dialed.
pub fn accept_std(
    s: &mut std::net::TcpStream,
    key: &ClusterKey,
    service: Service,
) -> Result<(Channel, Dialer), AuthError> {
    let io = |e: std::io::Error| AuthError::Io(e.to_string());
    let port = s.local_addr().map_err(io)?.port();
    s.set_read_timeout(Some(HANDSHAKE_TIMEOUT)).map_err(io)?;
    s.set_write_timeout(Some(HANDSHAKE_TIMEOUT)).map_err(io)?;
    let mut a = Accept::new(key, service, port);
    let first = Step::Read(a.first());
    let ch = drive_std(s, first, |b| a.take(b))?;
    s.set_read_timeout(None).map_err(io)?;
    s.set_write_timeout(None).map_err(io)?;
    let d = a
        .dialer()
        .cloned()
        .expect("a finished handshake read the header");
    Ok((ch, d))
}

/// Runs a handshake over a tokio socket, within [`HANDSHAKE_TIMEOUT`].
async fn drive_async<S>(
    s: &mut S,
    mut step: Step,
    mut take: impl FnMut(&[u8]) -> Result<Step, AuthError>,
) -> Result<Channel, AuthError>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let run = async {
        let io = |e: std::io::Error| AuthError::Io(e.to_string());
        let mut buf = Vec::new();
        loop {
            let n = match step {
                Step::Read(n) => n,
                Step::SendThenRead(out, n) => {
                    s.write_all(&out).await.map_err(io)?;
                    n
                }
                Step::Done(out, ch) => {
                    if !out.is_empty() {
                        s.write_all(&out).await.map_err(io)?;
                    }
                    return Ok(ch);
                }
            };
            buf.resize(n, 0);
            s.read_exact(&mut buf).await.map_err(read_err)?;
            step = take(&buf)?;
        }
    };
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, run).await {
        Ok(r) => r,
        Err(_) => Err(AuthError::Io(format!(
            "no complete handshake within {} s",
            HANDSHAKE_TIMEOUT.as_secs()
        ))),
    }
}

/// Accepts the handshake on a tokio socket accepted on local port `port`.
pub async fn accept_async<S>(
    s: &mut S,
    key: &ClusterKey,
    service: Service,
    port: u16,
) -> Result<(Channel, Dialer), AuthError>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let mut a = Accept::new(key, service, port);
    let first = Step::Read(a.first());
    let ch = drive_async(s, first, |b| a.take(b)).await?;
    let d = a
        .dialer()
        .cloned()
        .expect("a finished handshake read the header");
    Ok((ch, d))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn key(s: &str) -> ClusterKey {
        ClusterKey::new(s.as_bytes()).unwrap()
    }

    /// What a listener got: its result, and what it sent back.
    type Run = Result<Channel, AuthError>;

    /// Runs a dialer and a listener against each other in memory; `tamper`
    /// may change each flight from the dialer (its index, its bytes) on the
    /// way.
    fn pair_with(
        dial_key: &ClusterKey,
        dial_service: Service,
        dialed: &str,
        accept_key: &ClusterKey,
        accept_service: Service,
        port: u16,
        mut tamper: impl FnMut(usize, &mut Vec<u8>),
    ) -> (Run, Run) {
        let (mut d, first) = Dial::start(dial_key, dial_service, dialed).unwrap();
        let mut a = Accept::new(accept_key, accept_service, port);
        // The dialer's bytes in flight to the listener, and back.
        let mut to_l: Vec<u8> = Vec::new();
        let mut to_d: Vec<u8> = Vec::new();
        let mut flights = 0;
        let mut push = |to: &mut Vec<u8>, mut b: Vec<u8>, f: &mut usize| {
            tamper(*f, &mut b);
            *f += 1;
            to.extend_from_slice(&b);
        };
        let mut d_need = match first {
            Step::SendThenRead(b, n) => {
                push(&mut to_l, b, &mut flights);
                n
            }
            _ => unreachable!(),
        };
        let mut a_need = a.first();
        let mut d_done: Option<Run> = None;
        let mut a_done: Option<Run> = None;
        for _ in 0..32 {
            if a_done.is_none() && to_l.len() >= a_need {
                let b: Vec<u8> = to_l.drain(..a_need).collect();
                match a.take(&b) {
                    Ok(Step::Read(n)) => a_need = n,
                    Ok(Step::SendThenRead(out, n)) => {
                        to_d.extend_from_slice(&out);
                        a_need = n;
                    }
                    Ok(Step::Done(_, ch)) => a_done = Some(Ok(ch)),
                    Err(e) => a_done = Some(Err(e)),
                }
                continue;
            }
            if d_done.is_none() && to_d.len() >= d_need {
                let b: Vec<u8> = to_d.drain(..d_need).collect();
                match d.take(&b) {
                    Ok(Step::Read(n)) => d_need = n,
                    Ok(Step::SendThenRead(out, n)) => {
                        push(&mut to_l, out, &mut flights);
                        d_need = n;
                    }
                    Ok(Step::Done(out, ch)) => {
                        push(&mut to_l, out, &mut flights);
                        d_done = Some(Ok(ch));
                    }
                    Err(e) => d_done = Some(Err(e)),
                }
                continue;
            }
            break;
        }
        let stuck = || Err(AuthError::Io("no more bytes".into()));
        (d_done.unwrap_or_else(stuck), a_done.unwrap_or_else(stuck))
    }

    /// Two ends of one channel: the dialer's and the listener's.
    pub(crate) fn channel_pair() -> (Channel, Channel) {
        let k = key("0123456789abcdef0123");
        let (d, l) = pair(&k, &k);
        (d.unwrap(), l.unwrap())
    }

    fn pair(a: &ClusterKey, b: &ClusterKey) -> (Run, Run) {
        pair_with(
            a,
            Service::Control,
            "10.0.0.1:7300",
            b,
            Service::Control,
            7300,
            |_, _| {},
        )
    }

    /// Both directions carry bytes; a record of each direction opens only
    /// on the other side, in order.
    fn talk(d: &mut Channel, l: &mut Channel) {
        let big: Vec<u8> = (0..200_000u32).map(|i| i as u8).collect();
        let mut wire = Vec::new();
        d.sealer.seal(&big, &mut wire).unwrap();
        assert_eq!(wire.len(), big.len() + 4 * (2 + TAG), "4 records");
        let mut got = Vec::new();
        // In pieces: a record cut short waits for the rest.
        let used = l.opener.open(&wire[..70_000], &mut got).unwrap();
        assert_eq!(used, 2 + MAX_RECORD);
        let used2 = l.opener.open(&wire[used..], &mut got).unwrap();
        assert_eq!(used + used2, wire.len());
        assert_eq!(got, big);
        let mut back = Vec::new();
        l.sealer.seal(b"answer", &mut back).unwrap();
        let mut got = Vec::new();
        d.opener.open(&back, &mut got).unwrap();
        assert_eq!(got, b"answer");
    }

    #[test]
    fn members_open_a_channel_and_others_are_refused() {
        let k = key("0123456789abcdef0123");
        let (d, l) = pair(&k, &k);
        let (mut d, mut l) = (d.unwrap(), l.unwrap());
        talk(&mut d, &mut l);
        let other = key("0123456789abcdef0124");
        let (d, l) = pair(&k, &other);
        assert_eq!(l.err(), Some(AuthError::WrongSecret));
        assert!(d.is_err(), "the dialer got no reply it could use");
        // Not a header: refused at the first bytes.
        let mut a = Accept::new(&k, Service::Control, 1);
        let mut junk = [0u8; FIXED];
        junk[..4].copy_from_slice(&[0, 0, 0, 9]);
        assert_eq!(a.take(&junk).err(), Some(AuthError::NotAMember));
    }

    /// The prologue binds the service and the address dialed: a listener of
    /// another service or port refuses, and a header changed on the way (the
    /// role, the address, the service) fails the handshake.
    #[test]
    fn the_transcript_binds_service_address_and_role() {
        let k = key("0123456789abcdef0123");
        let k2 = k.clone().with_role("backend");
        let (_, l) = pair_with(
            &k2,
            Service::Control,
            "h:7300",
            &k,
            Service::Region,
            7300,
            |_, _| {},
        );
        assert!(matches!(l, Err(AuthError::WrongService(_))), "{l:?}");
        let (_, l) = pair_with(
            &k2,
            Service::Control,
            "h:7300",
            &k,
            Service::Control,
            7301,
            |_, _| {},
        );
        assert!(matches!(l, Err(AuthError::WrongAddress(_))), "{l:?}");
        let (d, l) = pair_with(
            &k2,
            Service::Control,
            "h:7300",
            &k,
            Service::Control,
            7300,
            |_, _| {},
        );
        assert!(d.is_ok() && l.is_ok());
        // The header changed on the way, keeping its lengths.
        for (what, from, to) in [
            ("role", &b"backend"[..], &b"bckend2"[..]),
            ("address", &b"h:7300"[..], &b"g:7300"[..]),
        ] {
            let (d, l) = pair_with(
                &k2,
                Service::Control,
                "h:7300",
                &k,
                Service::Control,
                7300,
                |i, b| {
                    if i == 0 {
                        let at = b.windows(from.len()).position(|w| w == from).unwrap();
                        b[at..at + from.len()].copy_from_slice(to);
                    }
                },
            );
            assert_eq!(l.err(), Some(AuthError::WrongSecret), "{what}");
            assert!(d.is_err(), "{what}");
        }
    }

    /// A dialer's first flight recorded and replayed on another connection
    /// gets a reply, but the listener never takes it as a member's: the
    /// confirmation needs the keys of the new connection.
    #[test]
    fn a_replayed_handshake_is_not_a_member() {
        let k = key("0123456789abcdef0123");
        let mut recorded: Vec<Vec<u8>> = Vec::new();
        let (d, l) = pair_with(
            &k,
            Service::Control,
            "h:1",
            &k,
            Service::Control,
            1,
            |_, b| recorded.push(b.clone()),
        );
        assert!(d.is_ok() && l.is_ok());
        // Replay the header, message 1 and the confirmation to a fresh listener.
        let all: Vec<u8> = recorded.concat();
        let mut a = Accept::new(&k, Service::Control, 1);
        let mut need = a.first();
        let mut pos = 0;
        let res = loop {
            let b = &all[pos..pos + need];
            pos += need;
            match a.take(b) {
                Ok(Step::Read(n)) | Ok(Step::SendThenRead(_, n)) => need = n,
                Ok(Step::Done(..)) => break Ok(()),
                Err(e) => break Err(e),
            }
        };
        assert_eq!(res, Err(AuthError::WrongSecret));
    }

    /// Records changed, replayed, reordered or dropped on the way do not open.
    #[test]
    fn records_are_authenticated_and_ordered() {
        let k = key("0123456789abcdef0123");
        let fresh = || {
            let (d, l) = pair(&k, &k);
            (d.unwrap(), l.unwrap())
        };
        let seal = |c: &mut Channel, b: &[u8]| {
            let mut v = Vec::new();
            c.sealer.seal(b, &mut v).unwrap();
            v
        };
        // Changed: nothing of it is left in the output, which keeps the
        // record before it that verified.
        let (mut d, mut l) = fresh();
        let mut r = seal(&mut d, b"submit 0");
        r.extend(seal(&mut d, b"submit 1"));
        let n = r.len();
        r[n - 3] ^= 1;
        let mut out = b"kept".to_vec();
        assert!(matches!(
            l.opener.open(&r, &mut out),
            Err(AuthError::BadRecord(_))
        ));
        assert_eq!(out, b"keptsubmit 0");
        // Replayed.
        let (mut d, mut l) = fresh();
        let r = seal(&mut d, b"submit 1");
        l.opener.open(&r, &mut Vec::new()).unwrap();
        assert!(l.opener.open(&r, &mut Vec::new()).is_err());
        // Reordered (or one dropped).
        let (mut d, mut l) = fresh();
        let _first = seal(&mut d, b"a");
        let second = seal(&mut d, b"b");
        assert!(l.opener.open(&second, &mut Vec::new()).is_err());
        // From another connection of the same secret.
        let (mut d2, _) = fresh();
        let (_, mut l) = fresh();
        let r = seal(&mut d2, b"x");
        assert!(l.opener.open(&r, &mut Vec::new()).is_err());
        // Too short to hold a tag.
        let (_, mut l) = fresh();
        assert!(l.opener.open(&[0, 3, 1, 2, 3], &mut Vec::new()).is_err());
    }

    /// The records are Noise's transport messages as `snow` makes them: one
    /// side's records open with `snow`'s transport state on the other side
    /// of the same handshake, both ways, whichever side is `snow`'s, over
    /// many records (nonces counted alike) of every size up to the largest.
    #[test]
    fn records_are_those_of_snow() {
        let k = key("0123456789abcdef0123");
        for ours_dials in [true, false] {
            let mut i = build(&k, b"header", true).unwrap();
            let mut r = build(&k, b"header", false).unwrap();
            let mut m = vec![0u8; MAX_RECORD];
            let mut p = vec![0u8; MAX_RECORD];
            let n = i.write_message(&[], &mut m).unwrap();
            r.read_message(&m[..n], &mut p).unwrap();
            let n = r.write_message(&[], &mut m).unwrap();
            i.read_message(&m[..n], &mut p).unwrap();
            let (ours, theirs) = if ours_dials { (i, r) } else { (r, i) };
            let mut ours = Channel::of(ours).unwrap();
            let theirs = theirs.into_stateless_transport_mode().unwrap();
            for (nonce, len) in [1usize, 15, 16, 17, 1000, MAX_PLAIN, 3, MAX_PLAIN - 1]
                .into_iter()
                .enumerate()
            {
                let nonce = nonce as u64;
                let plain: Vec<u8> = (0..len).map(|x| (x * 7 + len) as u8).collect();
                // Ours sealed, theirs opened.
                let mut rec = Vec::new();
                ours.sealer.seal(&plain, &mut rec).unwrap();
                assert_eq!(rec.len(), 2 + len + TAG);
                assert_eq!(Opener::need(&rec), rec.len());
                let n = theirs.read_message(nonce, &rec[2..], &mut p).unwrap();
                assert_eq!(&p[..n], &plain[..], "snow opens ours ({len} bytes)");
                // Theirs sealed, ours opened.
                let n = theirs.write_message(nonce, &plain, &mut m).unwrap();
                let mut rec = ((n as u16).to_be_bytes()).to_vec();
                rec.extend_from_slice(&m[..n]);
                let mut got = Vec::new();
                assert_eq!(ours.opener.open(&rec, &mut got).unwrap(), rec.len());
                assert_eq!(got, plain, "ours opens snow's ({len} bytes)");
            }
        }
    }

    /// A record opened where it lies: the tag apart, the body in place; a
    /// changed byte of either fails (and leaves the count of records where
    /// it was), and so does the same record again once opened.
    #[test]
    fn a_record_opens_in_place() {
        let k = key("0123456789abcdef0123");
        let (d, l) = pair(&k, &k);
        let (mut d, mut l) = (d.unwrap(), l.unwrap());
        let plain: Vec<u8> = (0..40_000u32).map(|x| x as u8).collect();
        let mut rec = Vec::new();
        d.sealer.seal(&plain, &mut rec).unwrap();
        let mut body = rec[2..2 + plain.len()].to_vec();
        let tag: [u8; TAG] = rec[2 + plain.len()..].try_into().unwrap();
        let mut bad = tag;
        bad[3] ^= 1;
        assert!(l.opener.open_in_place(&mut body.clone(), bad).is_err());
        let mut changed = body.clone();
        changed[39_999] ^= 1;
        assert!(l.opener.open_in_place(&mut changed, tag).is_err());
        l.opener.open_in_place(&mut body, tag).unwrap();
        assert_eq!(body, plain);
        let mut again = rec[2..2 + plain.len()].to_vec();
        assert!(l.opener.open_in_place(&mut again, tag).is_err(), "a replay");
    }

    /// The first refusal is warned about, then one per period with the count
    /// of those that were not.
    #[test]
    fn refusal_warnings_are_rate_limited_and_counted() {
        let t0 = std::time::Instant::now();
        let s = Duration::from_secs(1);
        let mut w = WarnLimit::new(Duration::from_secs(10));
        assert_eq!(w.hit(t0), Some(0));
        for i in 1..1000 {
            assert_eq!(w.hit(t0 + s * i / 200), None);
        }
        assert_eq!(w.hit(t0 + s * 10), Some(999));
        assert_eq!(w.hit(t0 + s * 11), None);
        assert_eq!(w.hit(t0 + s * 30), Some(1));
        let before = refused_total();
        let _ = refusal();
        assert!(refused_total() > before);
    }

    #[test]
    fn secret_files_must_be_private_and_long_enough() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("fermata-auth-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("secret");
        let k = ClusterKey::create_file(&p).unwrap();
        let again = ClusterKey::from_file(&p).unwrap();
        let (d, l) = pair(&k, &again);
        assert!(d.is_ok() && l.is_ok());
        assert!(ClusterKey::create_file(&p).is_err(), "never overwrites");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = ClusterKey::from_file(&p).unwrap_err();
        assert!(format!("{e:#}").contains("chmod 600"), "{e:#}");
        let short = dir.join("short");
        std::fs::write(&short, "abc\n").unwrap();
        std::fs::set_permissions(&short, std::fs::Permissions::from_mode(0o600)).unwrap();
        let e = ClusterKey::from_file(&short).unwrap_err();
        assert!(format!("{e:#}").contains("at least 16"), "{e:#}");
        let e = ClusterKey::from_file(&dir.join("none")).unwrap_err();
        assert!(format!("{e:#}").contains("cannot open"), "{e:#}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
