//! The control API of a long-lived load, over HTTP and WebSocket on 127.0.0.1, driving a real
//! gateway and simulated workers.

mod support;

use futures_util::StreamExt;
use kvroute_loadgen::{LoadgenConfig, Service, ServiceConfig};
use kvroute_testkit::eventually;
use serde_json::{json, Value};
use std::time::Duration;
use support::{fleet, small_chat, two_models};

/// The control API served as `kvroute demo` and `kvroute loadgen` serve it (under the
/// protocol crate's connection limits, WebSocket upgrades included).
async fn serve(service: Service) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let policy = std::sync::Arc::new(kvroute_runtime::AccessPolicy {
        loopback: true,
        ..Default::default()
    });
    let app = kvroute_loadgen::api::router(service, &policy);
    let limits = kvroute_runtime::ServeLimits::default();
    tokio::spawn(kvroute_runtime::serve(
        listener,
        app,
        limits,
        None,
        std::future::pending(),
    ));
    url
}

/// A service that is never started (its target is a closed port).
fn idle_service() -> Service {
    let load = LoadgenConfig {
        target: "http://127.0.0.1:9".into(),
        ..LoadgenConfig::default()
    };
    Service::new(ServiceConfig {
        load,
        ..ServiceConfig::default()
    })
    .unwrap()
}

async fn call(method: &str, url: &str, body: Option<Value>) -> (u16, Value) {
    let c = reqwest::Client::new();
    let req = match method {
        "GET" => c.get(url),
        _ => c.post(url),
    };
    let req = match body {
        Some(b) => req.json(&b),
        None => req,
    };
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_api_starts_steers_streams_and_stops_the_load() {
    let (workers, gw) = fleet(2, |_| {}).await;
    let mut chat = small_chat();
    chat.max_tokens = 24;
    let service = Service::new(ServiceConfig {
        load: LoadgenConfig {
            target: gw.url(),
            concurrency: 2,
            conversations: u64::MAX,
            chat,
            ..LoadgenConfig::default()
        },
        tick_ms: 100,
        ..ServiceConfig::default()
    })
    .unwrap();
    let api = serve(service.clone()).await;

    // Stopped at first: stop is refused, the stream says so.
    let (s, st) = call("GET", &format!("{api}/api/status"), None).await;
    assert_eq!((s, st["running"].as_bool()), (200, Some(false)), "{st}");
    let (s, e) = call("POST", &format!("{api}/api/stop"), None).await;
    assert_eq!((s, e["error"]["code"].as_str()), (409, Some("conflict")));
    let ws_url = format!("{}/api/ws", api.replace("http://", "ws://"));
    let (mut ws, _) = tokio_tungstenite::connect_async(&ws_url).await.unwrap();
    let mut next_stats = async move || -> Value {
        loop {
            let msg = tokio::time::timeout(Duration::from_secs(10), ws.next())
                .await
                .expect("a stats message within 10 s")
                .unwrap()
                .unwrap();
            if let tokio_tungstenite::tungstenite::Message::Text(t) = msg {
                return serde_json::from_str(&t).unwrap();
            }
        }
    };
    assert_eq!(next_stats().await["running"], false);

    // Start: running, a second start is refused.
    let (s, st) = call("POST", &format!("{api}/api/start"), None).await;
    assert_eq!((s, st["running"].as_bool()), (200, Some(true)), "{st}");
    let (s, _) = call("POST", &format!("{api}/api/start"), None).await;
    assert_eq!(s, 409);

    // The stream fills: completed turns in the window, with latency figures.
    let mut seen = Value::Null;
    for _ in 0..200 {
        seen = next_stats().await;
        if seen["arms"][0]["window"]["summary"]["completed"].as_u64() >= Some(4) {
            break;
        }
    }
    assert_eq!(seen["running"], true, "{seen}");
    let live = &seen["arms"][0];
    assert_eq!(live["name"], "live", "{seen}");
    assert!(
        live["window"]["summary"]["completed"].as_u64() >= Some(4),
        "{seen}"
    );
    assert!(live["window"]["summary"]["ttft_ms"]["p95"].as_f64() > Some(0.0));
    assert!(live["totals"]["sent"].as_u64() >= Some(4));

    // Concurrency: bad values refused; a good one pending, then applied after the debounce.
    for bad in [json!({"concurrency": 0}), json!({"level": 3}), json!("x")] {
        let (s, e) = call("POST", &format!("{api}/api/concurrency"), Some(bad)).await;
        assert_eq!((s, e["error"]["code"].as_str()), (400, Some("bad_request")));
    }
    let (s, st) = call(
        "POST",
        &format!("{api}/api/concurrency"),
        Some(json!({"concurrency": 3})),
    )
    .await;
    assert_eq!(
        (s, st["pending_concurrency"].as_u64()),
        (202, Some(3)),
        "{st}"
    );
    let (s, st) = call(
        "POST",
        &format!("{api}/api/concurrency"),
        Some(json!({"concurrency": 5})),
    )
    .await;
    assert_eq!((s, st["pending_concurrency"].as_u64()), (202, Some(5)));
    // Only the last of quick changes is applied.
    assert!(
        eventually(Duration::from_secs(10), async || {
            let (_, st) = call("GET", &format!("{api}/api/status"), None).await;
            st["concurrency"] == 5 && st["pending_concurrency"].is_null()
        })
        .await
    );
    assert!(
        eventually(Duration::from_secs(20), async || service.stats().arms[0]
            .active_conversations
            >= 4)
        .await,
        "the new slots did not start conversations"
    );

    // Conversations: list, detail with per-turn figures and transcript, unknown ids.
    assert!(
        eventually(Duration::from_secs(20), async || {
            let (_, l) = call("GET", &format!("{api}/api/conversations"), None).await;
            l["conversations"]
                .as_array()
                .is_some_and(|a| a.iter().any(|c| c["status"] == "completed"))
        })
        .await
    );
    let (_, l) = call("GET", &format!("{api}/api/conversations?limit=2"), None).await;
    assert_eq!(l["conversations"].as_array().unwrap().len(), 2);
    let (_, l) = call("GET", &format!("{api}/api/conversations"), None).await;
    let done = l["conversations"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["status"] == "completed")
        .unwrap()
        .clone();
    assert_eq!(done["turns"], 3);
    assert!(done["topic"].as_str().unwrap().starts_with("Document"));
    let (s, d) = call(
        "GET",
        &format!("{api}/api/conversations/{}", done["id"]),
        None,
    )
    .await;
    assert_eq!(s, 200);
    let turns = d["turns"].as_array().unwrap();
    assert_eq!(turns.len(), 3);
    assert!(turns[0]["user"].as_str().unwrap().starts_with("Document"));
    assert!(!turns[0]["assistant"].as_str().unwrap().is_empty());
    assert!(turns[0]["ttft_ms"].as_f64() > Some(0.0));
    assert!(turns[2]["input_tokens"].as_u64() > turns[0]["input_tokens"].as_u64());
    assert!(turns[2]["worker"].is_string());
    assert!(turns[2]["predicted_cached_tokens"].is_u64());
    // Why the gateway chose that worker, for the conversation page.
    let route = &turns[2]["route"];
    assert!(route["policy"].is_string(), "{route}");
    assert_eq!(route["workers"][0]["chosen"], true, "{route}");
    assert_eq!(route["workers"][0]["name"], turns[2]["worker"], "{route}");
    assert_eq!(
        route["workers"][0]["matched_blocks"].as_u64().unwrap()
            * route["block_size"].as_u64().unwrap(),
        turns[2]["predicted_cached_tokens"].as_u64().unwrap(),
        "{route}"
    );
    let (s, _) = call("GET", &format!("{api}/api/conversations/999999"), None).await;
    assert_eq!(s, 404);
    let (s, _) = call("GET", &format!("{api}/api/conversations/abc"), None).await;
    assert_eq!(s, 400);

    // The dashboard's settings and the fleet behind the gateway.
    let (s, c) = call("GET", &format!("{api}/api/config"), None).await;
    assert_eq!((s, &c["dashboard"]["slider_min"]), (200, &json!(60)), "{c}");
    assert_eq!(c["dashboard"]["slo_ttft_p95_ms"], 600.0);
    let (s, f) = call("GET", &format!("{api}/api/fleet"), None).await;
    assert_eq!((s, &f["arms"][0]["arm"]), (200, &json!("live")), "{f}");
    let f = &f["arms"][0]["fleet"];
    assert_eq!(f["available"], json!(true), "{f}");
    assert_eq!(f["policy"], "kv");
    assert!(f["queued"].is_f64(), "{f}");
    let cards = f["workers"].as_array().unwrap();
    assert_eq!(cards.len(), 2);
    // One pool: both workers do both.
    assert_eq!(f["pools"].as_array().map(Vec::len), Some(1), "{f}");
    assert_eq!(
        (&f["pools"][0]["role"], &f["pools"][0]["workers"]),
        (&json!("both"), &json!(2))
    );
    for w in cards {
        assert_eq!(w["up"], true, "{w}");
        assert!(w["kv_usage"].is_f64() && w["busy"].is_f64(), "{w}");
        assert!(w["inflight"].is_u64(), "{w}");
        assert_eq!(w["cache_state"], "exact", "{w}");
        assert_eq!(w["role"], "both", "{w}");
        // The engine and model behind it, from its metrics.
        assert!(
            w["engine"]
                .as_str()
                .unwrap()
                .starts_with("kvroute simulated"),
            "{w}"
        );
        assert!(w["model"].is_string(), "{w}");
        // The gateway's prediction accuracy: its simulated workers' events are exact.
        assert!(w["accuracy"]["samples"].as_u64() > Some(0), "{w}");
        assert_eq!(w["accuracy"]["exact_ratio"], 1.0, "{w}");
        assert!(w["accuracy"]["degraded"].is_null(), "{w}");
    }

    // Prometheus: the summaries with their quantiles.
    let text = reqwest::get(format!("{api}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for line in [
        "# TYPE loadgen_ttft_all_seconds summary",
        "loadgen_ttft_all_seconds{arm=\"live\",quantile=\"0.5\"}",
        "loadgen_ttft_all_seconds{arm=\"live\",quantile=\"0.95\"}",
        "loadgen_ttft_sent_seconds{arm=\"live\",quantile=\"0.95\"}",
        "loadgen_tpot_all_seconds{arm=\"live\",quantile=\"0.95\"}",
        "loadgen_itl_all_seconds_count{arm=\"live\"}",
        "loadgen_e2e_all_seconds_sum{arm=\"live\"}",
        "loadgen_requests_total{arm=\"live\",status=\"completed\"}",
        "loadgen_concurrency{arm=\"live\"} 5",
    ] {
        assert!(text.contains(line), "{line} missing from\n{text}");
    }
    let p95: f64 = text
        .lines()
        .find(|l| l.starts_with("loadgen_ttft_all_seconds{arm=\"live\",quantile=\"0.95\"}"))
        .and_then(|l| l.rsplit_once(' ')?.1.parse().ok())
        .unwrap();
    assert!(p95 > 0.0 && p95 < 10.0, "{p95}");

    // Stop: turns in flight are cut, nothing stays active; a second stop is refused.
    let (s, st) = call("POST", &format!("{api}/api/stop"), None).await;
    assert_eq!((s, st["running"].as_bool()), (200, Some(false)), "{st}");
    assert!(
        eventually(Duration::from_secs(10), async || {
            let st = service.stats();
            let a = &st.arms[0];
            !st.stopping && a.totals.in_flight == 0 && a.active_conversations == 0
        })
        .await,
        "{:?}",
        service.stats()
    );
    let (s, _) = call("POST", &format!("{api}/api/stop"), None).await;
    assert_eq!(s, 409);
    // Nothing was counted as failed: cut turns are cancelled, not errors.
    let t = service.stats().arms[0].totals;
    assert_eq!((t.failed, t.rejected), (0, 0), "{t:?}");
    assert_eq!(t.sent, t.completed);

    // A new start runs again from an empty window, at the applied concurrency.
    let (s, st) = call("POST", &format!("{api}/api/start"), None).await;
    assert_eq!(
        (s, st["runs"].as_u64(), st["concurrency"].as_u64()),
        (200, Some(2), Some(5))
    );
    service.stop().unwrap();
    gw.shutdown().await;
    for w in workers {
        w.shutdown().await;
    }
}

#[tokio::test]
async fn a_target_without_a_fleet_view_says_so() {
    let service = Service::new(ServiceConfig {
        load: LoadgenConfig {
            target: "http://127.0.0.1:9".into(),
            conversations: u64::MAX,
            ..LoadgenConfig::default()
        },
        ..ServiceConfig::default()
    })
    .unwrap();
    let api = serve(service).await;
    let (s, f) = call("GET", &format!("{api}/api/fleet"), None).await;
    let f = &f["arms"][0]["fleet"];
    assert_eq!((s, &f["available"]), (200, &json!(false)), "{f}");
    assert!(f["error"].as_str().is_some_and(|e| !e.is_empty()), "{f}");
    // Bad dashboard settings are refused when the service is made.
    let bad = ServiceConfig {
        dashboard: kvroute_loadgen::DashboardConfig {
            slider_step: 0,
            ..Default::default()
        },
        ..ServiceConfig::default()
    };
    assert!(Service::new(bad).is_err());
}

/// The live A/B: two identical fleets, one behind round-robin, driven with the same
/// conversations at the same concurrency; each arm's figures apart, the levels each measured.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_arms_run_the_same_conversations_and_measure_each_level() {
    let (wa, ga) = fleet(2, |_| {}).await;
    let (wb, gb) = fleet(2, |c| {
        c.router.policy.kind = kvroute_core::PolicyKind::RoundRobin
    })
    .await;
    let mut chat = small_chat();
    chat.max_tokens = 16;
    let arms = vec![
        kvroute_loadgen::ArmConfig {
            name: "kv".into(),
            target: ga.url(),
            baseline: false,
        },
        kvroute_loadgen::ArmConfig {
            name: "round_robin".into(),
            target: gb.url(),
            baseline: true,
        },
    ];
    let service = Service::new(ServiceConfig {
        load: LoadgenConfig {
            target: ga.url(),
            concurrency: 2,
            conversations: u64::MAX,
            chat,
            ..LoadgenConfig::default()
        },
        arms,
        tick_ms: 100,
        measure_after_secs: 1.0,
        ..ServiceConfig::default()
    })
    .unwrap();
    let api = serve(service.clone()).await;
    service.start().unwrap();
    // Both arms complete turns; the level is measured once it held for a second.
    assert!(
        eventually(Duration::from_secs(30), async || {
            let (_, l) = call("GET", &format!("{api}/api/levels"), None).await;
            l["levels"][0]["arms"]
                .as_array()
                .is_some_and(|a| a.len() == 2)
        })
        .await,
        "{:?}",
        service.levels()
    );
    let levels = service.levels();
    assert_eq!(levels[0].concurrency, 2);
    let names: Vec<_> = levels[0].arms.iter().map(|a| a.name.as_str()).collect();
    assert_eq!(names, ["kv", "round_robin"]);
    assert!(levels[0]
        .arms
        .iter()
        .all(|a| a.summary.completed > 0 && a.held_secs >= 1.0));
    let st = service.stats();
    assert_eq!(st.arms.len(), 2);
    assert!(st.arm("round_robin").is_some_and(|a| a.baseline));
    // The same conversations on both: the first conversation's opening message is the same.
    let first = |arm: &str| {
        let api = api.clone();
        let arm = arm.to_string();
        async move {
            let (s, d) = call("GET", &format!("{api}/api/conversations/0?arm={arm}"), None).await;
            assert_eq!(s, 200, "{d}");
            d["turns"][0]["user"].as_str().unwrap().to_string()
        }
    };
    assert_eq!(first("kv").await, first("round_robin").await);
    // An unknown arm is a 404 naming the arms.
    let (s, e) = call("GET", &format!("{api}/api/conversations?arm=nope"), None).await;
    assert_eq!(s, 404, "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("round_robin"),
        "{e}"
    );
    // Only conversations with a completed follow-up turn when asked.
    assert!(
        eventually(Duration::from_secs(20), async || {
            let (_, l) = call("GET", &format!("{api}/api/conversations?followup=1"), None).await;
            l["conversations"].as_array().is_some_and(|a| !a.is_empty())
        })
        .await
    );
    let (_, l) = call(
        "GET",
        &format!("{api}/api/conversations?followup=1&limit=1000"),
        None,
    )
    .await;
    for c in l["conversations"].as_array().unwrap() {
        let (_, d) = call("GET", &format!("{api}/api/conversations/{}", c["id"]), None).await;
        assert!(
            d["turns"]
                .as_array()
                .unwrap()
                .iter()
                .any(|t| t["turn"].as_u64() > Some(1) && t["status"] == "completed"),
            "{d}"
        );
    }
    // Each fleet under its arm; metrics labelled by arm.
    let (_, f) = call("GET", &format!("{api}/api/fleet"), None).await;
    assert_eq!(f["arms"][0]["fleet"]["policy"], "kv", "{f}");
    assert_eq!(f["arms"][1]["fleet"]["policy"], "round_robin", "{f}");
    let text = reqwest::get(format!("{api}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for arm in ["kv", "round_robin"] {
        let line = format!("loadgen_requests_total{{arm=\"{arm}\",status=\"completed\"}}");
        assert!(text.contains(&line), "{line} missing from\n{text}");
    }
    // Stop ends both.
    service.stop().unwrap();
    assert!(
        eventually(Duration::from_secs(10), async || {
            let st = service.stats();
            !st.stopping && st.arms.iter().all(|a| a.totals.in_flight == 0)
        })
        .await
    );
    for g in [ga, gb] {
        g.shutdown().await;
    }
    for w in wa.into_iter().chain(wb) {
        w.shutdown().await;
    }
}

#[tokio::test]
async fn arms_are_checked_when_the_service_is_made() {
    let arm = |name: &str, baseline: bool| kvroute_loadgen::ArmConfig {
        name: name.into(),
        target: "http://127.0.0.1:9".into(),
        baseline,
    };
    for arms in [
        vec![arm("a", true)],
        vec![arm("a", false), arm("a", true)],
        vec![arm("a b", false)],
    ] {
        let r = Service::new(ServiceConfig {
            arms,
            ..ServiceConfig::default()
        });
        assert!(matches!(
            r,
            Err(kvroute_loadgen::ServiceError::BadRequest(_))
        ));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_clients_past_the_cap_are_refused_and_slots_come_back() {
    let service = idle_service();
    let api = serve(service).await;
    let ws_url = format!("{}/api/ws", api.replace("http://", "ws://"));
    let mut held = Vec::new();
    for _ in 0..kvroute_loadgen::api::MAX_WEBSOCKETS {
        let (ws, _) = tokio_tungstenite::connect_async(&ws_url).await.unwrap();
        held.push(ws);
    }
    match tokio_tungstenite::connect_async(&ws_url).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(r)) => assert_eq!(r.status(), 503),
        other => panic!("expected 503, got {other:?}"),
    }
    // The HTTP API still answers beside them.
    let (s, _) = call("GET", &format!("{api}/api/status"), None).await;
    assert_eq!(s, 200);
    // A client that leaves frees its slot.
    let mut gone = held.pop().unwrap();
    gone.close(None).await.unwrap();
    drop(gone);
    let back = eventually(Duration::from_secs(10), async || {
        tokio_tungstenite::connect_async(&ws_url).await.is_ok()
    })
    .await;
    assert!(back, "no slot after a client left");
}

#[tokio::test]
async fn the_control_calls_need_the_admin_key_and_refuse_other_sites() {
    let service = idle_service();
    let policy = std::sync::Arc::new(kvroute_runtime::AccessPolicy {
        admin_key: Some("root".into()),
        loopback: true,
        ..Default::default()
    });
    let api = kvroute_testkit::serve(kvroute_loadgen::api::router(service, &policy)).await;
    let c = reqwest::Client::new();
    let post = |auth: Option<&'static str>, origin: Option<&'static str>| {
        let mut r = c
            .post(format!("{api}/api/concurrency"))
            .json(&json!({"concurrency": 3}));
        if let Some(a) = auth {
            r = r.header("authorization", a);
        }
        if let Some(o) = origin {
            r = r.header("origin", o);
        }
        async move { r.send().await.unwrap().status().as_u16() }
    };
    assert_eq!(post(None, None).await, 401);
    assert_eq!(post(Some("Bearer wrong"), None).await, 401);
    assert_eq!(
        post(Some("Bearer root"), Some("http://evil.example")).await,
        403
    );
    assert_eq!(post(Some("Bearer root"), None).await, 202);
    // The views stay readable without a key, but not from another site's page.
    let (s, _) = call("GET", &format!("{api}/api/status"), None).await;
    assert_eq!(s, 200);
    let s = c
        .get(format!("{api}/api/status"))
        .header("origin", "http://evil.example")
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(s, 403);
}

/// A gateway serving two models: the dashboard lists them, the load asks for the one chosen
/// (refused while running, or when the target does not serve it), the fleet views follow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_load_asks_for_the_model_chosen_and_the_views_follow_it() {
    let (workers, gw) = two_models().await;
    let service = Service::new(ServiceConfig {
        load: LoadgenConfig {
            target: gw.url(),
            concurrency: 2,
            conversations: u64::MAX,
            chat: small_chat(),
            ..LoadgenConfig::default()
        },
        tick_ms: 100,
        ..ServiceConfig::default()
    })
    .unwrap();
    let api = serve(service).await;
    let fleet_of =
        async || call("GET", &format!("{api}/api/fleet"), None).await.1["arms"][0]["fleet"].clone();
    let names = |f: &Value| -> Vec<String> {
        (f["workers"].as_array().unwrap().iter())
            .map(|w| w["name"].as_str().unwrap().to_string())
            .collect()
    };
    let f = fleet_of().await;
    assert_eq!(f["models"], json!(["kvroute-sim", "kvroute-sim-2"]), "{f}");
    assert_eq!(
        (names(&f), &f["pool"]),
        (vec!["w0".to_string()], &json!("kvroute-sim"))
    );
    let (_, st) = call("GET", &format!("{api}/api/status"), None).await;
    assert_eq!(st["model"], "kvroute-sim");

    // A model the target does not serve: refused, naming those it does.
    let (s, e) = call(
        "POST",
        &format!("{api}/api/model"),
        Some(json!({"model": "nope"})),
    )
    .await;
    assert_eq!(
        (s, e["error"]["code"].as_str()),
        (400, Some("bad_request")),
        "{e}"
    );
    let msg = e["error"]["message"].as_str().unwrap();
    assert!(msg.contains("serves kvroute-sim, kvroute-sim-2"), "{msg}");
    for bad in [json!({"model": ""}), json!({"name": "x"})] {
        let (s, _) = call("POST", &format!("{api}/api/model"), Some(bad)).await;
        assert_eq!(s, 400);
    }
    // The second model: the status and the views follow it.
    let (s, st) = call(
        "POST",
        &format!("{api}/api/model"),
        Some(json!({"model": "kvroute-sim-2"})),
    )
    .await;
    assert_eq!((s, &st["model"]), (200, &json!("kvroute-sim-2")), "{st}");
    let f = fleet_of().await;
    assert_eq!(
        (names(&f), &f["pool"]),
        (vec!["m2".to_string()], &json!("kvroute-sim-2"))
    );

    // The load asks for it; no change while it runs.
    let (s, _) = call("POST", &format!("{api}/api/start"), None).await;
    assert_eq!(s, 200);
    assert!(
        eventually(Duration::from_secs(30), async || {
            let (_, st) = call("GET", &format!("{api}/api/status"), None).await;
            st["arms"][0]["totals"]["completed"].as_u64() >= Some(2)
        })
        .await
    );
    let (s, e) = call(
        "POST",
        &format!("{api}/api/model"),
        Some(json!({"model": "kvroute-sim"})),
    )
    .await;
    assert_eq!(
        (s, e["error"]["code"].as_str()),
        (409, Some("conflict")),
        "{e}"
    );
    let (s, _) = call("POST", &format!("{api}/api/stop"), None).await;
    assert_eq!(s, 200);
    let text = support::metrics_text(&gw).await;
    let served = |model: &str| {
        kvroute_protocol::prometheus_text::series_value(
            &text,
            &format!("kvroute_requests_total{{model=\"{model}\",status=\"200\"}}"),
        )
        .unwrap_or(0.0)
    };
    assert!(served("kvroute-sim-2") >= 2.0, "{text}");
    assert_eq!(served("kvroute-sim"), 0.0);
    gw.shutdown().await;
    for w in workers {
        w.shutdown().await;
    }
}
