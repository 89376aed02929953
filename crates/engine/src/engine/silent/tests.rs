//! Silent runs and decode-only scheduling change nothing: the same tokens at the same times,
//! the same events, finishes and counters as the general scheduler stepped one by one.

use super::super::{Engine, EngineConfig, EngineMetrics, EngineRequest, Finished, Sampled};
use crate::Profile;
use kvroute_core::{KvEvent, RequestId, Time};
use proptest::prelude::*;
use std::time::Duration;

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    /// Fast paths off, stepped at every step end.
    Plain,
    /// Fast paths on, stepped at every step end.
    EveryStep,
    /// Fast paths on, stepped only when the engine reports more than tokens.
    Reports,
    /// As `Reports`, with silent steps' tokens reported by run.
    Runs,
}

#[derive(Debug, PartialEq)]
struct Run {
    tokens: Vec<Sampled>,
    /// Every token's request and time (from runs too).
    timed: Vec<(RequestId, Time)>,
    events: Vec<(Time, Vec<KvEvent>)>,
    finished: Vec<Finished>,
    metrics: EngineMetrics,
    calls: usize,
}

fn run(cfg: &EngineConfig, arrivals: &[(u64, EngineRequest)], mode: Mode) -> Run {
    let mut e = Engine::new(cfg.clone()).unwrap();
    e.set_fast_paths(mode != Mode::Plain);
    e.set_token_runs(mode == Mode::Runs);
    let mut arrivals: std::collections::VecDeque<_> = arrivals.iter().cloned().collect();
    let mut r = Run {
        tokens: Vec::new(),
        timed: Vec::new(),
        events: Vec::new(),
        finished: Vec::new(),
        metrics: EngineMetrics::default(),
        calls: 0,
    };
    for _ in 0..1_000_000 {
        let next_arrival = arrivals.front().map(|a| Time::from_millis(a.0));
        let next_step = match mode {
            Mode::Reports | Mode::Runs => e.next_report_time(),
            _ => e.next_event_time(),
        };
        let t = match (next_arrival, next_step) {
            (None, None) => {
                r.metrics = e.metrics();
                return r;
            }
            (a, s) => a.into_iter().chain(s).min().unwrap(),
        };
        while arrivals
            .front()
            .is_some_and(|a| Time::from_millis(a.0) <= t)
        {
            let (_, q) = arrivals.pop_front().unwrap();
            e.submit(q, t).unwrap();
        }
        let out = e.step(t);
        r.calls += 1;
        r.timed.extend(out.runs.tokens());
        r.timed.extend(out.tokens.iter().map(|t| (t.id, t.time)));
        r.tokens.extend(out.tokens);
        if !out.events.is_empty() {
            r.events.push((out.time, out.events));
        }
        r.finished.extend(out.finished);
        e.pool().check_invariants().unwrap();
    }
    panic!("the engine never went idle");
}

fn config(model: usize, blocks: usize, overhead_ms: u64) -> EngineConfig {
    let mut cfg = EngineConfig::from_profile(&Profile::builtin("tiny").unwrap());
    cfg.model = match model {
        0 => cfg.model,
        1 => Profile::builtin("mocker-poly").unwrap().step_model(),
        _ => Profile::builtin("a100-40g-qwen3-8b").unwrap().step_model(),
    };
    cfg.num_gpu_blocks = blocks;
    cfg.request_overhead = Duration::from_millis(overhead_ms);
    cfg
}

/// Requests with prompts drawn from a few shared prefixes.
fn requests(spec: &[(u64, usize, usize, u32)]) -> Vec<(u64, EngineRequest)> {
    let mut out: Vec<_> = spec
        .iter()
        .enumerate()
        .map(|(i, &(at, prefix, len, max_tokens))| {
            let tokens = (0..len as u32)
                .map(|k| {
                    if k < 12 {
                        prefix as u32 * 1000 + k
                    } else {
                        7 * k + i as u32
                    }
                })
                .collect();
            (
                at,
                EngineRequest::new(RequestId(i as u64), tokens, max_tokens),
            )
        })
        .collect();
    out.sort_by_key(|a| a.0);
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn fast_paths_and_silent_runs_change_nothing(
        spec in prop::collection::vec((0u64..300, 0usize..3, 1usize..40, 1u32..60), 1..16),
        model in 0usize..3,
        blocks in prop::sample::select(vec![32usize, 64, 256]),
        overhead_ms in prop::sample::select(vec![0u64, 3]),
    ) {
        let cfg = config(model, blocks, overhead_ms);
        let arrivals = requests(&spec);
        let plain = run(&cfg, &arrivals, Mode::Plain);
        let every = run(&cfg, &arrivals, Mode::EveryStep);
        let reports = run(&cfg, &arrivals, Mode::Reports);
        let runs = run(&cfg, &arrivals, Mode::Runs);
        prop_assert_eq!(&plain.tokens, &every.tokens);
        prop_assert_eq!(&plain.tokens, &reports.tokens);
        prop_assert_eq!(&plain.timed, &runs.timed);
        prop_assert_eq!(&plain.events, &every.events);
        prop_assert_eq!(&plain.events, &reports.events);
        prop_assert_eq!(&plain.events, &runs.events);
        prop_assert_eq!(&plain.finished, &every.finished);
        prop_assert_eq!(&plain.finished, &reports.finished);
        prop_assert_eq!(&plain.finished, &runs.finished);
        prop_assert_eq!(&plain.metrics, &every.metrics);
        prop_assert_eq!(&plain.metrics, &reports.metrics);
        prop_assert_eq!(&plain.metrics, &runs.metrics);
    }
}

#[test]
fn a_long_decode_is_reported_in_few_calls() {
    // One request decoding 200 tokens in blocks of 4: a report per block boundary, not per
    // token.
    let cfg = config(1, 256, 0);
    let arrivals = requests(&[(0, 0, 8, 200)]);
    let plain = run(&cfg, &arrivals, Mode::Plain);
    let reports = run(&cfg, &arrivals, Mode::Reports);
    let runs = run(&cfg, &arrivals, Mode::Runs);
    assert_eq!(plain.tokens, reports.tokens);
    assert_eq!(plain.timed, runs.timed);
    assert!(
        runs.tokens.len() < 60,
        "{} tokens one by one",
        runs.tokens.len()
    );
    assert_eq!(plain.tokens.len(), 200);
    assert!(plain.calls > 200, "{} calls", plain.calls);
    assert!(reports.calls <= 60, "{} calls", reports.calls);
}
