//! Who a request is and what it needs (`docs/flow-control.md`): its tenant from the API key
//! it presented (a tenant's key), else from the header the operator trusts
//! (`flow_headers.tenant`), else `default`; its class from the class header, else the body's
//! `priority` (the class whose `engine_priority` it is), else the default class; its own
//! TTFT objective from the objective header, never looser than its class's; and the output
//! tokens it is charged (`max_tokens`, else its class's estimate). Unknown names get the
//! defaults, never an error; a malformed objective header is a 400.

use kvroute_core::flow::{Flow, Flows};
use kvroute_fleet::config::FlowHeaders;
use kvroute_protocol::openai::{ApiError, RequestView};
use reqwest::header::{HeaderMap, AUTHORIZATION};
use std::time::Duration;

/// A request's flow and needs.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Identity {
    /// Its tenant, class and band.
    pub flow: Flow,
    /// Its TTFT objective (its own or its class's), if it has one.
    pub objective: Option<Duration>,
    /// Output tokens charged against its tenant's bucket until it finishes.
    pub output: u64,
    /// The generation of the flows `flow` was resolved against (a reload after maps it by
    /// name: [`crate::gateway::Gateway::flow_now`]).
    pub generation: u32,
}

/// The identity of a request with `headers` and body `view`.
pub fn identify(
    flows: &Flows,
    names: &FlowHeaders,
    headers: &HeaderMap,
    view: &RequestView,
) -> Result<Identity, ApiError> {
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let key = text(AUTHORIZATION.as_str())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    let tenant = key
        .and_then(|k| flows.tenant_of_key(k))
        .unwrap_or_else(|| flows.tenant_ix(names.tenant.as_deref().and_then(text)));
    let class = match text(&names.class) {
        Some(name) => flows.class_ix(Some(name.trim())),
        None => match view.priority {
            Some(p) => flows.class_of_priority(p),
            None => flows.class_ix(None),
        },
    };
    let flow = flows.flow(tenant, class);
    let own = match headers.get(names.ttft_ms.as_str()) {
        None => None,
        Some(v) => {
            let ms = v
                .to_str()
                .ok()
                .and_then(|s| s.trim().parse::<f64>().ok())
                .filter(|ms| ms.is_finite() && *ms > 0.0 && *ms <= 604_800_000.0)
                .ok_or_else(|| {
                    ApiError::invalid(format!(
                        "the {} header must be a number of milliseconds within (0, 604800000]",
                        names.ttft_ms
                    ))
                })?;
            Some(ms / 1e3)
        }
    };
    let c = flows.class(class);
    let objective = match (own, c.ttft_secs) {
        (Some(o), Some(c)) => Some(o.min(c)),
        (o, c) => o.or(c),
    };
    Ok(Identity {
        flow,
        objective: objective.map(Duration::from_secs_f64),
        output: u64::from(view.max_tokens.unwrap_or(c.output_estimate)),
        generation: 0,
    })
}

#[cfg(test)]
mod tests;
