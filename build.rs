//! Generates the gRPC service (src/node/grpc) from proto/inference.proto:
//! protox parses it in Rust (no protoc binary needed), tonic-prost-build writes
//! the messages and the server into OUT_DIR.

fn main() {
    println!("cargo:rerun-if-changed=proto/inference.proto");
    let fds = protox::compile(["inference.proto"], ["proto"]).unwrap_or_else(|e| {
        panic!("proto/inference.proto: {e}");
    });
    tonic_prost_build::configure()
        .build_client(false)
        .build_server(true)
        .compile_fds(fds)
        .unwrap_or_else(|e| panic!("generating the gRPC service: {e}"));
}
