//! The closed loop: `concurrency` slots, each running one conversation (or synthetic request)
//! after another; the concurrency can change while running without cutting conversations
//! short ([`Control`]).

use crate::job::Ctx;
use crate::RunResult;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::watch;

/// The most closed-loop slots (or open-loop jobs in flight) a run may grow to.
pub const MAX_CONCURRENCY: usize = 100_000;

/// Steers a running load: its concurrency (changed without cutting conversations short),
/// stopping, and cancelling.
#[derive(Clone, Debug)]
pub struct Control {
    tx: Arc<watch::Sender<Ctl>>,
}

/// The control state the tasks watch.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Ctl {
    pub concurrency: usize,
    /// Start no more turns.
    pub stop: bool,
    /// Cut the turns in flight too.
    pub cancel: bool,
}

impl Control {
    pub(crate) fn new(concurrency: usize) -> (Self, watch::Receiver<Ctl>) {
        let (tx, rx) = watch::channel(Ctl {
            concurrency,
            stop: false,
            cancel: false,
        });
        (Self { tx: Arc::new(tx) }, rx)
    }

    /// Sets the conversations in flight (closed loop). Slots above the new level finish
    /// their current conversation, then wait; new slots start at once.
    pub fn set_concurrency(&self, n: usize) {
        let n = n.clamp(1, MAX_CONCURRENCY);
        self.tx.send_modify(|c| c.concurrency = n);
    }

    /// The concurrency asked for.
    pub fn concurrency(&self) -> usize {
        self.tx.borrow().concurrency
    }

    /// Whether the load was told to stop.
    pub fn is_stopped(&self) -> bool {
        self.tx.borrow().stop
    }

    /// Starts no more turns; turns in flight finish.
    pub fn stop(&self) {
        self.tx.send_modify(|c| c.stop = true);
    }

    /// Starts no more turns and cuts the ones in flight (they are counted as cancelled, not
    /// as sent; their conversations end as stopped).
    pub fn cancel(&self) {
        self.tx.send_modify(|c| {
            c.stop = true;
            c.cancel = true;
        });
    }

    /// Wakes every task to look at the state again.
    fn poke(&self) {
        self.tx.send_modify(|_| {});
    }
}

/// Runs the closed loop to its end.
pub(crate) async fn drive(ctx: Arc<Ctx>, control: Control) -> RunResult {
    let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    let mut ctl_rx = ctx.ctl.clone();
    let (mut spawned, mut finished) = (0usize, 0usize);
    loop {
        let ctl = *ctl_rx.borrow_and_update();
        while spawned < ctl.concurrency && !ctl.stop {
            let (ctx, done, index) = (ctx.clone(), done_tx.clone(), spawned);
            tokio::spawn(async move {
                slot(&ctx, index).await;
                let _ = done.send(());
            });
            spawned += 1;
        }
        if finished == spawned {
            break;
        }
        tokio::select! {
            changed = ctl_rx.changed() => {
                if changed.is_err() {
                    break;
                }
            }
            Some(()) = done_rx.recv() => {
                finished += 1;
                // A slot ends only when no conversation is left to start (or the run
                // stops): wake the slots waiting above the concurrency to see it too.
                control.poke();
            }
        }
    }
    ctx.result()
}

/// One slot: conversations one after another while its index is below the concurrency (the
/// first ones spread over the ramp).
async fn slot(ctx: &Ctx, index: usize) {
    let mut ctl = ctx.ctl.clone();
    let initial = ctx.config.concurrency;
    if ctx.config.ramp_secs > 0.0 && index < initial {
        let wait = std::time::Duration::from_secs_f64(
            ctx.config.ramp_secs * index as f64 / initial as f64,
        );
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = ctl.wait_for(|c| c.stop) => return,
        }
    }
    loop {
        let c = *ctl.borrow_and_update();
        if ctx.done() || c.stop {
            return;
        }
        if index >= c.concurrency {
            if ctl.changed().await.is_err() {
                return;
            }
            continue;
        }
        let Some(job) = ctx.next_job() else {
            return;
        };
        // A refused client waits what the server asked (`Retry-After`) before it comes back,
        // as well-behaved clients do; without it the slot would hammer a shedding server.
        if let Some(wait) = ctx.run_job(job, Instant::now()).await {
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = ctl.wait_for(|c| c.stop) => return,
            }
        }
    }
}
