//! What geostate's server and its tools share without the server's storage, Kafka and
//! Raft: the code generated from `geostate/v1/*.proto` ([`pb`]), the outputs topic's
//! JSON record ([`outputs`]), the deterministic load generators ([`workload`]) and what
//! a client needs to fail over ([`never_sent`]). The Jepsen harness and the chaos drills
//! depend on this crate only, so they build without RocksDB, librdkafka or the AWS SDK.

pub mod outputs;
pub mod pb;
pub mod workload;

/// Whether a call failed before its request was sent: the connection was refused (no
/// process listens at the address), so the call may go to another address of the same
/// region without being applied twice. An answer from a server, even `UNAVAILABLE`, may
/// come after the write was applied.
pub fn never_sent(status: &tonic::Status) -> bool {
    let mut source = std::error::Error::source(status);
    while let Some(e) = source {
        if e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionRefused)
        {
            return true;
        }
        source = e.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A call to a port nobody listens on failed before it was sent; a server's answer
    /// did not.
    #[tokio::test]
    async fn only_a_refused_connection_counts_as_never_sent() {
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = closed.local_addr().unwrap();
        drop(closed);
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect_lazy();
        let refused = pb::state_client::StateClient::new(channel)
            .get(pb::GetRequest::default())
            .await
            .unwrap_err();
        assert!(never_sent(&refused), "{refused:?}");
        assert!(!never_sent(&tonic::Status::unavailable("partition moving")));
    }
}
