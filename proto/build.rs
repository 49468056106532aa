//! Generates the protobuf and gRPC code from `geostate/v1/` with a vendored `protoc`, so
//! the build needs no system protobuf compiler.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "geostate/v1/crdt.proto",
        "geostate/v1/update.proto",
        "geostate/v1/state.proto",
        "geostate/v1/savepoint.proto",
        "geostate/v1/raft.proto",
        "geostate/v1/function.proto",
    ];
    for proto in protos {
        println!("cargo:rerun-if-changed={proto}");
    }
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // SAFETY: build scripts are single-threaded; prost-build reads PROTOC from the env.
    #[allow(unsafe_code)]
    unsafe {
        std::env::set_var("PROTOC", protoc)
    };
    let descriptors =
        std::path::PathBuf::from(std::env::var("OUT_DIR")?).join("geostate_descriptor.bin");
    tonic_prost_build::configure()
        .file_descriptor_set_path(descriptors)
        .compile_protos(&protos, &["."])?;
    Ok(())
}
