//! Chaos and failover drills against a running geostate deployment. Empty until the
//! lease and checkpoint paths exist; the drills will use only the public gRPC API and the
//! binaries, never the library.
