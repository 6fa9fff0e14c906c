//! Generates the gRPC messages from the project's .proto files with protox (pure Rust: no
//! protoc binary needed). `proto/` holds copies of `corral/protocol/proto/grpc_service.proto`
//! and `corral/_proto/model_config.proto`; `tests/test_proto_copies.py` keeps them equal.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/grpc_service.proto");
    println!("cargo:rerun-if-changed=proto/model_config.proto");
    let files = protox::compile(["grpc_service.proto"], ["proto"])?;
    let mut config = prost_build::Config::new();
    // Bytes fields as `bytes::Bytes`: decoded from a `Bytes` message they are slices of it,
    // so raw_input_contents reach numpy without a copy.
    config.bytes(["."]);
    config.compile_fds(files)?;
    Ok(())
}
