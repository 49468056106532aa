//! The lease group's async runtime: openraft's tokio runtime with a floor under its timeouts.
//!
//! openraft 0.9 bounds each `AppendEntries` by the heartbeat interval and each `Vote` by
//! the election timeout. A member whose round trip to the others is longer than a
//! heartbeat (a WAN link at 100 ± 50 ms a packet against the 100 ms default) then never
//! completes one: the leader's calls are cancelled before they arrive, the others hear
//! nothing, elect, and the shards whose renewals went through the old leader lapse. With a
//! floor of [`RPC_TIMEOUT_FLOOR`], a slow link carries the log as slowly as it is, and a
//! leader is replaced only when the others do not hear it at all (`election.rs`), or hands
//! the lead to a voter whose links are faster (`placement.rs`). The
//! calls' gRPC deadlines have the same floor (`network::Peer`). The runtime's only timed
//! calls are openraft's RPC timeouts (the node never calls `Raft::wait`), so the floor
//! changes nothing else.

use std::future::Future;
use std::time::Duration;

use openraft::{AsyncRuntime, OptionalSend, TokioInstant, TokioRuntime};

/// The shortest time openraft may give a lease-group RPC: longer than any round trip a
/// region pair should have, shorter than a lease.
pub const RPC_TIMEOUT_FLOOR: Duration = Duration::from_secs(1);

/// [`TokioRuntime`], with every timeout at least [`RPC_TIMEOUT_FLOOR`].
#[derive(Debug, Default, PartialEq, Eq)]
pub struct LeaseRuntime;

impl AsyncRuntime for LeaseRuntime {
    type JoinError = <TokioRuntime as AsyncRuntime>::JoinError;
    type JoinHandle<T: OptionalSend + 'static> = <TokioRuntime as AsyncRuntime>::JoinHandle<T>;
    type Sleep = <TokioRuntime as AsyncRuntime>::Sleep;
    type Instant = TokioInstant;
    type TimeoutError = <TokioRuntime as AsyncRuntime>::TimeoutError;
    type Timeout<R, T: Future<Output = R> + OptionalSend> =
        <TokioRuntime as AsyncRuntime>::Timeout<R, T>;
    type ThreadLocalRng = <TokioRuntime as AsyncRuntime>::ThreadLocalRng;
    type OneshotSender<T: OptionalSend> = <TokioRuntime as AsyncRuntime>::OneshotSender<T>;
    type OneshotReceiverError = <TokioRuntime as AsyncRuntime>::OneshotReceiverError;
    type OneshotReceiver<T: OptionalSend> = <TokioRuntime as AsyncRuntime>::OneshotReceiver<T>;

    fn spawn<T>(future: T) -> Self::JoinHandle<T::Output>
    where
        T: Future + OptionalSend + 'static,
        T::Output: OptionalSend + 'static,
    {
        TokioRuntime::spawn(future)
    }

    fn sleep(duration: Duration) -> Self::Sleep {
        TokioRuntime::sleep(duration)
    }

    fn sleep_until(deadline: Self::Instant) -> Self::Sleep {
        TokioRuntime::sleep_until(deadline)
    }

    fn timeout<R, F: Future<Output = R> + OptionalSend>(
        duration: Duration,
        future: F,
    ) -> Self::Timeout<R, F> {
        TokioRuntime::timeout(duration.max(RPC_TIMEOUT_FLOOR), future)
    }

    fn timeout_at<R, F: Future<Output = R> + OptionalSend>(
        deadline: Self::Instant,
        future: F,
    ) -> Self::Timeout<R, F> {
        TokioRuntime::timeout_at(
            deadline.max(TokioInstant::now() + RPC_TIMEOUT_FLOOR),
            future,
        )
    }

    fn is_panic(join_error: &Self::JoinError) -> bool {
        TokioRuntime::is_panic(join_error)
    }

    fn thread_rng() -> Self::ThreadLocalRng {
        TokioRuntime::thread_rng()
    }

    fn oneshot<T>() -> (Self::OneshotSender<T>, Self::OneshotReceiver<T>)
    where
        T: OptionalSend,
    {
        TokioRuntime::oneshot()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_timeout_shorter_than_the_floor_waits_for_the_floor() {
        let started = std::time::Instant::now();
        let slow = tokio::time::sleep(Duration::from_millis(300));
        assert!(
            LeaseRuntime::timeout(Duration::from_millis(100), slow)
                .await
                .is_ok()
        );
        let stuck = std::future::pending::<()>();
        assert!(
            LeaseRuntime::timeout(Duration::from_millis(100), stuck)
                .await
                .is_err()
        );
        assert!(started.elapsed() >= RPC_TIMEOUT_FLOOR + Duration::from_millis(300));
    }
}
