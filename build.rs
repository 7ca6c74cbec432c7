//! Generates Rust from the protobuf schemas, in Rust (protox parses them, no
//! protoc binary needed):
//! - proto/inference.proto: the gRPC service (src/node/grpc); tonic-prost-build
//!   writes the messages and the server into OUT_DIR (its model configuration is
//!   model_config.proto's);
//! - proto/model_config.proto: Triton's model configuration (src/triton_repo.rs);
//!   its messages, and its descriptor set (`model_config.fds`), which the
//!   text-format parser of `config.pbtxt` files reads at run time.

use protox::prost::Message;

fn main() {
    println!("cargo:rerun-if-changed=proto/inference.proto");
    println!("cargo:rerun-if-changed=proto/model_config.proto");
    let fds = protox::compile(["inference.proto"], ["proto"]).unwrap_or_else(|e| {
        panic!("proto/inference.proto: {e}");
    });
    tonic_prost_build::configure()
        .build_client(false)
        .build_server(true)
        // The model configuration's types are generated once, below.
        .extern_path(".fermata.triton", "crate::triton_repo::pb")
        // A request's raw inputs as views of the message's buffer, not copies.
        .bytes(".inference.ModelInferRequest.raw_input_contents")
        .compile_fds(fds)
        .unwrap_or_else(|e| panic!("generating the gRPC service: {e}"));

    let fds = protox::compile(["model_config.proto"], ["proto"]).unwrap_or_else(|e| {
        panic!("proto/model_config.proto: {e}");
    });
    let out = std::path::PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR"));
    std::fs::write(out.join("model_config.fds"), fds.encode_to_vec())
        .unwrap_or_else(|e| panic!("writing model_config.fds: {e}"));
    tonic_prost_build::configure()
        .build_client(false)
        .build_server(false)
        .compile_fds(fds)
        .unwrap_or_else(|e| panic!("generating the model configuration's messages: {e}"));
}
