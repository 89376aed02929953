//! A reload of a running gateway's tenants and classes: what each tenant holds carries over
//! by name, even when the tenants are reordered, and a request in flight across the reload
//! gives its hold back to its tenant.

use super::support::*;
use futures_util::StreamExt;
use kvroute_core::flow::TenantConfig;

fn tenant(name: &str, key: &str, max_concurrent: Option<u32>) -> TenantConfig {
    TenantConfig {
        name: name.into(),
        max_concurrent,
        api_keys: vec![key.into()],
        ..TenantConfig::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_changes_the_tenants_and_keeps_what_each_holds() {
    let w = worker("w").await;
    let mut cfg = config(&[&w], "kv");
    cfg.router.admission.flow.tenants = vec![tenant("a", "sk-a", Some(1))];
    let gw = gateway(&[&w], cfg.clone()).await;
    let url = gw.url();
    let body = chat(&[("user", "hello")], false, 4);

    // Tenant a's one request in flight: a long stream.
    let long = client()
        .post(format!("{url}/v1/chat/completions"))
        .bearer_auth("sk-a")
        .json(&chat(&[("user", "a long answer please")], true, 4000))
        .send()
        .await
        .unwrap();
    assert_eq!(long.status(), 200);
    let mut long = Box::pin(long.bytes_stream());
    assert!(long.next().await.is_some());
    let (status, _, json) = post_as(&url, "sk-a", None, &body).await;
    assert_eq!(status, 429, "a holds its one: {json}");

    // Reordered tenants (b first) and a class added: a's hold carries over by name.
    let mut new = cfg.clone();
    new.router.admission.flow.tenants =
        vec![tenant("b", "sk-b", Some(5)), tenant("a", "sk-a", Some(1))];
    new.router.admission.flow.classes = vec![kvroute_core::flow::ClassConfig {
        name: "high".into(),
        band: 1,
        ..Default::default()
    }];
    let report = gw.reload(new).unwrap();
    assert!(
        report
            .applied
            .iter()
            .any(|k| k.starts_with("router.admission.flow")),
        "{report:?}"
    );
    assert!(report.restart.is_empty(), "{report:?}");
    let (status, _, _) = post_as(&url, "sk-a", Some("high"), &body).await;
    assert_eq!(status, 429, "a still holds its one after the reload");
    let (status, _, json) = post_as(&url, "sk-b", Some("high"), &body).await;
    assert_eq!(status, 200, "b, the new tenant: {json}");

    // The long stream ends: its hold (given out before the reload) goes back to a.
    drop(long);
    assert!(
        eventually(10, async || post_as(&url, "sk-a", None, &body).await.0
            == 200)
        .await,
        "a's hold was given back"
    );
    let metrics = super::scrape(&url).await;
    assert!(
        metrics.contains("kvroute_class_time_to_first_token_seconds_count{class=\"high\"}"),
        "the new class's series"
    );
    gw.shutdown().await;
}
