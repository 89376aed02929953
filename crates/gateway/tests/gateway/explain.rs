//! The routing explanation: `/debug/explain` shows how a request would be routed now, and a
//! request with `x-kvroute-explain: 1` gets the explanation of its own decision in
//! `x-kvroute-route` (worker names, matched blocks, load, cost, the winner first).

use crate::support::*;
use kvroute_gateway::{EXPLAIN_HEADER, PREDICTED_CACHED_HEADER, ROUTE_HEADER};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_asks_gets_the_explanation_of_its_own_route() {
    let (a, b) = (worker("a").await, worker("b").await);
    let gw = gateway(&[&a, &b], config(&[&a, &b], "kv")).await;
    let url = gw.url();
    let doc = "an explained document about routing ".repeat(20);
    let body = chat(&[("user", &doc)], true, 4);
    let ask = async |explain: Option<&str>| {
        let mut req = client()
            .post(format!("{url}/v1/chat/completions"))
            .json(&body);
        if let Some(v) = explain {
            req = req.header(EXPLAIN_HEADER, v);
        }
        let r = req.send().await.unwrap();
        assert_eq!(r.status(), 200);
        let h = |n: &str| r.headers().get(n).map(|v| v.to_str().unwrap().to_string());
        let out = (
            h("x-kvroute-worker").unwrap(),
            h(PREDICTED_CACHED_HEADER)
                .unwrap()
                .parse::<usize>()
                .unwrap(),
            h(ROUTE_HEADER),
        );
        let _ = r.text().await.unwrap();
        out
    };
    // Not asked (or asked with 0): no header.
    let (first, _, none) = ask(None).await;
    assert!(none.is_none());
    assert!(ask(Some("0")).await.2.is_none());
    let i = if first == "a" { 0 } else { 1 };
    assert!(eventually(10, async || index_blocks(&url, i).await > 0).await);

    let (worker, predicted, route) = ask(Some("1")).await;
    let route: serde_json::Value = serde_json::from_str(&route.unwrap()).unwrap();
    assert_eq!(route["policy"], "kv");
    assert_eq!(route["block_size"], 16);
    assert_eq!(route["omitted"], 0);
    let workers = route["workers"].as_array().unwrap();
    assert_eq!(workers.len(), 2, "{route}");
    // The winner first: the worker that served it, with the blocks it was predicted to hold.
    assert_eq!(workers[0]["chosen"], true, "{route}");
    assert_eq!(workers[0]["name"], worker.as_str(), "{route}");
    assert_eq!(worker, first);
    let matched = workers[0]["matched_blocks"].as_u64().unwrap() as usize;
    assert!(matched > 0, "{route}");
    assert_eq!(matched * 16, predicted, "{route}");
    assert_eq!(workers[1]["chosen"], false);
    assert_eq!(workers[1]["matched_blocks"], 0);
    assert!(workers[0]["cost"].as_f64().unwrap() < workers[1]["cost"].as_f64().unwrap());
    assert_eq!(
        workers[0]["uncached_tokens"].as_u64().unwrap() + matched as u64 * 16,
        route["prompt_tokens"].as_u64().unwrap()
    );

    // The debug endpoint explains the same request without sending it, naming the workers
    // as the header does.
    let ex: serde_json::Value = client()
        .post(format!("{url}/debug/explain"))
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        ex["workers"][i]["matched_blocks"].as_u64().unwrap() as usize,
        matched
    );
    assert_eq!(ex["workers"][i]["worker"], worker.as_str(), "{ex}");
    assert_eq!(
        ex["workers"][1 - i]["worker"],
        if i == 0 { "b" } else { "a" }
    );
    assert_eq!(ex["workers"][i]["id"], i as u64 + 1, "{ex}");
    assert_eq!(ex["winner"], worker.as_str(), "{ex}");
    gw.shutdown().await;
    a.shutdown().await;
    b.shutdown().await;
}
