"""The local multi-region cluster behind `regions/local/cluster.py`, by concern: common
(versions, paths), install, procs, kafka (brokers and MirrorMaker 2), s3, nodes (geostate
nodes and the witness), lifecycle (up/down/status and the single-part commands), net
(network faults), cli."""
