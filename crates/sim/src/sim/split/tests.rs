//! The simulator's disaggregated fleets: split requests run both legs, the KV crosses the
//! link, `never` keeps every prompt on its decode engine.

use crate::{simulate, SimConfig, SimResult, Workload};
use kvroute_core::policy::DisaggregationMode;

fn chat(seed: u64) -> Workload {
    Workload::MultiTurn {
        gen: crate::sim::tests::small_chat(seed),
        concurrency: 4,
        requests: 60,
    }
}

/// One prefill engine and two decode engines of the tiny profile.
fn split_fleet(mode: DisaggregationMode, latency_secs: f64) -> SimResult {
    let mut cfg = SimConfig::for_profile("tiny", 3).unwrap();
    cfg.prefill_workers = 1;
    cfg.decode_workers = 2;
    cfg.router.disaggregation.mode = mode;
    cfg.router.disaggregation.link_latency_secs = latency_secs;
    simulate(&cfg, chat(1)).unwrap()
}

#[test]
fn always_runs_every_prompt_on_the_prefill_engine_and_decodes_elsewhere() {
    let r = split_fleet(DisaggregationMode::Always, 0.002);
    assert_eq!(r.summary.completed, 60);
    assert_eq!(
        r.kv_events_rejected, 0,
        "both legs' events agree with the index"
    );
    for rec in &r.records {
        assert_eq!(rec.prefill_worker, Some(0), "{rec:?}");
        assert!(matches!(rec.worker, Some(1 | 2)), "{rec:?}");
    }
    // A leg of one token per request on the prefill engine; the decode engines wrote the KV
    // they lacked instead of computing it.
    assert_eq!(r.engines[0].generated_tokens_total, 60);
    let sent: u64 = r.engines[1..].iter().map(|e| e.remote_tokens_total).sum();
    assert!(sent > 0);
    // Later turns find their conversation's prefix on the prefill engine.
    let hit = r.summary.hit_rate.unwrap_or(0.0);
    assert!(hit > 0.3, "{hit}");
    let again = split_fleet(DisaggregationMode::Always, 0.002);
    assert_eq!(
        serde_json::to_string(&r.records).unwrap(),
        serde_json::to_string(&again.records).unwrap()
    );
}

#[test]
fn never_leaves_the_prefill_engine_idle() {
    let r = split_fleet(DisaggregationMode::Never, 0.002);
    assert_eq!(r.summary.completed, 60);
    assert!(r.records.iter().all(|rec| rec.prefill_worker.is_none()));
    assert_eq!(r.engines[0].admitted_total, 0);
    assert_eq!(
        r.engines[1].remote_tokens_total + r.engines[2].remote_tokens_total,
        0
    );
}

#[test]
fn the_link_latency_is_in_every_split_requests_time_to_first_token() {
    let r = split_fleet(DisaggregationMode::Always, 0.25);
    for rec in &r.records {
        let ttft = rec.first_token.unwrap().since(rec.arrival).as_secs_f64();
        assert!(ttft >= 0.25, "{ttft}");
    }
    // `auto` weighs that latency: the tiny profile computes a prompt of 300 tokens in 4 ms,
    // so no prompt is worth a quarter of a second on the link.
    let r = split_fleet(DisaggregationMode::Auto, 0.25);
    assert!(r.records.iter().all(|rec| rec.prefill_worker.is_none()));
}
