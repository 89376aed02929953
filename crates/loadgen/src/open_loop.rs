//! The open loop: new conversations (or synthetic requests) arrive at Poisson times at the
//! configured rate whatever the server's speed, at most `max_in_flight` at once; an arrival
//! that has to wait for room counts the wait in its first request's TTFT, so an overloaded
//! server shows up as latency, not as a lower rate.

use crate::job::Ctx;
use crate::RunResult;
use kvroute_workload::PoissonArrivals;
use std::sync::Arc;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

/// The seed stream of the arrivals (apart from the conversations').
const ARRIVAL_TAG: u64 = 0x6f70_656e_6c6f_6f70; // "openloop"

/// Runs the open loop to its end.
pub(crate) async fn drive(ctx: Arc<Ctx>) -> RunResult {
    let rate = ctx.config.rate.unwrap_or(1.0);
    let Ok(mut arrivals) = PoissonArrivals::new(rate, ctx.config.seed ^ ARRIVAL_TAG) else {
        return ctx.result();
    };
    let room = Arc::new(Semaphore::new(ctx.config.max_in_flight));
    let mut tasks = JoinSet::new();
    let mut ctl = ctx.ctl.clone();
    loop {
        let due = ctx.t0 + arrivals.next_time().0;
        tokio::select! {
            _ = tokio::time::sleep_until(due.into()) => {}
            _ = ctl.wait_for(|c| c.stop) => break,
        }
        if ctx.done() {
            break;
        }
        let Some(job) = ctx.next_job() else {
            break;
        };
        let (ctx, room) = (ctx.clone(), room.clone());
        tasks.spawn(async move {
            let Ok(_permit) = room.acquire().await else {
                return;
            };
            if !ctx.ctl.borrow().cancel {
                ctx.run_job(job, due).await;
            }
        });
        while tasks.try_join_next().is_some() {}
    }
    while tasks.join_next().await.is_some() {}
    ctx.result()
}
