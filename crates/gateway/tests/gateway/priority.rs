//! The engine's own priority end to end: the gateway sends each class's `engine_priority`
//! to a simulated worker marked as taking it (`kvroute worker --scheduling-policy priority`,
//! one request at a time), whose engine then serves the waiting requests of the lower value
//! first; a worker not marked, first come first served, is the control.

use super::support::*;
use kvroute_core::flow::{ClassConfig, FlowConfig};
use std::time::{Duration, Instant};

/// When each of three `low` then three `high` requests ended, sent while a long `low` one
/// runs; `marked`: the worker schedules by priority and the gateway sends it.
async fn ends(marked: bool) -> (Vec<Instant>, Vec<Instant>) {
    let w = worker_with("p", |c| {
        c.speedup = 1.0;
        c.max_num_seqs = Some(1);
        if marked {
            c.scheduling_policy = kvroute_worker::SchedulingPolicy::Priority;
        }
    })
    .await;
    let mut cfg = config(&[&w], "round_robin");
    cfg.router.admission.mode = kvroute_core::AdmissionMode::None;
    if marked {
        cfg.workers[0].priority = Some(kvroute_gateway::config::EnginePriority::LowerFirst);
    }
    let class = |name: &str, p: i32| ClassConfig {
        name: name.into(),
        engine_priority: Some(p),
        ..ClassConfig::default()
    };
    cfg.router.admission.flow = FlowConfig {
        classes: vec![class("low", 10), class("high", 0)],
        default_class: Some("low".into()),
        ..FlowConfig::default()
    };
    let gw = gateway_with_feeds(cfg, Default::default()).await;
    let url = gw.url();
    let send = |class: &'static str, text: String, max_tokens: u32| {
        let url = url.clone();
        tokio::spawn(async move {
            let r = client()
                .post(format!("{url}/v1/chat/completions"))
                .header("x-kvroute-class", class)
                .json(&chat(&[("user", &text)], false, max_tokens))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
            r.bytes().await.unwrap();
            Instant::now()
        })
    };
    // 150 decode steps of 10 ms: the others wait in the engine's queue behind it.
    let long = send("low", "the long one".into(), 150);
    tokio::time::sleep(Duration::from_millis(150)).await;
    let mut lows = Vec::new();
    for i in 0..3 {
        lows.push(send("low", format!("low {i}"), 4));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut highs = Vec::new();
    for i in 0..3 {
        highs.push(send("high", format!("high {i}"), 4));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    long.await.unwrap();
    let done = |v: Vec<tokio::task::JoinHandle<Instant>>| async move {
        let mut t = Vec::new();
        for h in v {
            t.push(h.await.unwrap());
        }
        t
    };
    let (lows, highs) = (done(lows).await, done(highs).await);
    gw.shutdown().await;
    w.shutdown().await;
    (lows, highs)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_scheduling_by_priority_serves_the_higher_class_first() {
    let (lows, highs) = ends(true).await;
    let last_high = highs.iter().max().unwrap();
    assert!(
        lows.iter().all(|l| l > last_high),
        "every waiting low ends after the last high"
    );
    // The control: first come, first served.
    let (lows, highs) = ends(false).await;
    assert!(
        lows.iter().max().unwrap() < highs.iter().min().unwrap(),
        "first come, first served"
    );
}
