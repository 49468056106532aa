//! What geostate's server and its tools share without the server's storage, Kafka and
//! Raft: the code generated from `geostate/v1/*.proto` ([`pb`]) and the deterministic
//! load generators ([`workload`]). The Jepsen harness and the chaos drills depend on this
//! crate only, so they build without RocksDB, librdkafka or the AWS SDK.

pub mod pb;
pub mod workload;
