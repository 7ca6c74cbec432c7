//! The RDMA transport at start-up.
//!
//! With `--features rdma`: on a machine without an RDMA device (CI, laptops) opening
//! the transport must fail with the clear "no RDMA device found" message, both
//! directly and through `transport::by_name("rdma")`; on a machine with one, opening
//! must succeed. Without the feature, `by_name("rdma")` must say the build lacks it.

use fermata::transport;

#[cfg(feature = "rdma")]
mod with_feature {
    use super::*;
    use fermata::transport::rdma::Rdma;

    /// Whether libibverbs lists any device here (the tests expect opposite things).
    fn devices_here() -> bool {
        ibverbs::devices().map(|l| !l.is_empty()).unwrap_or(false)
    }

    fn assert_no_device_error(e: &anyhow::Error) {
        let msg = format!("{e:#}");
        eprintln!("rdma transport here: {msg}");
        assert!(
            msg.contains("no RDMA device found"),
            "unexpected error: {msg}"
        );
        assert!(
            msg.contains("--transport tcp"),
            "the error should point at the tcp transport: {msg}"
        );
    }

    #[test]
    fn open_fails_clearly_without_a_device() {
        match Rdma::open(None) {
            Ok(r) => {
                assert!(
                    devices_here(),
                    "opened an RDMA transport with no device listed"
                );
                assert!(!r.device_name().is_empty());
            }
            Err(e) => {
                if devices_here() {
                    panic!("a device is listed but opening it failed: {e:#}");
                }
                assert_no_device_error(&e);
            }
        }
    }

    #[test]
    fn by_name_fails_clearly_without_a_device() {
        match transport::by_name("rdma") {
            Ok(t) => {
                assert!(
                    devices_here(),
                    "by_name(rdma) succeeded with no device listed"
                );
                assert_eq!(t.name(), "rdma");
            }
            Err(e) => {
                if devices_here() {
                    panic!("a device is listed but by_name(rdma) failed: {e:#}");
                }
                assert_no_device_error(&e);
            }
        }
    }

    #[test]
    fn unknown_device_name_is_refused() {
        let e = Rdma::open(Some("no-such-rdma-device-0"))
            .err()
            .expect("a device that does not exist must not open");
        let msg = format!("{e:#}");
        if devices_here() {
            assert!(msg.contains("no-such-rdma-device-0"), "{msg}");
        } else {
            assert_no_device_error(&e);
        }
    }
}

#[cfg(not(feature = "rdma"))]
#[test]
fn by_name_says_the_build_lacks_rdma() {
    let e = transport::by_name("rdma")
        .err()
        .expect("a build without the rdma feature has no rdma transport");
    let msg = format!("{e:#}");
    assert!(
        msg.contains("built without RDMA support") && msg.contains("--features rdma"),
        "unexpected error: {msg}"
    );
}
