//! Early refusal: a request whose class says `on_predicted_miss = "reject"` and whose
//! predicted time to first token exceeds its objective on every worker it could go to is
//! refused at once (`predicted_miss`) instead of admitted to miss, keeping the capacity for
//! requests that can meet theirs. The prediction is the `predictive` policy's (booked prefill
//! plus this prompt's uncached tokens at each worker's learned speed, a full batch's wait).

use super::{RouteRequest, Router};
use crate::flow::MissAction;
use crate::policy::{Candidate, PolicyInput, Predictive};
use std::time::Duration;

/// The longest predicted drain a refusal reports, in seconds.
pub const MAX_DRAIN: f64 = 600.0;

impl Router {
    /// When its class refuses predicted misses and even the best predicted TTFT over `pool`
    /// (the workers the request could go to) misses the class's objective (the router's
    /// goodput objective when the class sets none): the predicted drain, how much longer than
    /// its objective that best prediction is (the time until the backlog ahead of it has
    /// shrunk enough to meet it, at most [`MAX_DRAIN`]), a refusal's `Retry-After`; `None`
    /// otherwise.
    pub(super) fn predicted_miss(
        &self,
        req: &RouteRequest<'_>,
        pool: &[Candidate],
    ) -> Option<Duration> {
        let class = self.flows.class(req.flow.class);
        if class.on_predicted_miss != MissAction::Reject || pool.is_empty() {
            return None;
        }
        let objective = class
            .ttft_secs
            .unwrap_or(self.config.policy.goodput.ttft_secs);
        let best = self
            .predicted_ttft(req, pool)
            .into_iter()
            .fold(f64::INFINITY, f64::min);
        (best > objective).then(|| Duration::from_secs_f64((best - objective).min(MAX_DRAIN)))
    }

    /// The `predictive` policy's time to first token of `req` on each of `pool` (no
    /// affinity, no class: the prediction alone).
    pub(super) fn predicted_ttft(&self, req: &RouteRequest<'_>, pool: &[Candidate]) -> Vec<f64> {
        let input = PolicyInput {
            prompt_tokens: req.prompt.tokens,
            block_size: self.block_size.get(),
            candidates: pool,
            decision: self.decisions,
            seed: self.config.seed,
            affinity: None,
            affinity_bias: 0.0,
            tiers: self.config.tiers,
            class: Default::default(),
        };
        Predictive::new(self.config.policy.predictive.clone()).predict(&input)
    }
}

#[cfg(test)]
mod tests {
    use crate::flow::{ClassConfig, FlowConfig, MissAction};
    use crate::*;

    fn router() -> Router {
        let class = |name: &str, ttft, miss| ClassConfig {
            name: name.into(),
            ttft_secs: Some(ttft),
            on_predicted_miss: miss,
            ..ClassConfig::default()
        };
        let mut cfg = RouterConfig {
            block_size: 4,
            ..RouterConfig::default()
        };
        cfg.admission.flow = FlowConfig {
            classes: vec![
                class("strict", 0.001, MissAction::Reject),
                class("roomy", 10.0, MissAction::Reject),
                class("lenient", 0.001, MissAction::Admit),
            ],
            ..FlowConfig::default()
        };
        let mut r = Router::new(cfg).unwrap();
        for w in [1, 2] {
            r.add_worker(WorkerId(w), WorkerCapacity::default())
                .unwrap();
        }
        r
    }

    #[test]
    fn a_request_predicted_to_miss_everywhere_is_refused_when_its_class_says_so() {
        let r = router();
        let flows = r.config().admission.flow.compile();
        let tokens: Vec<u32> = (0..400).collect();
        let prompt = BlockedPrompt::new(&tokens, r.block_size(), Namespace::default());
        let outcome = |class: &str| {
            r.route(&RouteRequest {
                flow: flows.flow_of(None, Some(class)),
                ..RouteRequest::new(&prompt)
            })
        };
        // 400 tokens at the prior 10,000 tokens/s: 40 ms predicted, 39 ms over the
        // objective: the predicted drain, the refusal's wait.
        let RouteOutcome::Reject(RejectReason::PredictedMiss, Some(wait)) = outcome("strict")
        else {
            panic!("{:?}", outcome("strict"))
        };
        assert!((wait.as_secs_f64() - 0.039).abs() < 0.005, "{wait:?}");
        assert!(matches!(outcome("roomy"), RouteOutcome::Dispatch(_)));
        assert!(matches!(outcome("lenient"), RouteOutcome::Dispatch(_)));
        assert!(matches!(outcome("unknown"), RouteOutcome::Dispatch(_)));
    }
}
