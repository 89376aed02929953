//! What changes a worker's standing, on the registry and the routing table: taken out of
//! routing and brought back (its events checked first when it has them), its predictions
//! judged against what its engine reported (a degraded worker's index repaired), its index
//! reset, and the gauges read from the router at scrape time. The fleet's health checks,
//! event ingestion and the proxy call it; it knows none of them.

use crate::bookings::Waiter;
use crate::clock::Clock;
use crate::config::AccuracyConfig;
use crate::metrics::Metrics;
use crate::registry::Registry;
use crate::table::RoutingTable;
use kvroute_core::{Router, WorkerId};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The workers' standing.
pub struct Workers {
    registry: Arc<Registry>,
    table: Arc<RoutingTable<Waiter>>,
    metrics: Arc<Metrics>,
    accuracy: AccuracyConfig,
    clock: Clock,
}

impl Workers {
    /// Standing kept in `registry` and `table`, counted in `metrics`.
    pub fn new(
        registry: Arc<Registry>,
        table: Arc<RoutingTable<Waiter>>,
        metrics: Arc<Metrics>,
        accuracy: AccuracyConfig,
        clock: Clock,
    ) -> Self {
        Self {
            registry,
            table,
            metrics,
            accuracy,
            clock,
        }
    }

    /// Compares a request's prediction with what the engine reported, per worker; a worker
    /// whose predictions keep missing is marked degraded (logged, counted, in
    /// `/debug/workers`) and, when it has an event stream, its index is rebuilt from the
    /// replay service (at most once per cooldown).
    pub fn observe_prediction(&self, worker: WorkerId, sample: crate::accuracy::Sample) {
        let Some(entry) = self.registry.get(worker) else {
            return;
        };
        let cfg = &self.accuracy;
        let name = entry.name.as_str();
        let m = &self.metrics;
        let (rec, summary) = entry.record_prediction(sample, cfg);
        m.predictions
            .with_label_values(&[name, rec.outcome.as_str()])
            .inc();
        m.prediction_error
            .with_label_values(&[name])
            .observe(sample.abs_error() as f64);
        if let Some(r) = summary.exact_ratio {
            m.prediction_exact_ratio.with_label_values(&[name]).set(r);
        }
        if rec.tokens_differ {
            m.prompt_token_mismatches.with_label_values(&[name]).inc();
        }
        for d in [
            crate::accuracy::Degraded::OverPredicting,
            crate::accuracy::Degraded::UnderPredicting,
            crate::accuracy::Degraded::TokenCountsDiffer,
        ] {
            m.prediction_degraded
                .with_label_values(&[name, d.as_str()])
                .set(i64::from(summary.degraded == Some(d)));
        }
        if rec.agrees && entry.cache_state() == crate::registry::CacheState::Unknown {
            // Lost events made the index unknown; a whole window of answers since says it
            // matches the engine's cache again (its ingestion decides: not while away).
            entry.heal.notify_one();
        }
        let Some(verdict) = rec.newly else {
            return;
        };
        tracing::warn!(worker = %name, reason = verdict.as_str(), samples = summary.samples, exact_ratio = ?summary.exact_ratio, over = summary.over, under = summary.under, token_count_mismatches = summary.token_count_mismatches, "predictions degraded: {}", verdict.explain());
        let repairable = verdict != crate::accuracy::Degraded::TokenCountsDiffer;
        if !(repairable && cfg.repair && entry.has_feed.load(Ordering::Acquire)) {
            return;
        }
        let now = self.clock.now();
        let cooldown = std::time::Duration::from_secs_f64(cfg.repair_cooldown_secs);
        if !entry.take_repair(now, cooldown) {
            tracing::info!(worker = %name, "index repair skipped: the last one is too recent");
            return;
        }
        m.prediction_repairs
            .with_label_values(&[name, verdict.as_str()])
            .inc();
        m.prediction_degraded
            .with_label_values(&[name, verdict.as_str()])
            .set(0);
        tracing::warn!(worker = %name, reason = verdict.as_str(), "rebuilding the worker's index from its replay service");
        entry.repair.notify_one();
    }

    /// Takes a worker out of routing (it keeps its index entries and load: an engine that
    /// is slow or unreachable has not lost its cache; its event stream says when it did).
    pub fn take_out(&self, id: WorkerId, why: &str) {
        let Some(w) = self.registry.get(id) else {
            return;
        };
        if w.set_up(false) {
            self.table.update(|r| r.set_available(id, false));
            self.metrics.worker_up.with_label_values(&[&w.name]).set(0);
            tracing::warn!(worker = %w.name, reason = why, "worker taken out of routing (its index is kept)");
            self.table.released();
        }
    }

    /// Puts a worker that answers again back into service. A worker with events is first
    /// checked against its replay service by its event ingestion (an engine that restarted
    /// meanwhile must not be predicted from its old index), which then calls
    /// [`Workers::verified`]; others come back at once.
    pub fn bring_back(&self, id: WorkerId) {
        let Some(w) = self.registry.get(id) else {
            return;
        };
        if w.is_up() {
            return;
        }
        if w.has_feed.load(Ordering::Acquire) {
            if !w.verifying.swap(true, Ordering::AcqRel) {
                w.verify.notify_one();
                tracing::info!(worker = %w.name, "worker answers again; checking its KV events before routing to it");
            }
        } else {
            self.mark_up(id);
        }
    }

    /// The worker's events were checked (or can no longer be): back in service if a health
    /// check had asked for it.
    pub fn verified(&self, id: WorkerId) {
        if let Some(w) = self.registry.get(id) {
            if w.verifying.swap(false, Ordering::AcqRel) {
                self.mark_up(id);
            }
        }
    }

    fn mark_up(&self, id: WorkerId) {
        let Some(w) = self.registry.get(id) else {
            return;
        };
        if w.set_up(true) {
            self.table.update(|r| r.set_available(id, true));
            self.metrics.worker_up.with_label_values(&[&w.name]).set(1);
            tracing::info!(worker = %w.name, "worker back in service");
            self.table.released();
        }
    }

    /// Drops every index entry of every worker (`POST /debug/reset`).
    pub fn reset_index(&self) {
        let workers = self.registry.all();
        self.table.update(|r| {
            for w in workers.iter() {
                r.clear_worker(w.id);
            }
        });
    }

    /// Copies the router's per-worker figures into the gauges (at scrape time).
    pub fn refresh_gauges(&self) {
        let workers = self.registry.all();
        self.table.read(|r| self.refresh_gauges_from(r, &workers));
    }

    fn refresh_gauges_from(
        &self,
        r: &Router,
        workers: &[std::sync::Arc<crate::registry::WorkerEntry>],
    ) {
        let mut pools = [(0i64, 0i64, 0i64); kvroute_core::WorkerRole::ALL.len()];
        for w in workers {
            let load = r.ledger().load(w.id).unwrap_or_default();
            let labels = [w.name.as_str()];
            let role = r.role(w.id);
            for (i, each) in kvroute_core::WorkerRole::ALL.into_iter().enumerate() {
                self.metrics
                    .worker_role
                    .with_label_values(&[w.name.as_str(), each.as_str()])
                    .set(i64::from(each == role));
                if each == role {
                    let pool = &mut pools[i];
                    pool.0 += 1;
                    pool.1 += i64::from(load.inflight);
                    pool.2 = pool
                        .2
                        .saturating_add(i64::try_from(load.prefill_tokens).unwrap_or(i64::MAX));
                }
            }
            self.metrics
                .worker_inflight
                .with_label_values(&labels)
                .set(i64::from(load.inflight));
            self.metrics
                .worker_prefill
                .with_label_values(&labels)
                .set(i64::try_from(load.prefill_tokens).unwrap_or(i64::MAX));
            let blocks = r.cached_blocks(w.id);
            self.metrics
                .index_blocks
                .with_label_values(&labels)
                .set(i64::try_from(blocks).unwrap_or(i64::MAX));
            // Monotonic in the index (kept across clears): the counter follows it.
            let evicted = evicted_blocks(r, w.id);
            let counter = self.metrics.index_evicted.with_label_values(&labels);
            counter.inc_by(evicted.saturating_sub(counter.get()));
            for tier in kvroute_core::Tier::OFFLOADED {
                let n = r.offloaded().block_count(w.id, tier);
                self.metrics
                    .offloaded_blocks
                    .with_label_values(&[w.name.as_str(), tier.as_str()])
                    .set(i64::try_from(n).unwrap_or(i64::MAX));
            }
            self.metrics
                .worker_up
                .with_label_values(&labels)
                .set(i64::from(w.is_up()));
            let state = w.cache_state();
            for s in crate::registry::CacheState::ALL {
                self.metrics
                    .cache_state
                    .with_label_values(&[w.name.as_str(), s.as_str()])
                    .set(i64::from(s == state));
            }
            for (counter, value) in [
                (&self.metrics.event_restarts, &w.events.restarts),
                (&self.metrics.event_resubscribes, &w.events.resubscribes),
            ] {
                let c = counter.with_label_values(&labels);
                let v = value.load(std::sync::atomic::Ordering::Relaxed);
                c.inc_by(v.saturating_sub(c.get()));
            }
        }
        for (role, (n, inflight, prefill)) in kvroute_core::WorkerRole::ALL.into_iter().zip(pools) {
            let labels = [role.as_str()];
            self.metrics.pool_workers.with_label_values(&labels).set(n);
            self.metrics
                .pool_inflight
                .with_label_values(&labels)
                .set(inflight);
            self.metrics
                .pool_prefill
                .with_label_values(&labels)
                .set(prefill);
        }
        let peers = r.peer_stats();
        let own = r.ledger().inflight().saturating_sub(peers.inflight);
        self.metrics
            .inflight
            .set(i64::try_from(own).unwrap_or(i64::MAX));
        self.metrics.peer_replicas.set(peers.peers as i64);
        self.metrics.peer_inflight.set(peers.inflight as i64);
    }
}

/// Blocks of `worker` dropped from the router's indexes (device and offloaded tiers) to keep
/// it under `router.max_blocks_per_worker`.
pub fn evicted_blocks(r: &kvroute_core::Router, worker: kvroute_core::WorkerId) -> u64 {
    let tiers = kvroute_core::Tier::OFFLOADED
        .iter()
        .filter_map(|&t| r.offloaded().index(t))
        .map(|ix| ix.evicted(worker));
    r.index().evicted(worker) + tiers.sum::<u64>()
}
