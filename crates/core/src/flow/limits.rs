//! Per-tenant limits: requests in flight and a token bucket on prompt + output tokens.
//!
//! A request is charged when it enters (its prompt plus `max_tokens`, or its class's output
//! estimate) and the charge is corrected when it leaves (the output it did not produce is
//! given back; a request refused or expired before dispatch gets all of it back). A tenant
//! over either limit is refused with a wait: for the bucket, until it holds the request's
//! cost (or is full, for a request larger than the bucket); for concurrency, a second.
//!
//! New flows (a reload) move each tenant's state to its new index ([`TenantLimits::remap`]);
//! the admission queue maps a permit given out before along when it comes back, through the
//! last [`MAX_REMAPS`] reloads (an older one is dropped).

use super::{Flows, TenantIx};
use crate::types::Time;
use std::time::Duration;

/// Seconds of its rate a tenant's bucket holds when its size is not set.
pub const DEFAULT_BURST_SECS: f64 = 10.0;

/// Reloads a permit given out before them is mapped through when it comes back.
pub const MAX_REMAPS: usize = 64;

/// What a request that entered holds until it leaves (give it back to
/// [`TenantLimits::leave`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Permit {
    /// Its tenant.
    pub tenant: TenantIx,
    /// The flows' generation its tenant index is of (the admission queue's; it maps the
    /// permit to the flows now when it comes back).
    pub generation: u32,
    /// Prompt tokens charged.
    pub prompt: u64,
    /// Output tokens charged.
    pub output: u64,
}

/// Which limit refused a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Limit {
    /// Requests in flight.
    Concurrency,
    /// The token bucket.
    Tokens,
}

/// A refusal: the limit, and how long until the request would be let through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OverLimit {
    /// The limit.
    pub limit: Limit,
    /// How long to wait (at least a millisecond).
    pub retry_after: Duration,
}

#[derive(Clone, Debug, Default)]
struct Bucket {
    level: f64,
    at: Option<Time>,
}

#[derive(Clone, Debug, Default)]
struct TenantState {
    inflight: u32,
    bucket: Bucket,
}

/// Every tenant's requests in flight and bucket.
#[derive(Clone, Debug, Default)]
pub struct TenantLimits {
    tenants: Vec<TenantState>,
}

impl TenantLimits {
    /// Lets a request of `tenant` costing `prompt` + `output` tokens in at `now`, or says
    /// why not and for how long.
    pub fn enter(
        &mut self,
        flows: &Flows,
        tenant: TenantIx,
        now: Time,
        prompt: u64,
        output: u64,
    ) -> Result<Permit, OverLimit> {
        let cfg = flows.tenant(tenant);
        let i = usize::from(tenant.0).min(flows.tenants().len().saturating_sub(1));
        if self.tenants.len() <= i {
            self.tenants.resize_with(i + 1, TenantState::default);
        }
        let st = &mut self.tenants[i];
        if cfg.max_concurrent.is_some_and(|m| st.inflight >= m) {
            return Err(OverLimit {
                limit: Limit::Concurrency,
                retry_after: Duration::from_secs(1),
            });
        }
        let cost = prompt.saturating_add(output) as f64;
        if let Some(rate) = cfg.tokens_per_sec {
            let cap = cfg
                .burst_tokens
                .map_or(rate * DEFAULT_BURST_SECS, |b| b as f64);
            let b = &mut st.bucket;
            b.level = match b.at {
                None => cap,
                Some(at) => (b.level + rate * now.since(at).as_secs_f64()).min(cap),
            };
            b.at = Some(b.at.map_or(now, |at| at.max(now)));
            let need = cost.min(cap);
            if b.level < need {
                let secs = (need - b.level) / rate;
                return Err(OverLimit {
                    limit: Limit::Tokens,
                    retry_after: Duration::from_secs_f64(secs.clamp(0.001, 86_400.0)),
                });
            }
            b.level -= cost;
        }
        st.inflight += 1;
        Ok(Permit {
            tenant,
            generation: 0,
            prompt,
            output,
        })
    }

    /// Takes new flows: each old tenant's state moves to its new index in `map` (one that
    /// falls back to the default brings only its requests in flight).
    pub fn remap(&mut self, map: &super::remap::FlowMap) {
        let n = map
            .tenants
            .iter()
            .map(|t| usize::from(t.0) + 1)
            .max()
            .unwrap_or(0);
        let mut tenants = vec![TenantState::default(); n];
        for (i, st) in self.tenants.drain(..).enumerate() {
            let Some(&to) = map.tenants.get(i) else {
                continue;
            };
            let new = &mut tenants[usize::from(to.0)];
            new.inflight += st.inflight;
            if map.same.get(i).copied().unwrap_or(false) {
                new.bucket = st.bucket;
            }
        }
        self.tenants = tenants;
    }

    /// A request that entered with `permit` left after producing `output` tokens (`None`:
    /// it was never dispatched, and its whole charge is given back).
    pub fn leave(&mut self, flows: &Flows, permit: Permit, output: Option<u64>) {
        let i = usize::from(permit.tenant.0).min(flows.tenants().len().saturating_sub(1));
        let Some(st) = self.tenants.get_mut(i) else {
            return;
        };
        st.inflight = st.inflight.saturating_sub(1);
        let cfg = flows.tenant(permit.tenant);
        if let Some(rate) = cfg.tokens_per_sec {
            let cap = cfg
                .burst_tokens
                .map_or(rate * DEFAULT_BURST_SECS, |b| b as f64);
            let back = match output {
                Some(used) => permit.output as f64 - used as f64,
                None => (permit.prompt + permit.output) as f64,
            };
            st.bucket.level = (st.bucket.level + back).min(cap);
        }
    }

    /// Requests of `tenant` in flight.
    pub fn inflight(&self, tenant: TenantIx) -> u32 {
        self.tenants
            .get(usize::from(tenant.0))
            .map_or(0, |s| s.inflight)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flow::{FlowConfig, TenantConfig};

    fn flows(t: TenantConfig) -> Flows {
        FlowConfig {
            tenants: vec![t],
            ..FlowConfig::default()
        }
        .compile()
    }

    fn at(ms: u64) -> Time {
        Time::from_millis(ms)
    }

    #[test]
    fn the_bucket_refills_at_its_rate_and_says_how_long_to_wait() {
        let f = flows(TenantConfig {
            name: "a".into(),
            tokens_per_sec: Some(1_000.0),
            burst_tokens: Some(2_000),
            ..TenantConfig::default()
        });
        let a = f.tenant_ix(Some("a"));
        let mut l = TenantLimits::default();
        let p = l.enter(&f, a, at(0), 1_500, 0).unwrap();
        let e = l.enter(&f, a, at(0), 1_000, 0).unwrap_err();
        assert_eq!(e.limit, Limit::Tokens);
        assert_eq!(e.retry_after, Duration::from_millis(500));
        assert!(l.enter(&f, a, at(500), 1_000, 0).is_ok());
        assert_eq!(l.inflight(a), 2);
        l.leave(&f, p, Some(0));
        assert_eq!(l.inflight(a), 1);
        // A request larger than the bucket goes when the bucket is full, into debt.
        let e = l.enter(&f, a, at(500), 5_000, 0).unwrap_err();
        assert_eq!(e.retry_after, Duration::from_secs(2));
        assert!(l.enter(&f, a, at(2_500), 5_000, 0).is_ok());
        assert!(l.enter(&f, a, at(2_500), 1, 0).is_err(), "in debt");
        // The default tenant has no limits.
        let d = f.tenant_ix(Some("nobody"));
        for _ in 0..1_000 {
            l.enter(&f, d, at(0), 1 << 20, 1 << 20).unwrap();
        }
    }

    #[test]
    fn output_not_produced_is_given_back_and_a_refused_request_gets_all_back() {
        let f = flows(TenantConfig {
            name: "a".into(),
            tokens_per_sec: Some(100.0),
            burst_tokens: Some(1_000),
            ..TenantConfig::default()
        });
        let a = f.tenant_ix(Some("a"));
        let mut l = TenantLimits::default();
        let p = l.enter(&f, a, at(0), 200, 800).unwrap();
        assert!(l.enter(&f, a, at(0), 100, 0).is_err());
        l.leave(&f, p, Some(300));
        // 500 of the 800 output tokens back.
        assert!(l.enter(&f, a, at(0), 500, 0).is_ok());
        assert!(l.enter(&f, a, at(0), 1, 0).is_err());
        let p = l.enter(&f, a, at(10_000), 400, 600).unwrap();
        l.leave(&f, p, None);
        assert!(l.enter(&f, a, at(10_000), 1_000, 0).is_ok(), "all back");
    }

    #[test]
    fn concurrency_is_a_limit_of_its_own() {
        let f = flows(TenantConfig {
            name: "a".into(),
            max_concurrent: Some(2),
            ..TenantConfig::default()
        });
        let a = f.tenant_ix(Some("a"));
        let mut l = TenantLimits::default();
        let p = l.enter(&f, a, at(0), 1, 1).unwrap();
        l.enter(&f, a, at(0), 1, 1).unwrap();
        let e = l.enter(&f, a, at(0), 1, 1).unwrap_err();
        assert_eq!(e.limit, Limit::Concurrency);
        l.leave(&f, p, Some(1));
        assert!(l.enter(&f, a, at(0), 1, 1).is_ok());
    }
}
