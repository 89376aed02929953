//! Worker roles (disaggregated fleets): a prefill-only worker is never a request's worker,
//! even when it holds the prompt; `/debug/workers` and the metrics show each worker's role
//! and each role's pool; a fleet of prefill workers only refuses requests with a reason.

use crate::support::*;
use kvroute_core::WorkerRole;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefill_only_worker_serves_no_request_whole_and_the_pools_show() {
    let (a, b) = (worker("a").await, worker("b").await);
    let mut cfg = config(&[&a, &b], "kv");
    cfg.workers[0].role = WorkerRole::Prefill;
    cfg.workers[1].role = WorkerRole::Decode;
    let gw = gateway(&[&a, &b], cfg).await;
    let url = gw.url();
    for i in 0..6 {
        let text = format!("question {i}: {}", "why route by prefix? ".repeat(8));
        let (s, w, j) = post(
            &url,
            "/v1/chat/completions",
            &chat(&[("user", &text)], false, 4),
        )
        .await;
        assert_eq!((s, w.as_deref()), (200, Some("b")), "{j}");
    }
    let d = debug_workers(&url).await;
    assert_eq!(d["workers"][0]["role"], "prefill", "{d}");
    assert_eq!(d["workers"][1]["role"], "decode", "{d}");
    assert_eq!(d["pools"]["prefill"]["workers"], 1, "{d}");
    assert_eq!(d["pools"]["decode"]["workers"], 1, "{d}");
    assert_eq!(d["pools"]["both"]["workers"], 0, "{d}");
    let metrics = kvroute_testkit::get_text(&client(), &format!("{url}/metrics")).await;
    let value = |series: &str| kvroute_testkit::sample(&metrics, series);
    assert_eq!(
        value(r#"kvroute_worker_role{worker="a",role="prefill"}"#),
        Some(1.0)
    );
    assert_eq!(
        value(r#"kvroute_worker_role{worker="a",role="both"}"#),
        Some(0.0)
    );
    assert_eq!(value(r#"kvroute_pool_workers{role="decode"}"#), Some(1.0));
    assert_eq!(
        value(r#"kvroute_pool_inflight_requests{role="prefill"}"#),
        Some(0.0)
    );
    gw.shutdown().await;

    // Prefill workers only: nobody decodes; the answer says so.
    let mut cfg = config(&[&a], "kv");
    cfg.workers[0].role = WorkerRole::Prefill;
    let gw = gateway(&[&a], cfg).await;
    let (s, _, j) = post(
        &gw.url(),
        "/v1/chat/completions",
        &chat(&[("user", "hi")], false, 4),
    )
    .await;
    assert_eq!(s, 503, "{j}");
    assert!(
        j["error"]["message"]
            .as_str()
            .unwrap()
            .contains("prefill-only"),
        "{j}"
    );
    gw.shutdown().await;
    a.shutdown().await;
    b.shutdown().await;
}
