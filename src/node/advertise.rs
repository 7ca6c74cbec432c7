//! The address a node tells its peers to dial ([`advertised`]): the socket it
//! bound, with the host replaced by the one it advertises. A node bound to a
//! wildcard (`0.0.0.0`, `[::]`, as a pod binds) cannot tell peers that address:
//! without `--advertise HOST` it takes `$POD_IP` (Kubernetes' downward API),
//! else the first non-loopback address its host name resolves to, else it
//! fails and says so.

use anyhow::{bail, Result};
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};

/// The environment variable a pod's spec sets to its IP (downward API).
pub const POD_IP_ENV: &str = "POD_IP";

/// Host and port as an address string (IPv6 in brackets).
fn join(host: &str, port: u16) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// The address peers dial for a socket bound at `bound` (as the transport
/// reports it; a name that is not host:port, an in-process one, is kept):
/// `advertise`'s host with the bound port; for a wildcard bind without one,
/// `$POD_IP` or the host name's first non-loopback address.
pub fn advertised(bound: &str, advertise: Option<&str>) -> Result<String> {
    advertised_with(bound, advertise, std::env::var(POD_IP_ENV).ok())
}

/// [`advertised`] with `$POD_IP`'s value given.
fn advertised_with(bound: &str, advertise: Option<&str>, pod_ip: Option<String>) -> Result<String> {
    let Ok(sa) = bound.parse::<SocketAddr>() else {
        return Ok(bound.to_string());
    };
    if let Some(h) = advertise.map(str::trim).filter(|h| !h.is_empty()) {
        if h.parse::<SocketAddr>().is_ok() || (h.contains(':') && h.parse::<IpAddr>().is_err()) {
            bail!("--advertise takes a host (a name or an IP), not `{h}`: the port is the socket's own");
        }
        return Ok(join(h, sa.port()));
    }
    if !sa.ip().is_unspecified() {
        return Ok(bound.to_string());
    }
    if let Some(ip) = pod_ip {
        let ip = ip.trim();
        if ip.parse::<IpAddr>().is_ok() {
            return Ok(join(ip, sa.port()));
        }
        bail!("${POD_IP_ENV} is `{ip}`, not an IP address");
    }
    if let Some(ip) = host_ip() {
        return Ok(join(&ip.to_string(), sa.port()));
    }
    bail!(
        "bound to {bound} (every interface) but no address to tell peers: set --advertise HOST (or ${POD_IP_ENV}); this host's name resolves to no address other than loopback"
    )
}

/// The first non-loopback address this host's name resolves to.
fn host_ip() -> Option<IpAddr> {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes into our buffer.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return None;
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    let name = std::str::from_utf8(&buf[..end]).ok()?;
    (name, 0u16)
        .to_socket_addrs()
        .ok()?
        .map(|a| a.ip())
        .find(|ip| !ip.is_loopback() && !ip.is_unspecified())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_is_replaced_and_the_port_kept() {
        assert_eq!(
            advertised("0.0.0.0:7000", Some("fe-0.fermata")).unwrap(),
            "fe-0.fermata:7000"
        );
        assert_eq!(
            advertised("127.0.0.1:7000", Some("10.0.0.5")).unwrap(),
            "10.0.0.5:7000"
        );
        assert_eq!(
            advertised("[::]:80", Some("fd00::1")).unwrap(),
            "[fd00::1]:80"
        );
        // A specific bind is advertised as it is; an in-process name too.
        assert_eq!(advertised("127.0.0.1:9", None).unwrap(), "127.0.0.1:9");
        assert_eq!(advertised("region:3", None).unwrap(), "region:3");
        let e = advertised("0.0.0.0:1", Some("10.0.0.5:99")).unwrap_err();
        assert!(e.to_string().contains("takes a host"), "{e}");
    }

    #[test]
    fn a_wildcard_bind_takes_the_pod_ip() {
        let got = advertised_with("0.0.0.0:7100", None, Some("10.1.2.3".into()));
        assert_eq!(got.unwrap(), "10.1.2.3:7100");
        let bad = advertised_with("0.0.0.0:7100", None, Some("not an ip".into()));
        assert!(bad.unwrap_err().to_string().contains("not an IP address"));
        // --advertise wins over $POD_IP.
        let a = advertised_with("0.0.0.0:7100", Some("fe"), Some("10.1.2.3".into()));
        assert_eq!(a.unwrap(), "fe:7100");
    }
}
