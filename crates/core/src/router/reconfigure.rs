//! Settings a running router takes anew (a gateway's config reload): admission's thresholds,
//! queue caps and mode (the gateway's queue reads them from here), its tenants and classes
//! (the queue takes them with [`crate::admission::AdmissionQueue::set_flows`], its state
//! carried over by name), and the routing policy's parameters. Not the policy's kind (a
//! gateway's metrics are labelled with it) or anything fixed at the start (block size,
//! capacities): those wait for a restart.

use super::Router;
use crate::admission::AdmissionConfig;
use crate::policy::PolicyConfig;
use crate::RouteError;

impl Router {
    /// Takes `admission` (its tenants and classes too) and `policy` (its `kind` must be the
    /// running one's), both checked first; nothing changes on an error.
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
        self.flows = admission.flow.compile();
        self.config.admission = admission.clone();
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
    fn admission_flow_and_policy_parameters_change_and_the_kind_does_not() {
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
        admission.flow = FlowConfig {
            classes: vec![ClassConfig {
                name: "top".into(),
                band: 2,
                ..ClassConfig::default()
            }],
            ..FlowConfig::default()
        };
        let mut policy = cfg.policy.clone();
        policy.goodput.ttft_secs = 2.0;
        r.reconfigure(&admission, &policy).unwrap();
        let now = r.config();
        assert_eq!(now.admission.max_queued_requests, 7);
        assert_eq!(now.admission.mode, AdmissionMode::Shed);
        assert_eq!(now.admission.flow, admission.flow, "the new classes");
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
