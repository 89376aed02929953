//! A cold fleet under a shared-prefix burst: `goodput` keeps every worker busy.
//!
//! Three identical `tiny-fast` engines, nothing learned, 60 conversations over 10 shared
//! starter documents all starting at once (short answers, so turns come fast). The burst
//! leaves each worker with prefill figures learned from the same few seconds (bent by the
//! prefixes the burst shares); the worker whose figures came out a little slower got no
//! request for seconds (so no sample to correct them) while the others sat at their batch
//! limit, until its figures went stale after 256 bookings per worker elsewhere
//! (`kvroute_core::ledger::STALE_PER_WORKER`; an idle worker's now go stale after 4,
//! `IDLE_STALE_PER_WORKER`). Checked from the records: per worker, the requests dispatched
//! (admission `none`: at arrival) and not finished.

use kvroute_core::admission::AdmissionMode;
use kvroute_core::PolicyKind;
use kvroute_sim::{simulate, SimConfig, Workload};
use kvroute_workload::{MultiTurn, MultiTurnConfig, RequestRecord};
use std::time::Duration;

const WORKERS: usize = 3;
const MAX_BATCH: i64 = 32;

/// Seconds before `until` during which some worker had nothing in flight while another
/// was at its batch limit, and the first such instant.
fn idle_while_full(records: &[RequestRecord], until: f64) -> (f64, Option<f64>) {
    let mut events: Vec<(f64, i64, usize)> = Vec::new();
    for r in records {
        let Some(w) = r.worker else { continue };
        events.push((r.arrival.0.as_secs_f64(), 1, w as usize));
        if let Some(f) = r.finished {
            events.push((f.0.as_secs_f64(), -1, w as usize));
        }
    }
    // At one instant, finishes before arrivals (a closed loop's next turn follows its end).
    events.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let mut inflight = [0i64; WORKERS];
    let (mut bad, mut first, mut last) = (0.0, None, 0.0);
    for (t, d, w) in events {
        if t > until {
            break;
        }
        let full = inflight.iter().any(|&n| n >= MAX_BATCH);
        if full && inflight.contains(&0) && t > last {
            bad += t - last;
            first.get_or_insert(last);
        }
        last = t;
        inflight[w] += d;
    }
    (bad, first)
}

#[test]
fn no_worker_idles_while_another_is_at_its_batch_limit_after_a_cold_burst() {
    for seed in 0..4 {
        let mut cfg = SimConfig::for_profile("tiny-fast", WORKERS).unwrap();
        assert_eq!(cfg.engine.max_num_seqs as i64, MAX_BATCH);
        cfg.router.policy.kind = PolicyKind::Goodput;
        cfg.router.admission.mode = AdmissionMode::None;
        cfg.router.seed = seed;
        cfg.duration = Some(Duration::from_secs(60));
        let gen = MultiTurn::new(
            MultiTurnConfig {
                starters: 10,
                max_tokens: 50,
                ..MultiTurnConfig::default()
            },
            seed,
        )
        .unwrap();
        let workload = Workload::MultiTurn {
            gen,
            concurrency: 60,
            requests: 1_000_000,
        };
        let r = simulate(&cfg, workload).unwrap();
        assert!(r.summary.completed > 1_000, "seed {seed}: {:?}", r.summary);
        let (bad, first) = idle_while_full(&r.records, 60.0);
        assert!(
            bad == 0.0,
            "seed {seed}: a worker idle while another was at its batch limit for {bad:.2} s \
             of the first minute (from {first:?} s)"
        );
    }
}
