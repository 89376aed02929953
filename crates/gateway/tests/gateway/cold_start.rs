//! A cold gateway in front of three identical workers, hit by a shared-prefix burst:
//! `goodput` leaves no worker idle while another is at its batch limit (read from the
//! gateway's per-worker in-flight counts, as the dashboard reads them). The simulator's test
//! (`crates/sim/tests/cold_start.rs`) reproduces the burst that left a worker idle; through a
//! real gateway the burst has not been reproduced on the old code either, so this test guards
//! the property live rather than replaying that failure.

use crate::support::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

const MAX_BATCH: u64 = 32;
const CONVERSATIONS: usize = 60;
const TURNS: usize = 4;
/// Real seconds of load (the workers run at 5x: 40 s of their time).
const RUN_SECS: u64 = 8;

/// One of 10 long starter documents (a few thousand tokens of the builtin tokenizer).
fn starter(i: usize) -> String {
    (0..900)
        .map(|w| format!("doc{i} line{w}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Client `c`: conversations of `TURNS` turns one after another until `until`.
async fn client_loop(url: String, c: usize, until: tokio::time::Instant) {
    let mut k = 0;
    while tokio::time::Instant::now() < until {
        conversation(&url, c, (c * 7 + k * 3) % 10).await;
        k += 1;
    }
}

async fn conversation(url: &str, c: usize, doc: usize) {
    let mut messages: Vec<(String, String)> = vec![(
        "user".into(),
        format!("{}\nQuestion {c}: what is this about?", starter(doc)),
    )];
    for turn in 0..TURNS {
        let refs: Vec<(&str, &str)> = messages
            .iter()
            .map(|(r, t)| (r.as_str(), t.as_str()))
            .collect();
        let mut body = chat(&refs, false, 50);
        body["ignore_eos"] = true.into();
        let (status, _, json) = post(url, "/v1/chat/completions", &body).await;
        assert_eq!(status, 200, "conversation {c} turn {turn}: {json}");
        let answer = json["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        messages.push(("assistant".into(), answer));
        messages.push(("user".into(), format!("Follow-up {turn} of {c}?")));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn goodput_leaves_no_worker_idle_while_another_is_at_its_batch_limit() {
    let mut workers = Vec::new();
    for name in ["worker-1", "worker-2", "worker-3"] {
        workers.push(worker_with(name, |c| c.speedup = 5.0).await);
    }
    let refs: Vec<_> = workers.iter().collect();
    let mut cfg = config(&refs, "goodput");
    for w in &mut cfg.workers {
        w.max_batch = Some(MAX_BATCH as u32);
    }
    let gw = gateway(&refs, cfg).await;
    let url = gw.url();
    let done = Arc::new(AtomicBool::new(false));
    let watch = {
        let (url, done) = (url.clone(), done.clone());
        tokio::spawn(async move {
            let mut worst: Option<Vec<u64>> = None;
            let mut samples = 0u64;
            let mut spread = 0u64;
            while !done.load(Ordering::Relaxed) {
                let d = debug_workers(&url).await;
                let inflight: Vec<u64> = d["workers"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|w| w["load"]["inflight"].as_u64().unwrap())
                    .collect();
                samples += 1;
                spread =
                    spread.max(inflight.iter().max().unwrap() - inflight.iter().min().unwrap());
                if inflight.contains(&0) && inflight.iter().any(|&n| n >= MAX_BATCH) {
                    worst.get_or_insert(inflight);
                }
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
            (worst, samples, spread)
        })
    };
    let until = tokio::time::Instant::now() + std::time::Duration::from_secs(RUN_SECS);
    let tasks: Vec<_> = (0..CONVERSATIONS)
        .map(|c| tokio::spawn(client_loop(url.clone(), c, until)))
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    done.store(true, Ordering::Relaxed);
    let (worst, samples, spread) = watch.await.unwrap();
    eprintln!("cold burst: {samples} samples of in-flight counts, largest spread {spread}");
    assert!(samples > 10, "{samples} samples");
    assert!(
        worst.is_none(),
        "a worker idle while another was at its batch limit: {worst:?}"
    );
}
