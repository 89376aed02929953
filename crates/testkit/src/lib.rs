//! Helpers the integration tests of several crates share: serving a stub app, reading a URL
//! as JSON or text, polling until a condition holds, reading one series of a Prometheus
//! metrics text (with `kvroute_protocol::prometheus_text`); ZMQ sockets playing an engine's KV event publisher ([`zmq`]).
//!
//! A dev-dependency only. The HTTP helpers panic with the URL when a request fails, which is
//! what a test wants.

#![forbid(unsafe_code)]

pub mod envoy;
pub mod nats;
pub mod zmq;

use std::time::Duration;

/// How often [`eventually`] checks.
const POLL: Duration = Duration::from_millis(10);

/// Serves `app` on an ephemeral port of 127.0.0.1 until the runtime stops; its base URL.
pub async fn serve(app: axum::Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("binding 127.0.0.1:0");
    let url = format!("http://{}", listener.local_addr().expect("a bound address"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

/// `GET url`, the body parsed as JSON.
pub async fn get_json(client: &reqwest::Client, url: &str) -> serde_json::Value {
    get(client, url)
        .await
        .json()
        .await
        .unwrap_or_else(|e| panic!("GET {url}: body is not JSON: {e}"))
}

/// `GET url`, the body as text.
pub async fn get_text(client: &reqwest::Client, url: &str) -> String {
    get(client, url)
        .await
        .text()
        .await
        .unwrap_or_else(|e| panic!("GET {url}: body is not text: {e}"))
}

async fn get(client: &reqwest::Client, url: &str) -> reqwest::Response {
    client
        .get(url)
        .send()
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e}"))
}

/// Checks `check` every 10 ms until it is true (true) or `limit` has passed (false).
pub async fn eventually(limit: Duration, mut check: impl AsyncFnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if check().await {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(POLL).await;
    }
}

/// The value of series `series` in a metrics text: `name` (the sample without labels) or
/// `name{a="x",b="y"}` (exactly these labels, in any order).
pub fn sample(text: &str, series: &str) -> Option<f64> {
    kvroute_protocol::prometheus_text::series_value(text, series)
}

/// Whether `program --version` runs and succeeds (a tool the tests start is installed).
pub fn runs(program: &std::ffi::OsStr) -> bool {
    std::process::Command::new(program)
        .arg("--version")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_are_found_by_exact_name() {
        let text = "# HELP a x\n# TYPE a gauge\na 1.5\nab 2\na{l=\"v\",m=\"w\"} 3\n";
        assert_eq!(sample(text, "a"), Some(1.5));
        assert_eq!(sample(text, "ab"), Some(2.0));
        assert_eq!(sample(text, "b"), None);
        assert_eq!(sample(text, "a{m=\"w\",l=\"v\"}"), Some(3.0));
        assert_eq!(sample(text, "a{l=\"v\"}"), None);
    }

    #[tokio::test(start_paused = true)]
    async fn eventually_stops_at_true_or_at_the_limit() {
        let mut n = 0;
        assert!(
            eventually(Duration::from_secs(1), async || {
                n += 1;
                n == 3
            })
            .await
        );
        assert_eq!(n, 3);
        let mut calls = 0;
        assert!(
            !eventually(Duration::from_millis(100), async || {
                calls += 1;
                false
            })
            .await
        );
        assert!((10..=12).contains(&calls), "{calls} checks in 100 ms");
    }
}
