//! Roles and disaggregated prefill: prefill-only workers, the split decision, the prefill
//! worker offered.

use super::*;
use crate::policy::DisaggregationMode;

#[test]
fn a_prefill_only_worker_is_never_a_requests_worker() {
    let mut r = router(PolicyKind::Kv, AdmissionConfig::default());
    let t = tokens(160, 9);
    let p = prompt(&t);
    // Worker 2 holds the whole prompt; as a prefill-only worker it is not offered.
    store(&mut r, 2, &t);
    r.set_role(WorkerId(2), WorkerRole::Prefill);
    r.set_role(WorkerId(3), WorkerRole::Decode);
    assert_eq!(r.role(WorkerId(2)), WorkerRole::Prefill);
    assert_eq!(r.role(WorkerId(1)), WorkerRole::Both);
    for _ in 0..4 {
        match r.route(&req(&p)) {
            RouteOutcome::Dispatch(sel) => assert_ne!(sel.worker, WorkerId(2)),
            other => panic!("{other:?}"),
        }
    }
    let ex = r.explain(&req(&p));
    assert!(ex.workers.iter().all(|w| w.worker != WorkerId(2)));
    // Back to both: it is the prefix's worker again.
    r.set_role(WorkerId(2), WorkerRole::Both);
    match r.route(&req(&p)) {
        RouteOutcome::Dispatch(sel) => assert_eq!(sel.worker, WorkerId(2)),
        other => panic!("{other:?}"),
    }
    // Only prefill workers: nobody to serve the request, a rejection.
    for w in 1..=3 {
        r.set_role(WorkerId(w), WorkerRole::Prefill);
    }
    assert_eq!(
        r.route(&req(&p)),
        RouteOutcome::Reject(RejectReason::NoWorkers, None)
    );
    // Forgetting a worker forgets its role.
    r.remove_worker(WorkerId(1));
    assert_eq!(r.role(WorkerId(1)), WorkerRole::Both);
    assert_eq!("decode".parse::<WorkerRole>(), Ok(WorkerRole::Decode));
    assert!("leader"
        .parse::<WorkerRole>()
        .unwrap_err()
        .contains("both, prefill, decode"));
}

/// Books `p` on `worker` as request `id` (left running).
fn run_on(r: &mut Router, worker: u64, id: u64, p: &BlockedPrompt) {
    let sel = plain(worker);
    r.dispatch(RequestId(id), &req(p), &sel, Time::from_millis(0))
        .unwrap();
}

/// Teaches the router `worker`'s prefill speed: 10,000 tokens a second, 5 ms overhead.
fn learn_prefill(r: &mut Router, worker: u64) {
    for k in 1..=4u64 {
        let id = 1_000 * worker + k;
        let p = prompt(&tokens(500 * k as usize, id as u32));
        let at = 1_000 * k;
        let sel = plain(worker);
        r.dispatch(RequestId(id), &req(&p), &sel, Time::from_millis(at))
            .unwrap();
        r.first_token(RequestId(id), Time::from_millis(at + 5 + 50 * k))
            .unwrap();
        r.finish(RequestId(id), Time::from_millis(at + 500))
            .unwrap();
    }
}

/// Workers 1 and 2 decode, 3 prefills (their prefill speed learned); requests may be split.
fn disaggregated(kind: PolicyKind, mode: DisaggregationMode) -> Router {
    let mut r = router(kind, AdmissionConfig::default());
    for w in 1..=3 {
        learn_prefill(&mut r, w);
    }
    r.set_role(WorkerId(1), WorkerRole::Decode);
    r.set_role(WorkerId(2), WorkerRole::Decode);
    r.set_role(WorkerId(3), WorkerRole::Prefill);
    r.config.disaggregation.mode = mode;
    r.set_split_prefill(true);
    r
}

fn prefill_of(out: RouteOutcome) -> (WorkerId, Option<WorkerId>) {
    match out {
        RouteOutcome::Dispatch(sel) => (sel.worker, sel.prefill.map(|p| p.worker)),
        other => panic!("{other:?}"),
    }
}

#[test]
fn auto_disaggregation_splits_a_long_prompt_off_busy_decoders_unless_they_hold_it() {
    let mut r = disaggregated(PolicyKind::Goodput, DisaggregationMode::Auto);
    // Both decode workers run requests: a long prompt computed there would stall them.
    for (id, w) in [(1, 1), (2, 1), (3, 2), (4, 2)] {
        run_on(&mut r, w, id, &prompt(&tokens(64, 100 + id as u32)));
    }
    let long_tokens = tokens(4_000, 7);
    let long = prompt(&long_tokens);
    let (decode, prefill) = prefill_of(r.route(&req(&long)));
    assert!(decode == WorkerId(1) || decode == WorkerId(2));
    assert_eq!(
        prefill,
        Some(WorkerId(3)),
        "split off the busy decode workers"
    );
    // A long prompt the decode worker holds almost whole stays there.
    store(&mut r, 1, &long_tokens[..3_968]);
    let (decode, prefill) = prefill_of(r.route(&req(&long)));
    assert_eq!((decode, prefill), (WorkerId(1), None));
    // The explanation names the prefill worker offered and whether it took the prompt.
    let ex = r.explain(&req(&prompt(&tokens(4_000, 9))));
    let p = ex.prefill.expect("a prefill worker offered");
    assert_eq!((p.worker, p.chosen), (WorkerId(3), true));
}

#[test]
fn an_idle_decoder_computes_a_short_prompt_itself_and_a_backed_up_prefill_pool_is_bypassed() {
    let mut r = disaggregated(PolicyKind::Goodput, DisaggregationMode::Auto);
    let long = prompt(&tokens(4_000, 7));
    // Idle decode workers: a short prompt is computed where it is decoded; a long one goes
    // to the idle prefill worker, though nothing runs on the decoders yet: computed there,
    // it would hold up the next request to arrive at its decoder for 0.4 s.
    assert_eq!(prefill_of(r.route(&req(&prompt(&tokens(20, 8))))).1, None);
    assert_eq!(prefill_of(r.route(&req(&long))).1, Some(WorkerId(3)));
    for (id, w) in [(1, 1), (2, 1), (3, 2), (4, 2)] {
        run_on(&mut r, w, id, &prompt(&tokens(64, 100 + id as u32)));
    }
    assert_eq!(prefill_of(r.route(&req(&long))).1, Some(WorkerId(3)));
    // The prefill worker has 40,000 tokens of prefill booked ahead: not worth the wait.
    for id in 10..20 {
        run_on(&mut r, 3, id, &prompt(&tokens(4_000, id as u32)));
    }
    assert_eq!(prefill_of(r.route(&req(&long))).1, None);
}

#[test]
fn always_and_never_force_either_way_and_nothing_is_split_unless_the_caller_can() {
    let long = prompt(&tokens(4_000, 7));
    let short = prompt(&tokens(20, 8));
    let mut always = disaggregated(PolicyKind::Goodput, DisaggregationMode::Always);
    assert_eq!(prefill_of(always.route(&req(&short))).1, Some(WorkerId(3)));
    let mut never = disaggregated(PolicyKind::Goodput, DisaggregationMode::Never);
    for (id, w) in [(1, 1), (2, 1), (3, 2), (4, 2)] {
        run_on(&mut never, w, id, &prompt(&tokens(64, 100 + id as u32)));
        run_on(&mut always, w, id, &prompt(&tokens(64, 100 + id as u32)));
    }
    assert_eq!(prefill_of(never.route(&req(&long))).1, None);
    assert_eq!(prefill_of(always.route(&req(&long))).1, Some(WorkerId(3)));
    // Other policies choose their decode worker as ever; `always` splits under them too.
    let kv = disaggregated(PolicyKind::Kv, DisaggregationMode::Always);
    assert_eq!(prefill_of(kv.route(&req(&long))).1, Some(WorkerId(3)));
    // A caller that cannot run two legs gets whole requests whatever the mode.
    always.set_split_prefill(false);
    assert_eq!(prefill_of(always.route(&req(&long))).1, None);
    let bad = RouterConfig {
        disaggregation: crate::policy::DisaggregationConfig {
            link_bytes_per_sec: 0.0,
            ..Default::default()
        },
        ..RouterConfig::default()
    };
    assert!(Router::new(bad).is_err());
    assert!("sometimes".parse::<DisaggregationMode>().is_err());
}

#[test]
fn the_prefill_worker_holding_the_prompt_is_offered() {
    let mut r = disaggregated(PolicyKind::Goodput, DisaggregationMode::Always);
    r.add_worker(
        WorkerId(4),
        WorkerCapacity {
            kv_blocks: Some(1_000),
            max_batch: Some(64),
        },
    )
    .unwrap();
    r.set_role(WorkerId(4), WorkerRole::Prefill);
    let t = tokens(4_000, 11);
    store(&mut r, 4, &t[..3_200]);
    let sel = match r.route(&req(&prompt(&t))) {
        RouteOutcome::Dispatch(sel) => sel,
        other => panic!("{other:?}"),
    };
    let p = sel.prefill.expect("split");
    assert_eq!((p.worker, p.matched_blocks), (WorkerId(4), 200));
    // The engines report the prefill worker's hit.
    assert_eq!(sel.cached_tokens, 3_200);
}

#[test]
fn a_split_request_books_its_prefill_on_the_prefill_worker_and_teaches_the_decoder_nothing() {
    let mut r = disaggregated(PolicyKind::Goodput, DisaggregationMode::Always);
    let p = prompt(&tokens(4_000, 21));
    let sel = match r.route(&req(&p)) {
        RouteOutcome::Dispatch(sel) => sel,
        other => panic!("{other:?}"),
    };
    let remote = sel.prefill.expect("split");
    let decoder = sel.worker;
    let before = r.ledger().prefill_estimate(decoder);
    let t0 = Time::from_millis(100_000);
    r.check_dispatch(RequestId(1), &sel).unwrap();
    r.dispatch(RequestId(1), &req(&p), &sel, t0).unwrap();
    r.dispatch_prefill(RequestId(2), &req(&p), &remote, t0)
        .unwrap();
    let load = |r: &Router, w: WorkerId| r.ledger().load(w).unwrap();
    // The decoder runs it without computing its prompt; the prefill worker computes it.
    assert_eq!(
        (load(&r, decoder).inflight, load(&r, decoder).prefill_tokens),
        (1, 0)
    );
    assert_eq!(load(&r, remote.worker).prefill_tokens, 4_000);
    // The prefill leg answers after 0.4 s: its worker's prefill is done and measured.
    r.first_token(RequestId(2), Time::from_millis(100_400))
        .unwrap();
    r.finish(RequestId(2), Time::from_millis(100_400)).unwrap();
    assert_eq!(load(&r, remote.worker).prefill_tokens, 0);
    assert_eq!(load(&r, remote.worker).inflight, 0);
    // The decoder's first token (after the prefill and the transfer) is no sample of its
    // own prefill speed.
    r.first_token(RequestId(1), Time::from_millis(100_450))
        .unwrap();
    assert_eq!(r.ledger().prefill_estimate(decoder), before);
    r.finish(RequestId(1), Time::from_millis(101_000)).unwrap();
    assert_eq!(load(&r, decoder).inflight, 0);
}

#[test]
fn a_split_requests_first_token_timed_from_its_kv_teaches_the_decoder_its_own_way_to_it() {
    let mut r = disaggregated(PolicyKind::Goodput, DisaggregationMode::Always);
    let p = prompt(&tokens(4_001, 22));
    let sel = match r.route(&req(&p)) {
        RouteOutcome::Dispatch(sel) => sel,
        other => panic!("{other:?}"),
    };
    let remote = sel.prefill.expect("split");
    let decoder = sel.worker;
    let samples = |r: &Router| {
        r.ledger()
            .prefill_estimate(decoder)
            .map_or(0, |e| e.samples)
    };
    let before = samples(&r);
    let load = |r: &Router| r.ledger().load(decoder).unwrap().prefill_tokens;
    r.dispatch(RequestId(1), &req(&p), &sel, Time::from_millis(100_000))
        .unwrap();
    r.dispatch_prefill(RequestId(2), &req(&p), &remote, Time::from_millis(100_000))
        .unwrap();
    r.first_token(RequestId(2), Time::from_millis(100_400))
        .unwrap();
    assert_eq!(load(&r), 0, "nothing to compute there before the KV comes");
    // The KV arrives: the decoder computes the prompt's last tokens (4,001 = 250 blocks of
    // 16 and 1: the token after the last full block), and its first token 30 ms later is
    // a sample of its prefill like any other.
    r.kv_arrived(RequestId(1), Time::from_millis(100_405))
        .unwrap();
    assert_eq!(load(&r), 1);
    r.first_token(RequestId(1), Time::from_millis(100_435))
        .unwrap();
    assert_eq!(load(&r), 0);
    assert_eq!(samples(&r), before + 1);
    // Once only, and never for an unknown request.
    r.kv_arrived(RequestId(1), Time::from_millis(100_500))
        .unwrap();
    assert_eq!(samples(&r), before + 1);
    assert!(r
        .kv_arrived(RequestId(9), Time::from_millis(100_500))
        .is_err());
    // A prompt ending on a block boundary leaves its last block to compute: engines never
    // take the last token as cached.
    assert_eq!(crate::policy::decode_tail(4_000, 16), 16);
    assert_eq!(crate::policy::decode_tail(4_001, 16), 1);
    assert_eq!(crate::policy::decode_tail(1, 16), 1);
}
