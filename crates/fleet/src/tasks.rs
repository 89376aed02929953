//! Background tasks owned together (tokio-util's `TaskTracker` and `CancellationToken`): a
//! gateway's (health checks, discovery, the queue's driver, the event plane's) and each
//! worker's (its event ingestion). Spawned through [`Tasks::spawn`], a task ends at its next
//! await once the group is stopped; [`Tasks::stopped`] also waits until all have ended.

use std::future::Future;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// How long [`Tasks::stopped`] waits for the tasks to end.
const STOP_WAIT: Duration = Duration::from_secs(5);

/// A group of background tasks stopped together.
#[derive(Clone, Debug, Default)]
pub struct Tasks {
    tracker: TaskTracker,
    cancel: CancellationToken,
}

impl Tasks {
    /// An empty group.
    pub fn new() -> Self {
        Self::default()
    }

    /// Runs `task` in the group until it ends or the group is stopped (a group already
    /// stopped ends it at once).
    pub fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) {
        let cancel = self.cancel.clone();
        self.tracker.spawn(async move {
            tokio::select! {
                biased;
                () = cancel.cancelled() => {}
                () = task => {}
            }
        });
    }

    /// Stops every task of the group at its next await; spawns after this end at once.
    pub fn stop(&self) {
        self.cancel.cancel();
        self.tracker.close();
    }

    /// Stops the group and waits (at most 5 s) until its tasks have ended; false when some
    /// had not.
    pub async fn stopped(&self) -> bool {
        self.stop();
        tokio::time::timeout(STOP_WAIT, self.tracker.wait())
            .await
            .is_ok()
    }

    /// Tasks still running.
    pub fn len(&self) -> usize {
        self.tracker.len()
    }

    /// Whether no task is running.
    pub fn is_empty(&self) -> bool {
        self.tracker.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn stopping_ends_every_task_at_its_next_await_and_waits_for_them() {
        let tasks = Tasks::new();
        let (tx, mut rx) = tokio::sync::mpsc::channel::<u32>(8);
        for i in 0..3 {
            let tx = tx.clone();
            tasks.spawn(async move {
                let _ = tx.send(i).await;
                std::future::pending::<()>().await;
            });
        }
        drop(tx);
        for _ in 0..3 {
            assert!(rx.recv().await.is_some());
        }
        assert_eq!(tasks.len(), 3);
        assert!(tasks.stopped().await);
        assert!(tasks.is_empty());
        // Every sender is gone with its task.
        assert!(rx.recv().await.is_none());
        // Spawned after the stop: ended at once.
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        tasks.spawn(async move {
            std::future::pending::<()>().await;
            let _ = tx.send(());
        });
        assert!(tasks.stopped().await);
        assert!(rx.await.is_err());
    }
}
