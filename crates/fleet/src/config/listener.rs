//! The listener's settings: TLS (`[tls]`) and who may call it (`[auth]`: API keys, the
//! admin key, allowed origins).

use super::Secret;
use serde::{Deserialize, Serialize};

/// TLS for the listener: off unless both files are given.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TlsConfig {
    /// PEM file of the certificate chain (the server's certificate first).
    pub cert_file: Option<std::path::PathBuf>,
    /// PEM file of its private key (PKCS#8, PKCS#1 or SEC1).
    pub key_file: Option<std::path::PathBuf>,
}

impl TlsConfig {
    /// Whether TLS is on.
    pub fn enabled(&self) -> bool {
        self.cert_file.is_some()
    }
}

/// Keys and origins (see `kvroute_runtime::access`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthConfig {
    /// Keys for the OpenAI routes and the read-only debug views (empty: open). Also from
    /// the environment: `KVROUTE_API_KEYS` (comma-separated).
    #[serde(skip_serializing)]
    pub api_keys: Vec<Secret>,
    /// The key for `/debug/reset` (None: served on a loopback listener only). Also from
    /// `KVROUTE_ADMIN_KEY`.
    #[serde(skip_serializing)]
    pub admin_key: Option<Secret>,
    /// Origins (`https://host[:port]`) whose web pages may call the gateway.
    pub allowed_origins: Vec<String>,
}

impl AuthConfig {
    /// The access policy of a listener (`loopback`: bound to a loopback address).
    pub fn policy(&self, loopback: bool) -> kvroute_runtime::AccessPolicy {
        kvroute_runtime::AccessPolicy {
            api_keys: self.api_keys.iter().map(|k| k.0.clone()).collect(),
            admin_key: self.admin_key.as_ref().map(|k| k.0.clone()),
            allowed_origins: self.allowed_origins.clone(),
            loopback,
        }
    }
}
