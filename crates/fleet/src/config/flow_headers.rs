//! Which request headers say who a request is and what it needs (`docs/flow-control.md`):
//! the tenant (only from a header the operator trusts; otherwise from the API key), the
//! class, and the request's own time-to-first-token objective.

use serde::{Deserialize, Serialize};

/// The flow control headers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FlowHeaders {
    /// A header trusted to name the tenant (unset: tenants come from API keys only). Set it
    /// only when a proxy in front of the gateway sets or strips it: a client could name any
    /// tenant.
    pub tenant: Option<String>,
    /// The header naming the request's class (else the body's `priority`, else the default
    /// class).
    pub class: String,
    /// The header with the request's own TTFT objective in milliseconds (never looser than
    /// its class's).
    pub ttft_ms: String,
}

impl Default for FlowHeaders {
    fn default() -> Self {
        Self {
            tenant: None,
            class: "x-kvroute-class".into(),
            ttft_ms: "x-kvroute-ttft-ms".into(),
        }
    }
}

impl FlowHeaders {
    /// Checks the names are valid header names.
    pub fn validate(&self) -> Result<(), String> {
        for name in self.tenant.iter().chain([&self.class, &self.ttft_ms]) {
            if reqwest::header::HeaderName::from_bytes(name.as_bytes()).is_err() {
                return Err(format!("flow_headers: {name:?} is not a header name"));
            }
        }
        Ok(())
    }
}
