//! Jepsen-style histories and checkers for geostate (grows with the replication and lease paths).
