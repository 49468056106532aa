//! Chaos and failover drills against a running geostate deployment (grows with the lease and checkpoint paths).
