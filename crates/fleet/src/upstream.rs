//! Calls to workers: the one HTTP client, the key each worker is sent (its own, else
//! `upstream.api_key`), and how long an answer may go silent. Used by the proxy, the health
//! checks and the pull-API event poller.

use crate::config::{GatewayConfig, WorkerSpec};
use std::time::Duration;

/// The client and the settings of calls to workers.
pub struct Upstream {
    client: reqwest::Client,
    api_key: Option<String>,
    idle_timeout: Duration,
}

impl Upstream {
    /// Calls through `client` with `config`'s upstream settings.
    pub fn new(client: reqwest::Client, config: &GatewayConfig) -> Self {
        Self {
            client,
            api_key: config.upstream.api_key.as_ref().map(|k| k.0.clone()),
            idle_timeout: Duration::from_secs_f64(config.upstream.idle_timeout_secs),
        }
    }

    /// The HTTP client.
    pub fn client(&self) -> &reqwest::Client {
        &self.client
    }

    /// The key to send a worker: its own, else `upstream.api_key`.
    pub fn key_for<'a>(&'a self, spec: &'a WorkerSpec) -> Option<&'a str> {
        spec.api_key
            .as_ref()
            .map(|k| k.0.as_str())
            .or(self.api_key.as_deref())
    }

    /// How long a worker's answer may go silent after its first byte.
    pub fn idle_timeout(&self) -> Duration {
        self.idle_timeout
    }
}

/// `req` with `Authorization: Bearer key`, when there is a key.
pub fn with_key(req: reqwest::RequestBuilder, key: Option<&str>) -> reqwest::RequestBuilder {
    match key {
        Some(k) => req.bearer_auth(k),
        None => req,
    }
}
