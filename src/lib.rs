//! geostate: geo-replicated, active-active state. Each region ingests events from its own
//! Kafka cluster into CRDT state, replicates deltas to the other regions over Kafka topics
//! mirrored by MirrorMaker 2, and hands keys that must not be merged to one owner at a
//! time under Raft-granted leases with fencing epochs. See ARCHITECTURE.md.
//!
//! Dependencies point down, in the order ARCHITECTURE.md states ("Dependency order",
//! held by `tests/layering.rs`).
//!
//! ```text
//!  gRPC Update ─┐
//!  producers ───┴► Kafka geostate.updates ─► ingest ─► store (RocksDB: state + offsets
//!                  (split by partition, each part under  │         + outbox, one batch)
//!                   its partition's writer)              │
//!  <remote>.geostate.deltas ─► replication::merger ──────┤ (merge, same store)
//!                              replication::shipper ◄────┘ outbox ─► geostate.deltas
//!  api (gRPC State/Admin) reads the store and waits on its partition's handle
//!  lease group (openraft over gRPC, a member per region + a witness) ─► leases: epochs
//!      for owned writes (api), for ingest's epoch check and the merge's fences
//!  checkpoint: store files ─► S3 (incremental, manifests); restore on an empty disk
//!
//!  cli          the `geostate` command line: clap types, one module per subcommand family
//!  node         wiring: open, spawn every task into one set, serve, stop in order
//!  keeper       takes and gives up partitions as the region's Kafka group assigns them
//!  api          tonic services, pb conversions, the one error → Status map
//!  replication  inbound merge of remote deltas, transactional outbound shipping with
//!               resume points, bootstrap of an empty disk, freshness
//!  partition    the node's partitions: a handle per partition and term
//!  ingest       decode and check update records, apply batches (pure), the ingest task
//!  lease        the lease group (openraft storage, gRPC network, member, witness), the
//!               region's lease manager and clock check; PURE table, holdings, invariants
//!  checkpoint   incremental checkpoints to S3 or a folder, restore, savepoints
//!  replay       `geostate dlq replay`: late or dead-lettered records back into the log
//!  security     TLS on every listener and client (reloaded), API roles, member identity
//!  store        RocksDB column families, a writer per partition, the one-WriteBatch
//!               commit
//!  log          Kafka clients, positioning, consumed records, dead-letter headers
//!  config       TOML → validated Config
//!  sink, pricer, function
//!               outputs into PostgreSQL; surge prices; user-function sidecars
//!  peers        evicts a node of the region whose port refuses connections
//!  metrics      every metric name; the Prometheus endpoint
//!  shutdown     the stop signal tasks watch
//!  supervise    the background tasks a node stops without
//!  top          `geostate top`: the whole cluster on one screen (rendering)
//!  window       PURE event-time windows: slices, closing, lateness, watermarks
//!  crdt         PURE counters, LWW register, order stamps, deltas and their encoding
//!  clock        PURE injected physical clock, hybrid logical clock with max-offset guard
//!  pb           generated protobuf code (re-exported from the geostate-proto crate, proto/)
//!  workload     load generation (Zipf, geohashes; re-exported from geostate-proto)
//! ```

pub mod api;
pub mod checkpoint;
pub mod cli;
pub mod clock;
pub mod config;
pub mod crdt;
pub mod function;
pub mod ingest;
pub mod keeper;
pub mod lease;
pub mod log;
pub mod metrics;
pub mod node;
pub mod partition;
pub mod peers;
pub mod pricer;
pub use geostate_proto::pb;
pub mod replay;
pub mod replication;
pub mod security;
pub mod shutdown;
pub mod sink;
pub mod store;
pub mod supervise;
pub mod top;
pub mod window;
pub use geostate_proto::workload;

#[cfg(test)]
mod fuzz;

/// A file of this repository, for tests: under the `CARGO_MANIFEST_DIR` cargo sets when
/// it runs the test, not the one compiled in. Cargo reuses a binary built in another
/// checkout that shares the target directory (CI's clone and a working copy), and the
/// compiled-in folder is then the other checkout's, or gone.
#[cfg(test)]
pub(crate) fn repo_file(relative: &str) -> std::path::PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(
            || env!("CARGO_MANIFEST_DIR").into(),
            std::path::PathBuf::from,
        )
        .join(relative)
}
