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
    /// Honour the Gateway API Inference Extension's conformance headers: a request's
    /// `test-epp-endpoint-selection` (comma-separated `IP` or `IP:port`) restricts the
    /// endpoints it may go to, and the answer gets `x-conformance-test-served-endpoint` from
    /// the data plane's `envoy.lb` `x-gateway-destination-endpoint-served` metadata, as the
    /// upstream conformance suite expects. Off by default: the header lets a client pin an
    /// endpoint (upstream marks it for tests only).
    pub conformance_headers: bool,
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
            conformance_headers: false,
            max_streams: 10_000,
        }
    }
}
