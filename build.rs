//! Generates the protobuf and gRPC code from `proto/` with a vendored `protoc`, so the
//! build needs no system protobuf compiler.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = ["proto/geostate/v1/crdt.proto"];
    for proto in protos {
        println!("cargo:rerun-if-changed={proto}");
    }
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // SAFETY: build scripts are single-threaded; prost-build reads PROTOC from the env.
    #[allow(unsafe_code)]
    unsafe {
        std::env::set_var("PROTOC", protoc)
    };
    tonic_prost_build::configure().compile_protos(&protos, &["proto"])?;
    Ok(())
}
