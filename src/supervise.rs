//! Every long-running task of a node, in one set ([`Tasks`]): ingest, the shipper, each
//! remote's merger, the lease manager, the checkpointer, the metrics server and the lag
//! reporter. One that ends before the node is asked to stop — an error, a panic, or a
//! return nobody expected — stops the node, named, and counted in
//! `geostate_task_failures_total{task}`. On stop, each task is either waited for (it
//! finishes its batch, its release) or aborted ([`OnStop`]), in one sequence. A node that kept serving would
//! answer with ever staler state and report itself healthy; stopped, its health service
//! is gone and whatever runs it (systemd, Kubernetes, `cluster.py up`) starts it again.

use std::collections::HashMap;
use std::fmt::Display;
use std::future::Future;

use tokio::task::{AbortHandle, Id, JoinSet};

use crate::metrics as m;

/// How a watched task ended.
pub type Ended = (String, Result<(), String>);

/// What shutdown does with a task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnStop {
    /// Wait for it: it watches the stop signal and finishes its work (a batch, a release).
    Finish,
    /// Abort it: cutting it short loses nothing (a checkpoint never committed, a metrics
    /// listener, a gauge refresher).
    Abort,
}

/// Every long-running task of a node, in one set.
#[derive(Default)]
pub struct Tasks {
    tasks: JoinSet<Result<(), String>>,
    names: HashMap<Id, String>,
    /// The `OnStop::Abort` tasks.
    aborted_on_stop: HashMap<Id, AbortHandle>,
}

impl Tasks {
    /// Runs `task` as `name`.
    pub fn spawn<E: Display>(
        &mut self,
        name: impl Into<String>,
        on_stop: OnStop,
        task: impl Future<Output = Result<(), E>> + Send + 'static,
    ) {
        let handle = self
            .tasks
            .spawn(async move { task.await.map_err(|e| e.to_string()) });
        self.names.insert(handle.id(), name.into());
        if on_stop == OnStop::Abort {
            self.aborted_on_stop.insert(handle.id(), handle);
        }
    }

    /// The next task to end, its name and how (`None`: no task left).
    pub async fn next_ended(&mut self) -> Option<Ended> {
        let (id, outcome) = match self.tasks.join_next_with_id().await? {
            Ok((id, outcome)) => (id, outcome),
            Err(e) if e.is_panic() => (e.id(), Err("panicked".into())),
            Err(e) if self.aborted_on_stop.contains_key(&e.id()) => (e.id(), Ok(())),
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

    /// After the stop signal was sent: aborts the `Abort` tasks, waits for the rest, and
    /// returns the first failure among them (each is logged).
    pub async fn finish(mut self) -> Result<(), String> {
        for handle in self.aborted_on_stop.values() {
            handle.abort();
        }
        let mut first = Ok(());
        while let Some((task, outcome)) = self.next_ended().await {
            if let Err(why) = outcome {
                tracing::error!(%task, %why, "a task failed while the node stopped");
                if first.is_ok() {
                    first = Err(format!("{task} {why} while the node stopped"));
                }
            }
        }
        first
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    #[tokio::test]
    async fn a_task_that_ends_early_is_named_with_how_it_ended() {
        let mut tasks = Tasks::default();
        tasks.spawn("forever", OnStop::Finish, async {
            std::future::pending::<()>().await;
            Ok::<(), String>(())
        });
        tasks.spawn("merging eu-west-1's deltas", OnStop::Finish, async {
            tokio::time::sleep(Duration::from_millis(10)).await;
            Err::<(), _>("no space left on device")
        });
        let ended = tasks.next_ended().await;
        assert_eq!(
            ended.map(Tasks::failure).as_deref(),
            Some("merging eu-west-1's deltas no space left on device while the node was running")
        );

        tasks.spawn("checkpointer", OnStop::Abort, async {
            tokio::time::sleep(Duration::from_millis(10)).await;
            let stamps: Vec<u64> = Vec::new();
            // a panic in a task (here an index out of range) is caught and named
            let _ = stamps[usize::from(stamps.is_empty())];
            Ok::<(), String>(())
        });
        let (name, outcome) = tasks.next_ended().await.expect("a task ended");
        assert_eq!(
            (name.as_str(), outcome),
            ("checkpointer", Err("panicked".into()))
        );

        tasks.spawn("metrics server", OnStop::Abort, async {
            Ok::<(), String>(())
        });
        let (name, outcome) = tasks.next_ended().await.expect("a task ended");
        assert_eq!(
            Tasks::failure((name, outcome)),
            "metrics server returned while the node was running"
        );
    }

    #[tokio::test]
    async fn finish_aborts_what_may_be_cut_short_waits_for_the_rest_and_reports_a_failure() {
        let (stop, watch) = tokio::sync::watch::channel(false);
        let mut tasks = Tasks::default();
        tasks.spawn("the metrics server", OnStop::Abort, async {
            std::future::pending::<()>().await;
            Ok::<(), String>(())
        });
        let (finished, mut told) = (std::sync::Arc::new(AtomicBool::new(false)), watch.clone());
        let done = finished.clone();
        tasks.spawn("ingest", OnStop::Finish, async move {
            crate::shutdown::stopped(&mut told).await;
            tokio::time::sleep(Duration::from_millis(20)).await;
            done.store(true, Ordering::SeqCst);
            Ok::<(), String>(())
        });
        let mut told = watch.clone();
        tasks.spawn("the shipper", OnStop::Finish, async move {
            crate::shutdown::stopped(&mut told).await;
            Err::<(), _>("the transaction was fenced")
        });
        stop.send(true).unwrap();
        assert_eq!(
            tasks.finish().await,
            Err("the shipper the transaction was fenced while the node stopped".into())
        );
        assert!(
            finished.load(Ordering::SeqCst),
            "finish returned before ingest finished"
        );
    }
}
