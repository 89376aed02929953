//! Who may call what: API keys on the OpenAI routes, the admin key on `/debug/reset`,
//! pages of other sites refused, and the gateway's own key for workers started with one.

use crate::support::*;
use kvroute_gateway::config::Secret;
use serde_json::Value;

/// `method path` with `headers`: the status and the JSON body (Null when not JSON).
async fn call(url: &str, method: &str, path: &str, headers: &[(&str, &str)]) -> (u16, Value) {
    let c = client();
    let mut req = match method {
        "GET" => c.get(format!("{url}{path}")),
        _ => c
            .post(format!("{url}{path}"))
            .json(&chat(&[("user", "hello")], false, 2)),
    };
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

fn code(body: &Value) -> &str {
    body["error"]["code"].as_str().unwrap_or("")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_keys_guard_the_api_and_the_admin_key_guards_reset() {
    let a = worker("a").await;
    let mut cfg = config(&[&a], "kv");
    cfg.auth.api_keys = vec![Secret("k1".into()), Secret("k2".into())];
    cfg.auth.admin_key = Some(Secret("root".into()));
    let gw = gateway_with_feeds(cfg, Default::default()).await;
    let url = gw.url();
    let chat = "/v1/chat/completions";
    let (s, e) = call(&url, "POST", chat, &[]).await;
    assert_eq!((s, code(&e)), (401, "invalid_api_key"), "{e}");
    assert_eq!(e["error"]["type"], "authentication_error");
    let (s, _) = call(&url, "POST", chat, &[("authorization", "Bearer nope")]).await;
    assert_eq!(s, 401);
    let (s, e) = call(&url, "POST", chat, &[("authorization", "Bearer k2")]).await;
    assert_eq!(s, 200, "{e}");
    // Health, readiness, liveness and metrics stay open; the debug views need a key.
    for path in ["/health", "/ready", "/live", "/metrics"] {
        let (s, _) = call(&url, "GET", path, &[]).await;
        assert_eq!(s, 200, "{path}");
    }
    let (s, _) = call(&url, "GET", "/debug/workers", &[]).await;
    assert_eq!(s, 401);
    let (s, _) = call(&url, "GET", "/v1/models", &[("authorization", "Bearer k1")]).await;
    assert_eq!(s, 200);
    // Reset: only the admin key.
    let (s, e) = call(
        &url,
        "POST",
        "/debug/reset",
        &[("authorization", "Bearer k1")],
    )
    .await;
    assert_eq!((s, code(&e)), (401, "invalid_admin_key"), "{e}");
    let (s, e) = call(
        &url,
        "POST",
        "/debug/reset",
        &[("authorization", "Bearer root")],
    )
    .await;
    assert_eq!(s, 200, "{e}");
    gw.shutdown().await;
    a.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_of_other_sites_and_rebound_names_cannot_drive_it() {
    let a = worker("a").await;
    let gw = gateway_with_feeds(config(&[&a], "kv"), Default::default()).await;
    let url = gw.url();
    let host = url.trim_start_matches("http://").to_string();
    let evil = [("origin", "http://evil.example")];
    for (method, path) in [("POST", "/debug/reset"), ("POST", "/v1/chat/completions")] {
        let (s, e) = call(&url, method, path, &evil).await;
        assert_eq!((s, code(&e)), (403, "cross_origin"), "{path}: {e}");
    }
    // The gateway's own origin is its own; a DNS-rebinding page names another host.
    let own = format!("http://{host}");
    let (s, _) = call(&url, "POST", "/debug/reset", &[("origin", own.as_str())]).await;
    assert_eq!(s, 200);
    let (s, e) = call(&url, "POST", "/debug/reset", &[("host", "evil.example")]).await;
    assert_eq!((s, code(&e)), (403, "bad_host"), "{e}");
    // Without keys on loopback, clients without an Origin are served.
    let (s, _) = call(&url, "POST", "/debug/reset", &[]).await;
    assert_eq!(s, 200);
    let (s, _) = call(&url, "POST", "/v1/chat/completions", &[]).await;
    assert_eq!(s, 200);
    gw.shutdown().await;
    a.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_started_with_a_key_get_theirs_or_the_clients() {
    // A worker playing an engine started with --api-key.
    let a = worker_with("a", |c| c.api_key = Some(Secret("engine-key".into()))).await;
    let (s, e) = call(&a.url(), "POST", "/v1/chat/completions", &[]).await;
    assert_eq!(
        (s, code(&e)),
        (401, "invalid_api_key"),
        "the worker checks its key: {e}"
    );
    // Without the key, the worker refuses what the gateway forwards.
    let gw = gateway_with_feeds(config(&[&a], "kv"), Default::default()).await;
    let (s, _) = call(&gw.url(), "POST", "/v1/chat/completions", &[]).await;
    assert_ne!(s, 200);
    gw.shutdown().await;
    // With the worker's key configured.
    let mut cfg = config(&[&a], "kv");
    cfg.workers[0].api_key = Some(Secret("engine-key".into()));
    let gw = gateway_with_feeds(cfg, Default::default()).await;
    let (s, e) = call(&gw.url(), "POST", "/v1/chat/completions", &[]).await;
    assert_eq!(s, 200, "{e}");
    gw.shutdown().await;
    // The client's own key, forwarded.
    let mut cfg = config(&[&a], "kv");
    cfg.upstream.forward_authorization = true;
    let gw = gateway_with_feeds(cfg, Default::default()).await;
    let key = [("authorization", "Bearer engine-key")];
    let (s, e) = call(&gw.url(), "POST", "/v1/chat/completions", &key).await;
    assert_eq!(s, 200, "{e}");
    let wrong = [("authorization", "Bearer other")];
    let (s, _) = call(&gw.url(), "POST", "/v1/chat/completions", &wrong).await;
    assert_ne!(s, 200);
    gw.shutdown().await;
    a.shutdown().await;
}
