//! Settings a running router takes anew (a gateway's config reload): admission's thresholds,
//! queue caps and mode (the gateway's queue reads them from here), and the routing policy's
//! parameters. Not the policy's kind (a
//! gateway's metrics are labelled with it), the flow settings (the tenants' limits and the
//! queue's fairness counters are state kept per tenant) or anything fixed at the start
//! (block size, capacities): those wait for a restart.

use super::Router;
use crate::admission::AdmissionConfig;
use crate::policy::PolicyConfig;
use crate::RouteError;

impl Router {
    /// Takes `admission` (its `flow` ignored: the running one stays) and `policy` (its
    /// `kind` must be the running one's), both checked first; nothing changes on an error.
    pub fn reconfigure(
        &mut self,
        admission: &AdmissionConfig,
        policy: &PolicyConfig,
    ) -> Result<(), RouteError> {
        let bad = RouteError::Config;
        admission.validate().map_err(bad)?;
        policy.validate().map_err(bad)?;
        if policy.kind != self.config.policy.kind {
            return Err(bad(format!(
                "the policy's kind ({:?} -> {:?}) changes only with a restart",
                self.config.policy.kind, policy.kind
            )));
        }
        let flow = std::mem::take(&mut self.config.admission.flow);
        self.config.admission = AdmissionConfig {
            flow,
            ..admission.clone()
        };
        self.config.policy = policy.clone();
        self.policy = policy.build();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::flow::{ClassConfig, FlowConfig};
    use crate::*;

    #[test]
    fn admission_and_policy_parameters_change_the_flow_and_the_kind_do_not() {
        let mut cfg = RouterConfig::default();
        cfg.admission.flow = FlowConfig {
            classes: vec![ClassConfig {
                name: "high".into(),
                band: 1,
                ..ClassConfig::default()
            }],
            ..FlowConfig::default()
        };
        let mut r = Router::new(cfg.clone()).unwrap();
        let mut admission = cfg.admission.clone();
        admission.max_queued_requests = 7;
        admission.mode = AdmissionMode::Shed;
        admission.flow = FlowConfig::default();
        let mut policy = cfg.policy.clone();
        policy.goodput.ttft_secs = 2.0;
        r.reconfigure(&admission, &policy).unwrap();
        let now = r.config();
        assert_eq!(now.admission.max_queued_requests, 7);
        assert_eq!(now.admission.mode, AdmissionMode::Shed);
        assert_eq!(
            now.admission.flow, cfg.admission.flow,
            "the running flow stays"
        );
        assert_eq!(now.policy.goodput.ttft_secs, 2.0);
        // Refused whole: a bad value, another kind.
        admission.busy_batch_fraction = Some(-1.0);
        assert!(r.reconfigure(&admission, &policy).is_err());
        assert_eq!(r.config().admission.max_queued_requests, 7);
        admission.busy_batch_fraction = None;
        policy.kind = PolicyKind::Kv;
        assert!(r.reconfigure(&admission, &policy).is_err());
        assert_eq!(r.config().policy.kind, PolicyKind::Goodput);
    }
}
