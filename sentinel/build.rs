//! Generates the gRPC server (and a client for the tests) of KEDA's external scaler API from
//! the vendored `proto/externalscaler.proto`. protox parses the file in Rust, so building
//! needs no `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/externalscaler.proto";
    println!("cargo:rerun-if-changed={proto}");
    let descriptors = protox::compile([proto], ["proto"])?;
    tonic_prost_build::configure()
        .build_transport(false)
        .compile_fds(descriptors)?;
    Ok(())
}
