//! The models one listener serves: one [`Gateway`] per pool (its own tokenizer, router,
//! workers and metrics), a request's `model` picking the pool. A config without `[[pools]]`
//! is one pool, named "" and unlabelled.

use crate::gateway::Gateway;
use std::sync::Arc;

/// The pools, in config order (at least one).
pub struct Pools {
    pools: Vec<(String, Arc<Gateway>)>,
}

impl Pools {
    /// The pools `(name, gateway)`; `pools` holds at least one.
    pub(crate) fn new(pools: Vec<(String, Arc<Gateway>)>) -> Self {
        debug_assert!(!pools.is_empty());
        Self { pools }
    }

    /// The first pool: what answers for the gateway as a whole (request ids, the shared
    /// limits, a refusal before a pool is known).
    pub fn first(&self) -> &Arc<Gateway> {
        &self.pools[0].1
    }

    /// Whether several models are served (`[[pools]]`: metrics get a `model` label).
    pub fn labelled(&self) -> bool {
        !self.pools[0].0.is_empty()
    }

    /// Every pool, `(name, gateway)`.
    pub fn all(&self) -> impl Iterator<Item = (&str, &Arc<Gateway>)> {
        self.pools.iter().map(|(n, g)| (n.as_str(), g))
    }

    /// The pool serving `model` (a served name or an adapter).
    pub fn for_model(&self, model: &str) -> Option<&Arc<Gateway>> {
        self.pools
            .iter()
            .find(|(_, g)| g.models.serves(model))
            .map(|(_, g)| g)
    }

    /// The pool named `name`, or else the pool serving the model `name`; None for the
    /// first pool.
    pub fn select(&self, name: Option<&str>) -> Option<&Arc<Gateway>> {
        match name {
            None => Some(self.first()),
            Some(n) => self
                .pools
                .iter()
                .find(|(p, _)| p == n)
                .map(|(_, g)| g)
                .or_else(|| self.for_model(n)),
        }
    }

    /// The pools' names (empty for the one pool of a config without `[[pools]]`).
    pub fn names(&self) -> Vec<String> {
        self.pools.iter().map(|(n, _)| n.clone()).collect()
    }

    /// Every pool's metrics in one exposition, each series of a pool labelled with its
    /// `model` when several are served (the gateway-wide ones once, unlabelled).
    pub fn render_metrics(&self) -> String {
        let sets = self
            .pools
            .iter()
            .enumerate()
            .map(|(i, (name, gw))| {
                gw.workers.refresh_gauges();
                gw.metrics
                    .gather_pool(self.labelled().then_some(name.as_str()), i == 0)
            })
            .collect();
        kvroute_fleet::metrics::render(sets)
    }
}
