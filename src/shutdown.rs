//! The stop signal every long-running task watches: a `watch` channel that turns true
//! once, when the node shuts down.

use tokio::sync::watch;

/// Completes once `stop` turns true, or once its sender is gone.
pub async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|stop| *stop).await;
}
