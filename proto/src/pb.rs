//! Code generated from `geostate/v1/*.proto` (package `geostate.v1`) by `build.rs`. The
//! server's domain types never leak these structs; its conversions live next to the
//! domain type they encode.

#![allow(clippy::all, clippy::pedantic, missing_docs)]

tonic::include_proto!("geostate.v1");

/// Encoded descriptors of every message and service, for gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("geostate_descriptor");
