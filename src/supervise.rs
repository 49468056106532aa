//! The node's background tasks that it cannot serve correctly without (the mergers, the
//! lease manager, the checkpointer, the metrics server): one that ends before the node is
//! asked to stop — an error, a panic, or a return nobody expected — stops the node, named,
//! and counted in `geostate_task_failures_total{task}`. A node that kept serving would
//! answer with ever staler state and report itself healthy; stopped, its health service
//! is gone and whatever runs it (systemd, Kubernetes, `cluster.py up`) starts it again.

use std::collections::HashMap;
use std::fmt::Display;
use std::future::Future;

use tokio::task::{AbortHandle, Id, JoinSet};

use crate::metrics as m;

/// How a watched task ended.
pub type Ended = (String, Result<(), String>);

#[derive(Default)]
pub struct Essential {
    tasks: JoinSet<Result<(), String>>,
    names: HashMap<Id, String>,
}

impl Essential {
    /// Runs `task` as `name`; its handle aborts it (a shutdown that need not wait for it).
    pub fn spawn<E: Display>(
        &mut self,
        name: impl Into<String>,
        task: impl Future<Output = Result<(), E>> + Send + 'static,
    ) -> AbortHandle {
        let handle = self
            .tasks
            .spawn(async move { task.await.map_err(|e| e.to_string()) });
        self.names.insert(handle.id(), name.into());
        handle
    }

    /// The next task to end, its name and how (`None`: no task left).
    pub async fn next_ended(&mut self) -> Option<Ended> {
        let (id, outcome) = match self.tasks.join_next_with_id().await? {
            Ok((id, outcome)) => (id, outcome),
            Err(e) if e.is_panic() => (e.id(), Err("panicked".into())),
            Err(e) => (e.id(), Err("was cancelled".into())),
        };
        Some((self.names.remove(&id).unwrap_or_default(), outcome))
    }

    /// Why the node must stop now that `task` ended before shutdown.
    pub fn failure((task, outcome): Ended) -> String {
        metrics::counter!(m::TASK_FAILURES, "task" => task.clone()).increment(1);
        let why = outcome.err().unwrap_or_else(|| "returned".into());
        format!("{task} {why} while the node was running")
    }

    /// After shutdown was asked for: waits for every task still running (aborted ones end
    /// at once) and logs the failures.
    pub async fn finish(mut self) {
        while let Some((task, outcome)) = self.next_ended().await {
            match outcome {
                Ok(()) => {}
                Err(why) if why == "was cancelled" => {}
                Err(why) => tracing::error!(%task, %why, "a task failed while the node stopped"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_task_that_ends_early_is_named_with_how_it_ended() {
        let mut essential = Essential::default();
        essential.spawn("forever", async {
            std::future::pending::<()>().await;
            Ok::<(), String>(())
        });
        essential.spawn("merging eu-west-1's deltas", async {
            tokio::time::sleep(Duration::from_millis(10)).await;
            Err::<(), _>("no space left on device")
        });
        let ended = essential.next_ended().await;
        assert_eq!(
            ended.map(Essential::failure).as_deref(),
            Some("merging eu-west-1's deltas no space left on device while the node was running")
        );

        essential.spawn("checkpointer", async {
            tokio::time::sleep(Duration::from_millis(10)).await;
            let stamps: Vec<u64> = Vec::new();
            // a panic in a task (here an index out of range) is caught and named
            let _ = stamps[usize::from(stamps.is_empty())];
            Ok::<(), String>(())
        });
        let (name, outcome) = essential.next_ended().await.expect("a task ended");
        assert_eq!(
            (name.as_str(), outcome),
            ("checkpointer", Err("panicked".into()))
        );

        essential.spawn("metrics server", async { Ok::<(), String>(()) });
        let (name, outcome) = essential.next_ended().await.expect("a task ended");
        assert_eq!(
            Essential::failure((name, outcome)),
            "metrics server returned while the node was running"
        );
    }
}
