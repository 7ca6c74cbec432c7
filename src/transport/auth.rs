//! The cluster's peer authentication: every internal connection (control
//! connections, region reads, the RDMA side channel) opens with a mutual
//! HMAC-SHA256 challenge-response over the cluster secret, before a single byte
//! of the protocol is read. A peer that cannot prove it holds the secret is
//! refused with a logged reason and never reaches the framing code, so it can
//! make a node hold no more than the handshake's fixed 72 bytes, for at most
//! [`HANDSHAKE_TIMEOUT`].
//!
//! Why HMAC challenge-response and not mutual TLS: the one secret file is all an
//! operator has to distribute (no CA, no per-node certificates to issue and
//! renew); authenticating at connection open costs one round trip and nothing
//! per message on the hot path; and the data path over RDMA bypasses the CPU,
//! so TLS could not cover it anyway (there the per-task capabilities are the
//! guard). What it does not give: confidentiality or integrity on the wire
//! against an attacker *on the path* (who can read or hijack an established
//! TCP connection). Deploy the cluster on a private network, or under a
//! network-layer tunnel (WireGuard, IPsec), where that matters; docs/security.md
//! states the threat model.
//!
//! The exchange (both sides at once, 40 + 32 bytes each way):
//!
//! ```text
//! hello  u8[8] "FMTAUTH1", u8[32] nonce (fresh, random)
//! proof  u8[32] HMAC-SHA256(secret, "fermata-auth-v1" | side | own nonce | peer's nonce)
//! ```
//!
//! `side` is `C` for the side that connected and `S` for the side that
//! accepted, so a proof cannot be reflected back to the node that made it.
//! Proofs are compared in constant time.

use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::io::{Read, Write};
use std::path::Path;
use std::time::Duration;

/// The handshake's magic.
const MAGIC: &[u8; 8] = b"FMTAUTH1";
/// Nonce bytes.
const NONCE: usize = 32;
/// A hello: magic and nonce.
pub const HELLO_LEN: usize = 8 + NONCE;
/// A proof: one HMAC-SHA256.
pub const PROOF_LEN: usize = 32;
/// The whole handshake must complete within this.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// The least secret, in bytes (after trimming the file's whitespace).
pub const MIN_SECRET: usize = 16;
/// The most secret read from a file.
const MAX_SECRET: u64 = 4096;

/// Which end of the connection a side is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// It connected.
    Client,
    /// It accepted.
    Server,
}

impl Side {
    fn tag(self) -> u8 {
        match self {
            Side::Client => b'C',
            Side::Server => b'S',
        }
    }
    fn other(self) -> Side {
        match self {
            Side::Client => Side::Server,
            Side::Server => Side::Client,
        }
    }
}

/// The cluster secret every member holds.
#[derive(Clone)]
pub struct ClusterKey {
    secret: Vec<u8>,
}

impl std::fmt::Debug for ClusterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterKey(..)")
    }
}

/// Why a handshake failed (the logged reason).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthError {
    /// The peer's first bytes are not a hello: not a Fermata node, or one
    /// started without the cluster secret.
    NotAMember,
    /// The peer's proof is wrong: it holds another secret.
    WrongSecret,
    /// The peer went away, or the handshake took too long.
    Io(String),
}

impl std::fmt::Display for AuthError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AuthError::NotAMember => f.write_str(
                "the peer did not open the cluster handshake (not a Fermata node of this version, or one started without --cluster-secret-file)",
            ),
            AuthError::WrongSecret => {
                f.write_str("the peer's proof does not match: it holds another cluster secret")
            }
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
            secret: secret.to_vec(),
        })
    }

    /// A fresh random key (32 bytes, as 64 hex digits).
    pub fn generate() -> ClusterKey {
        ClusterKey {
            secret: hex(&random_bytes::<32>()).into_bytes(),
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
        let k = ClusterKey::generate();
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .with_context(|| format!("cannot create the cluster secret file {}", path.display()))?;
        f.write_all(&k.secret)?;
        f.write_all(b"\n")?;
        Ok(k)
    }

    /// The MAC a `side` proves with: over its own nonce, then its peer's.
    fn mac(&self, side: Side, first: &[u8; NONCE], second: &[u8; NONCE]) -> Hmac<Sha256> {
        let mut m = Hmac::<Sha256>::new_from_slice(&self.secret).expect("HMAC takes any key");
        m.update(b"fermata-auth-v1");
        m.update(&[side.tag()]);
        m.update(first);
        m.update(second);
        m
    }

    fn proof(&self, side: Side, own: &[u8; NONCE], peer: &[u8; NONCE]) -> [u8; PROOF_LEN] {
        self.mac(side, own, peer).finalize().into_bytes().into()
    }

    /// Checks the peer's proof (over its side, its nonce, then ours), in
    /// constant time.
    fn check(
        &self,
        side: Side,
        own: &[u8; NONCE],
        peer: &[u8; NONCE],
        proof: &[u8],
    ) -> Result<(), AuthError> {
        self.mac(side.other(), peer, own)
            .verify_slice(proof)
            .map_err(|_| AuthError::WrongSecret)
    }
}

/// Lower-case hex.
fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// One side of a handshake, without I/O: what to send, and what to check.
pub struct Handshake {
    key: ClusterKey,
    side: Side,
    nonce: [u8; NONCE],
}

impl Handshake {
    pub fn new(key: &ClusterKey, side: Side) -> Handshake {
        Handshake {
            key: key.clone(),
            side,
            nonce: random_bytes::<NONCE>(),
        }
    }

    /// Our hello.
    pub fn hello(&self) -> [u8; HELLO_LEN] {
        let mut h = [0u8; HELLO_LEN];
        h[..8].copy_from_slice(MAGIC);
        h[8..].copy_from_slice(&self.nonce);
        h
    }

    /// Takes the peer's hello; our proof to send, and the peer's nonce to
    /// check its proof against.
    pub fn on_hello(
        &self,
        peer: &[u8; HELLO_LEN],
    ) -> Result<([u8; PROOF_LEN], [u8; NONCE]), AuthError> {
        if &peer[..8] != MAGIC {
            return Err(AuthError::NotAMember);
        }
        let mut pn = [0u8; NONCE];
        pn.copy_from_slice(&peer[8..]);
        Ok((self.key.proof(self.side, &self.nonce, &pn), pn))
    }

    /// Checks the peer's proof.
    pub fn check(
        &self,
        peer_nonce: &[u8; NONCE],
        proof: &[u8; PROOF_LEN],
    ) -> Result<(), AuthError> {
        self.key.check(self.side, &self.nonce, peer_nonce, proof)
    }
}

fn io_err(e: std::io::Error) -> AuthError {
    AuthError::Io(e.to_string())
}

/// The handshake on a blocking socket (a connect, before the runtime takes
/// it). The socket's timeouts are set to [`HANDSHAKE_TIMEOUT`] and left unset.
pub fn handshake_std(
    s: &mut std::net::TcpStream,
    key: &ClusterKey,
    side: Side,
) -> Result<(), AuthError> {
    s.set_read_timeout(Some(HANDSHAKE_TIMEOUT))
        .map_err(io_err)?;
    s.set_write_timeout(Some(HANDSHAKE_TIMEOUT))
        .map_err(io_err)?;
    let h = Handshake::new(key, side);
    s.write_all(&h.hello()).map_err(io_err)?;
    let mut peer = [0u8; HELLO_LEN];
    s.read_exact(&mut peer).map_err(io_err)?;
    let (proof, pn) = h.on_hello(&peer)?;
    s.write_all(&proof).map_err(io_err)?;
    let mut theirs = [0u8; PROOF_LEN];
    s.read_exact(&mut theirs).map_err(io_err)?;
    h.check(&pn, &theirs)?;
    s.set_read_timeout(None).map_err(io_err)?;
    s.set_write_timeout(None).map_err(io_err)?;
    Ok(())
}

/// The handshake on a tokio socket (an accept), within [`HANDSHAKE_TIMEOUT`].
pub async fn handshake_async<S>(s: &mut S, key: &ClusterKey, side: Side) -> Result<(), AuthError>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let run = async {
        let h = Handshake::new(key, side);
        s.write_all(&h.hello()).await.map_err(io_err)?;
        let mut peer = [0u8; HELLO_LEN];
        s.read_exact(&mut peer).await.map_err(io_err)?;
        let (proof, pn) = h.on_hello(&peer)?;
        s.write_all(&proof).await.map_err(io_err)?;
        let mut theirs = [0u8; PROOF_LEN];
        s.read_exact(&mut theirs).await.map_err(io_err)?;
        h.check(&pn, &theirs)
    };
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, run).await {
        Ok(r) => r,
        Err(_) => Err(AuthError::Io(format!(
            "no complete handshake within {} s",
            HANDSHAKE_TIMEOUT.as_secs()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(s: &str) -> ClusterKey {
        ClusterKey::new(s.as_bytes()).unwrap()
    }

    /// Runs both sides of a handshake in memory.
    fn pair(a: &ClusterKey, b: &ClusterKey) -> (Result<(), AuthError>, Result<(), AuthError>) {
        let c = Handshake::new(a, Side::Client);
        let s = Handshake::new(b, Side::Server);
        let (cp, sn) = c.on_hello(&s.hello()).unwrap();
        let (sp, cn) = s.on_hello(&c.hello()).unwrap();
        (c.check(&sn, &sp), s.check(&cn, &cp))
    }

    #[test]
    fn members_prove_it_to_each_other_and_others_are_refused() {
        let k = key("0123456789abcdef0123");
        assert_eq!(pair(&k, &k), (Ok(()), Ok(())));
        let other = key("0123456789abcdef0124");
        assert_eq!(
            pair(&k, &other),
            (Err(AuthError::WrongSecret), Err(AuthError::WrongSecret))
        );
        // Not a hello: refused before any proof.
        let s = Handshake::new(&k, Side::Server);
        let mut junk = [0u8; HELLO_LEN];
        junk[..4].copy_from_slice(&[0, 0, 0, 9]);
        assert_eq!(s.on_hello(&junk).err(), Some(AuthError::NotAMember));
    }

    /// A proof made by the server cannot be replayed to it as a client's, and
    /// a proof is bound to both nonces.
    #[test]
    fn proofs_are_bound_to_side_and_nonces() {
        let k = key("0123456789abcdef0123");
        let s = Handshake::new(&k, Side::Server);
        // An attacker opens a connection and sends the server its own hello.
        let (server_proof, echoed) = s.on_hello(&s.hello()).unwrap();
        assert_eq!(s.check(&echoed, &server_proof), Err(AuthError::WrongSecret));
        // A client proof recorded on one connection fails on the next.
        let c = Handshake::new(&k, Side::Client);
        let (cp, _) = c.on_hello(&s.hello()).unwrap();
        let s2 = Handshake::new(&k, Side::Server);
        let (_, cn) = s2.on_hello(&c.hello()).unwrap();
        assert_eq!(s2.check(&cn, &cp), Err(AuthError::WrongSecret));
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
        assert_eq!(pair(&k, &again), (Ok(()), Ok(())));
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
