//! `[epp]`: the endpoint picker's settings (the gateway's `epp`).

use serde::{Deserialize, Serialize};

/// The picker's settings (`[epp]`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EppConfig {
    /// The `ext_proc` gRPC port (the Gateway API's default 9002).
    pub port: u16,
    /// The gRPC health port (9003).
    pub health_port: u16,
    /// Honour the data plane's subset hint (`envoy.lb.subset_hint`): pick only among the
    /// endpoints it lists.
    pub subset_hint: bool,
    /// Requests being picked or streamed at once; more are refused with 503 (each holds a
    /// gRPC stream and, until routed, its body).
    pub max_streams: usize,
}

impl Default for EppConfig {
    fn default() -> Self {
        Self {
            port: 9002,
            health_port: 9003,
            subset_hint: true,
            max_streams: 10_000,
        }
    }
}
