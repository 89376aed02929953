//! New flows taken by a running flow controller (a config reload): the old tenants' and
//! classes' indices mapped to the new ones by name, so that what is kept per tenant (its
//! requests in flight, its bucket, its fair-queuing count) and what waits in the queue
//! carries over. A tenant or class no longer configured maps to the new default.

use super::{ClassIx, Flow, Flows, TenantIx};

/// Where each old tenant and class is in the new flows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FlowMap {
    /// By old tenant index: its new index.
    pub tenants: Vec<TenantIx>,
    /// By old class index: its new index.
    pub classes: Vec<ClassIx>,
    /// By old tenant index: whether the new tenant is the same-named one (its state moves
    /// whole) rather than the default it falls back to (only its requests in flight do).
    pub same: Vec<bool>,
}

impl Flows {
    /// Where `old`'s tenants and classes are in these flows.
    pub fn map_from(&self, old: &Flows) -> FlowMap {
        let tenants: Vec<TenantIx> = old
            .tenants()
            .iter()
            .map(|t| self.tenant_ix(Some(&t.name)))
            .collect();
        let same = old
            .tenants()
            .iter()
            .zip(&tenants)
            .map(|(t, &n)| self.tenant(n).name == t.name)
            .collect();
        FlowMap {
            tenants,
            classes: old
                .classes()
                .iter()
                .map(|c| self.class_ix(Some(&c.name)))
                .collect(),
            same,
        }
    }
}

impl FlowMap {
    /// Old tenant `t`'s new index (out of range: `fallback`).
    pub fn tenant(&self, t: TenantIx, fallback: TenantIx) -> TenantIx {
        self.tenants
            .get(usize::from(t.0))
            .copied()
            .unwrap_or(fallback)
    }

    /// An old flow in the `new` flows: its tenant and class mapped, the band its class has
    /// there.
    pub fn flow(&self, new: &Flows, f: Flow) -> Flow {
        let tenant = self.tenant(f.tenant, new.tenant_ix(None));
        let class = self
            .classes
            .get(usize::from(f.class.0))
            .copied()
            .unwrap_or_else(|| new.class_ix(None));
        new.flow(tenant, class)
    }
}

#[cfg(test)]
mod tests {
    use crate::flow::{ClassConfig, FlowConfig, TenantConfig};

    fn flows(tenants: &[&str], classes: &[(&str, u8)]) -> crate::flow::Flows {
        FlowConfig {
            tenants: tenants
                .iter()
                .map(|n| TenantConfig {
                    name: (*n).into(),
                    ..TenantConfig::default()
                })
                .collect(),
            classes: classes
                .iter()
                .map(|(n, band)| ClassConfig {
                    name: (*n).into(),
                    band: *band,
                    ..ClassConfig::default()
                })
                .collect(),
            ..FlowConfig::default()
        }
        .compile()
    }

    #[test]
    fn tenants_and_classes_are_found_by_name_and_the_gone_fall_to_the_default() {
        let old = flows(&["acme", "beta", "gone"], &[("high", 2), ("low", 0)]);
        let new = flows(&["beta", "acme"], &[("low", 0), ("high", 1)]);
        let m = new.map_from(&old);
        let name = |t| new.tenant(t).name.clone();
        assert_eq!(
            m.tenants.iter().map(|&t| name(t)).collect::<Vec<_>>(),
            ["acme", "beta", "default", "default"]
        );
        assert_eq!(m.same, [true, true, false, true]);
        let f = m.flow(&new, old.flow_of(Some("acme"), Some("high")));
        assert_eq!(new.tenant(f.tenant).name, "acme");
        assert_eq!(new.class(f.class).name, "high");
        assert_eq!(f.band, 1, "the band the class has now");
        let gone = m.flow(&new, old.flow_of(Some("gone"), Some("low")));
        assert_eq!(gone.tenant, new.tenant_ix(None));
    }
}
