//! Stand-in for the RDMA transport in builds without the `rdma` feature.

/// The error `--transport rdma` gives in a build without the feature.
pub fn not_built() -> anyhow::Error {
    anyhow::anyhow!(
        "this fermata was built without RDMA support; rebuild with `cargo build --release --features rdma` \
         (needs cmake and libclang-dev; scripts/setup.sh installs them) on a host with an RDMA device"
    )
}
