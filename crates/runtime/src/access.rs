//! Who may call what, for every kvroute server (the gateway, the worker, the dashboard):
//!
//! - [`Access::Api`] routes (the OpenAI API, read-only debug views) need one of the API
//!   keys when any is configured (`Authorization: Bearer <key>`; 401 `invalid_api_key`);
//! - [`Access::Admin`] routes (anything that changes state: resets, fault injection, the
//!   dashboard's start / stop / concurrency) need the admin key when one is configured; without
//!   one they are served only on a loopback listener (403 `admin_disabled` otherwise), and then
//!   only to requests naming a loopback host (403 `bad_host`: a DNS-rebinding page names its
//!   own);
//! - both refuse a browser's cross-site request (an `Origin` other than the request's own
//!   host, or one of `allowed_origins`; 403 `cross_origin`), so a web page a user opens cannot
//!   drive them; clients other than browsers send no `Origin`;
//! - [`Access::Open`] routes (health, liveness, metrics) take anyone.
//!
//! Keys are compared in constant time.

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap};
use axum::middleware::Next;
use axum::response::Response;
use kvroute_protocol::openai::http::error_response;
use kvroute_protocol::openai::{ApiError, ErrorKind};
use std::sync::Arc;
use subtle::ConstantTimeEq;

/// A key: never printed, never written back out (serialize it with `skip_serializing`).
#[derive(Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<secret>")
    }
}

impl Secret {
    /// Whether it can be a key: 1 to 4,096 printable ASCII characters, no spaces.
    pub fn is_valid(&self) -> bool {
        !self.0.is_empty() && self.0.len() <= 4096 && self.0.bytes().all(|b| b.is_ascii_graphic())
    }
}

/// What a route needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Anyone.
    Open,
    /// An API key, when any is configured.
    Api,
    /// The admin key, or a loopback listener when none is configured.
    Admin,
}

/// A server's keys and where it listens.
#[derive(Clone, Debug, Default)]
pub struct AccessPolicy {
    /// Keys for [`Access::Api`] routes (empty: open).
    pub api_keys: Vec<String>,
    /// The key for [`Access::Admin`] routes (None: loopback listeners only).
    pub admin_key: Option<String>,
    /// Origins (`scheme://host[:port]`) whose pages may call the server besides its own.
    pub allowed_origins: Vec<String>,
    /// The listener is on a loopback address.
    pub loopback: bool,
}

impl AccessPolicy {
    /// Whether `headers` may call a route needing `access`.
    pub fn check(&self, access: Access, headers: &HeaderMap) -> Result<(), ApiError> {
        if access == Access::Open {
            return Ok(());
        }
        self.check_origin(headers)?;
        let presented = bearer(headers);
        match access {
            Access::Open => Ok(()),
            Access::Api => {
                if self.api_keys.is_empty()
                    || presented.is_some_and(|p| self.api_keys.iter().any(|k| same(k, p)))
                    || self.is_admin(presented)
                {
                    Ok(())
                } else {
                    Err(ApiError::new(
                        ErrorKind::Unauthorized,
                        "a valid API key is needed: Authorization: Bearer <key>",
                    )
                    .with_code("invalid_api_key"))
                }
            }
            Access::Admin => match &self.admin_key {
                Some(_) if self.is_admin(presented) => Ok(()),
                Some(_) => Err(ApiError::new(
                    ErrorKind::Unauthorized,
                    "the admin key is needed: Authorization: Bearer <admin key>",
                )
                .with_code("invalid_admin_key")),
                None if !self.loopback => Err(ApiError::new(
                    ErrorKind::Forbidden,
                    "admin endpoints are off on a non-loopback listener without an admin key",
                )
                .with_code("admin_disabled")),
                None if !host_is_loopback(headers) => Err(ApiError::new(
                    ErrorKind::Forbidden,
                    "admin endpoints without a key answer only requests to a loopback host",
                )
                .with_code("bad_host")),
                None => Ok(()),
            },
        }
    }

    fn is_admin(&self, presented: Option<&str>) -> bool {
        matches!((&self.admin_key, presented), (Some(k), Some(p)) if same(k, p))
    }

    fn check_origin(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        let Some(origin) = headers.get(header::ORIGIN) else {
            return Ok(());
        };
        let origin = origin.to_str().unwrap_or("null");
        let own = headers
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .is_some_and(|host| authority(origin) == Some(host));
        if own || self.allowed_origins.iter().any(|o| o == origin) {
            Ok(())
        } else {
            Err(ApiError::new(
                ErrorKind::Forbidden,
                format!("requests from pages of {origin} are not allowed"),
            )
            .with_code("cross_origin"))
        }
    }
}

/// The `host[:port]` of an origin `scheme://host[:port]`.
fn authority(origin: &str) -> Option<&str> {
    let (scheme, rest) = origin.split_once("://")?;
    (matches!(scheme, "http" | "https") && !rest.is_empty() && !rest.contains('/')).then_some(rest)
}

/// The key of an `Authorization: Bearer <key>` header.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, key) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| key.trim())
}

fn same(key: &str, presented: &str) -> bool {
    key.as_bytes().ct_eq(presented.as_bytes()).into()
}

/// Whether the `Host` header names a loopback host (`localhost`, `127.x.y.z`, `[::1]`).
fn host_is_loopback(headers: &HeaderMap) -> bool {
    let Some(host) = headers.get(header::HOST).and_then(|h| h.to_str().ok()) else {
        // HTTP/1.1 requires it; an HTTP/1.0 client without one names no other host.
        return true;
    };
    let name = match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => host.rsplit_once(':').map_or(host, |(n, _)| n),
    };
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// The axum middleware of a route group: `router.route_layer(axum::middleware::from_fn_with_state((policy, access), guard))`.
pub async fn guard(
    State((policy, access)): State<(Arc<AccessPolicy>, Access)>,
    request: Request,
    next: Next,
) -> Response {
    match policy.check(access, request.headers()) {
        Ok(()) => next.run(request).await,
        Err(e) => error_response(&e),
    }
}

/// `router` with every route needing `access` under `policy`.
pub fn require<S: Clone + Send + Sync + 'static>(
    router: axum::Router<S>,
    policy: &Arc<AccessPolicy>,
    access: Access,
) -> axum::Router<S> {
    router.route_layer(axum::middleware::from_fn_with_state(
        (policy.clone(), access),
        guard,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, v.parse().unwrap());
        }
        h
    }

    fn code(r: Result<(), ApiError>) -> Option<String> {
        r.err().map(|e| e.code.unwrap_or_default())
    }

    #[test]
    fn api_keys_admin_keys_origins_and_hosts_decide() {
        let open = AccessPolicy {
            loopback: true,
            ..AccessPolicy::default()
        };
        let local = headers(&[("host", "127.0.0.1:8000")]);
        assert_eq!(code(open.check(Access::Api, &local)), None);
        assert_eq!(code(open.check(Access::Admin, &local)), None);
        // A page elsewhere, or a rebinding name, cannot drive it.
        let page = headers(&[
            ("host", "127.0.0.1:8000"),
            ("origin", "http://evil.example"),
        ]);
        assert_eq!(
            code(open.check(Access::Admin, &page)).as_deref(),
            Some("cross_origin")
        );
        assert_eq!(
            code(open.check(Access::Api, &page)).as_deref(),
            Some("cross_origin")
        );
        assert_eq!(code(open.check(Access::Open, &page)), None);
        let own = headers(&[
            ("host", "127.0.0.1:8000"),
            ("origin", "http://127.0.0.1:8000"),
        ]);
        assert_eq!(code(open.check(Access::Admin, &own)), None);
        let rebound = headers(&[("host", "evil.example:8000")]);
        assert_eq!(
            code(open.check(Access::Admin, &rebound)).as_deref(),
            Some("bad_host")
        );
        for h in ["localhost:1", "[::1]:80", "127.0.0.2", "LOCALHOST"] {
            assert_eq!(
                code(open.check(Access::Admin, &headers(&[("host", h)]))),
                None,
                "{h}"
            );
        }
        // Not on loopback and no admin key: admin routes are off.
        let exposed = AccessPolicy::default();
        assert_eq!(
            code(exposed.check(Access::Admin, &local)).as_deref(),
            Some("admin_disabled")
        );
        // Keys.
        let keyed = AccessPolicy {
            api_keys: vec!["k1".into(), "k2".into()],
            admin_key: Some("root".into()),
            allowed_origins: vec!["https://ui.example".into()],
            loopback: false,
        };
        let with = |key: &str| headers(&[("host", "gw:8000"), ("authorization", key)]);
        assert_eq!(code(keyed.check(Access::Api, &with("Bearer k2"))), None);
        assert_eq!(code(keyed.check(Access::Api, &with("bearer k1"))), None);
        assert_eq!(code(keyed.check(Access::Api, &with("Bearer root"))), None);
        assert_eq!(
            code(keyed.check(Access::Api, &with("Bearer k3"))).as_deref(),
            Some("invalid_api_key")
        );
        assert_eq!(
            code(keyed.check(Access::Api, &with("Basic k1"))).as_deref(),
            Some("invalid_api_key")
        );
        assert_eq!(
            code(keyed.check(Access::Api, &headers(&[]))).as_deref(),
            Some("invalid_api_key")
        );
        assert_eq!(
            code(keyed.check(Access::Admin, &with("Bearer k1"))).as_deref(),
            Some("invalid_admin_key")
        );
        assert_eq!(code(keyed.check(Access::Admin, &with("Bearer root"))), None);
        let allowed = headers(&[
            ("host", "gw:8000"),
            ("origin", "https://ui.example"),
            ("authorization", "Bearer k1"),
        ]);
        assert_eq!(code(keyed.check(Access::Api, &allowed)), None);
        assert_eq!(ApiError::new(ErrorKind::Unauthorized, "x").status(), 401);
    }
}
