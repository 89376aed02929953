//! Health checking: each worker's `/health` is polled; after `failures_to_remove` failures
//! in a row it is taken out (its index entries and load dropped), and it comes back (empty)
//! on the first success. Each pass also learns the model names the workers serve.

use crate::state::Gateway;
use kvroute_core::WorkerId;
use kvroute_protocol::openai::ModelList;
use std::sync::Arc;
use std::time::Duration;

/// Checks every worker forever, one pass per interval.
pub async fn run(gw: Arc<Gateway>) {
    let interval = Duration::from_secs_f64(gw.config.health.interval_secs);
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let ids: Vec<WorkerId> = gw.registry.iter().map(|w| w.id).collect();
        let checks = ids.into_iter().map(|id| check(&gw, id));
        futures_util::future::join_all(checks).await;
    }
}

/// One check of one worker.
pub async fn check(gw: &Arc<Gateway>, id: WorkerId) {
    let Some(w) = gw.registry.get(id) else {
        return;
    };
    let base = w.spec.url.trim_end_matches('/');
    let timeout = Duration::from_secs_f64(gw.config.health.timeout_secs);
    let ok = match gw
        .client
        .get(format!("{base}/health"))
        .timeout(timeout)
        .send()
        .await
    {
        Ok(r) => r.status().is_success(),
        Err(_) => false,
    };
    if ok {
        w.succeed();
        if !w.is_up() {
            gw.bring_back(id);
        }
        if gw.config.models.is_empty() {
            learn_models(gw, base, timeout).await;
        }
    } else {
        let failures = w.fail();
        tracing::debug!(worker = %w.name, failures, "health check failed");
        if failures >= gw.config.health.failures_to_remove {
            gw.take_out(id, "health checks failed");
        }
    }
}

async fn learn_models(gw: &Gateway, base: &str, timeout: Duration) {
    let Ok(resp) = gw
        .client
        .get(format!("{base}/v1/models"))
        .timeout(timeout)
        .send()
        .await
    else {
        return;
    };
    // Bounded: a model list is small.
    let Ok(bytes) = resp.bytes().await else {
        return;
    };
    if bytes.len() > 1 << 20 {
        return;
    }
    if let Ok(list) = serde_json::from_slice::<ModelList>(&bytes) {
        gw.learn_models(list.data.into_iter().map(|m| m.id).collect());
    }
}
