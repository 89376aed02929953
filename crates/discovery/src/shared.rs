//! Discovery shared between pools (`[[pools]]` with top-level `[discovery]` sources): the
//! sources are read once and each engine they find goes to the pool serving its model: the
//! model its source names (a file entry's or DNS source's `model`, a Pod's
//! `kvroute.io/model`), else the first model its `/v1/models` lists that a pool serves. An
//! engine's answer is kept while it stays in the sources (asked again when the pools' model
//! names change); an engine that does not answer yet is asked again on the next look; one
//! serving no pool's model joins none (a warning, once). Each pool's share is handed to that
//! pool's own discovery task, which reconciles its fleet.

use crate::{bounded, Sources};
use futures_util::StreamExt;
use kvroute_fleet::config::{DiscoveryConfig, WorkerSpec};
use kvroute_fleet::models::Models;
use kvroute_fleet::upstream::Upstream;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// Engines asked for their models at once.
const CONCURRENT_ASKS: usize = 16;

/// One pool as shared discovery sees it.
pub struct PoolShare {
    /// Its name (logs).
    pub name: String,
    /// The model names it serves now (a reload may change them).
    pub models: Arc<Models>,
    /// Where its share of the engines goes (its discovery task's `shared`).
    pub share: watch::Sender<Vec<WorkerSpec>>,
}

/// How the engines are asked for their models.
pub struct Asking {
    /// Calls to engines (their keys).
    pub upstream: Arc<Upstream>,
    /// How long an engine has to answer.
    pub timeout: Duration,
}

/// Runs the shared sources until the gateway stops, every `interval_secs`.
pub async fn run(cfg: DiscoveryConfig, pools: Vec<PoolShare>, asking: Asking) {
    let mut tick = tokio::time::interval(Duration::from_secs_f64(cfg.interval_secs));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut sources = Sources::new(cfg.clone());
    let mut placer = Placer::default();
    loop {
        tick.tick().await;
        let Some(found) = sources.look().await else {
            continue;
        };
        let found = bounded(found, cfg.max_workers);
        let served: Vec<Vec<String>> = pools.iter().map(|p| p.models.names()).collect();
        let shares = placer.place(found, &served, &asking).await;
        for (pool, share) in pools.iter().zip(shares) {
            pool.share.send_if_modified(|s| {
                let changed = *s != share;
                if changed {
                    tracing::debug!(pool = %pool.name, engines = share.len(), "shared discovery: the pool's engines changed");
                    *s = share;
                }
                changed
            });
        }
    }
}

/// Which pool each engine goes to, remembered between looks.
#[derive(Default)]
struct Placer {
    /// The pools' model names the answers were read against.
    served: Vec<Vec<String>>,
    /// Engines (by URL) that answered: the pool of their model, None for none.
    answers: HashMap<String, Option<usize>>,
}

impl Placer {
    /// Each pool's engines among `found`, `served` being each pool's model names now.
    async fn place(
        &mut self,
        found: Vec<WorkerSpec>,
        served: &[Vec<String>],
        asking: &Asking,
    ) -> Vec<Vec<WorkerSpec>> {
        if self.served != served {
            self.served = served.to_vec();
            self.answers.clear();
        }
        self.answers
            .retain(|url, _| found.iter().any(|w| &w.url == url));
        let pool_of = |model: &str| served.iter().position(|m| m.iter().any(|n| n == model));
        let mut asked = std::collections::HashSet::new();
        let to_ask: Vec<WorkerSpec> = found
            .iter()
            .filter(|w| w.model.is_none() && !self.answers.contains_key(&w.url))
            .filter(|w| asked.insert(w.url.clone()))
            .cloned()
            .collect();
        let answers: Vec<(String, Option<Vec<String>>)> = futures_util::stream::iter(to_ask)
            .map(|w| {
                let (upstream, timeout) = (asking.upstream.clone(), asking.timeout);
                async move {
                    let cards = kvroute_fleet::health::served_models(&upstream, &w, timeout).await;
                    (w.url, cards.map(|c| c.into_iter().map(|c| c.id).collect()))
                }
            })
            .buffer_unordered(CONCURRENT_ASKS)
            .collect()
            .await;
        for (url, listed) in answers {
            let Some(listed) = listed else {
                tracing::debug!(engine = %url, "shared discovery: no model list yet; asking again on the next look");
                continue;
            };
            let pool = listed.iter().find_map(|m| pool_of(m));
            if pool.is_none() {
                tracing::warn!(engine = %url, models = ?listed, "shared discovery: the engine serves no pool's model; it joins none");
            }
            self.answers.insert(url, pool);
        }
        let mut shares = vec![Vec::new(); served.len()];
        for w in found {
            let pool = match &w.model {
                Some(m) => {
                    let p = pool_of(m);
                    if p.is_none() && !self.answers.contains_key(&w.url) {
                        tracing::warn!(engine = %w.url, model = %m, "shared discovery: the engine's source names a model no pool serves; it joins none");
                        self.answers.insert(w.url.clone(), None);
                    }
                    p
                }
                None => self.answers.get(&w.url).copied().flatten(),
            };
            if let Some(p) = pool {
                shares[p].push(w);
            }
        }
        shares
    }
}
