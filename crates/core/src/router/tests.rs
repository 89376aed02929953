use super::*;
use crate::admission::AdmissionConfig;
use crate::hashing::{local_block_hashes, Namespace};
use crate::index::StoredBlocks;
use crate::policy::{PolicyConfig, PolicyKind};
use crate::tiers::Loadable;
use crate::EngineHash;

const BS: usize = 16;

fn router(kind: PolicyKind, admission: AdmissionConfig) -> Router {
    let mut cfg = RouterConfig {
        block_size: BS,
        admission,
        ..RouterConfig::default()
    };
    cfg.policy.kind = kind;
    let mut r = Router::new(cfg).unwrap();
    for w in 1..=3 {
        r.add_worker(
            WorkerId(w),
            WorkerCapacity {
                kv_blocks: Some(1_000),
                max_batch: Some(64),
            },
        )
        .unwrap();
    }
    r
}

fn tokens(n: usize, salt: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| i.wrapping_mul(31).wrapping_add(salt))
        .collect()
}

fn prompt(t: &[u32]) -> BlockedPrompt {
    BlockedPrompt::new(t, BlockSize::new(BS).unwrap(), Namespace::default())
}

fn store(r: &mut Router, w: u64, t: &[u32]) {
    let n = t.len() / BS;
    r.apply_event(
        WorkerId(w),
        &KvEvent::Stored(StoredBlocks {
            parent: None,
            block_hashes: (0..n as u64).map(|i| EngineHash(w << 32 | i)).collect(),
            token_ids: t[..n * BS].to_vec(),
            block_size: BS,
            namespace: Namespace::default(),
            block_keys: Vec::new(),
        }),
    )
    .unwrap();
}

fn req(p: &BlockedPrompt) -> RouteRequest<'_> {
    RouteRequest::new(p)
}

/// A selection of `worker` with nothing cached (a dispatch the policy did not choose).
fn plain(worker: u64) -> Selection {
    Selection {
        worker: WorkerId(worker),
        matched_blocks: 0,
        loadable: Loadable::default(),
        cached_tokens: 0,
        cost: None,
        prefill: None,
    }
}

/// Sends `p` to `worker` as request `id` at `at_ms` and finishes it 10 ms later (a dispatch the
/// policy did not choose: what a dispatch records is under test).
fn send_to(r: &mut Router, worker: u64, id: u64, p: &BlockedPrompt, at_ms: u64) -> Selection {
    let sel = plain(worker);
    r.check_dispatch(RequestId(id), &sel).unwrap();
    r.dispatch(RequestId(id), &req(p), &sel, Time::from_millis(at_ms))
        .unwrap();
    r.finish(RequestId(id), Time::from_millis(at_ms + 10))
        .unwrap();
    sel
}

#[test]
fn kv_routes_to_the_worker_holding_the_prefix() {
    let mut r = router(PolicyKind::Kv, AdmissionConfig::default());
    let t = tokens(1_000, 7);
    store(&mut r, 2, &t[..640]);
    let p = prompt(&t);
    let RouteOutcome::Dispatch(sel) = r.route(&req(&p)) else {
        panic!("expected dispatch")
    };
    assert_eq!(sel.worker, WorkerId(2));
    assert_eq!(sel.matched_blocks, 40);
    assert_eq!(sel.cached_tokens, 640);
    assert_eq!(sel.cost, Some((1_000.0 - 640.0) / 16.0));
    // route has no side effects.
    assert_eq!(r.route(&req(&p)), RouteOutcome::Dispatch(sel.clone()));
    // One evaluation gives both the outcome and its explanation.
    let (outcome, ex) = r.route_explained(&req(&p));
    assert_eq!(outcome, RouteOutcome::Dispatch(sel.clone()));
    assert_eq!(ex, r.explain(&req(&p)));
    assert_eq!(ex.winner, Some(WorkerId(2)));
    assert_eq!(r.ledger().inflight(), 0);
    r.dispatch(RequestId(1), &req(&p), &sel, Time::ZERO)
        .unwrap();
    let load = r.ledger().load(WorkerId(2)).unwrap();
    assert_eq!(
        (load.inflight, load.prefill_tokens, load.active_blocks),
        (1, 360, 63)
    );
    r.first_token(RequestId(1), Time::from_millis(40)).unwrap();
    r.finish(RequestId(1), Time::from_millis(900)).unwrap();
    assert_eq!(r.ledger().load(WorkerId(2)).unwrap().inflight, 0);
    assert!(r.ledger().prefill_estimate(WorkerId(2)).is_some());
}

#[test]
fn round_robin_advances_only_on_dispatch() {
    let mut r = router(PolicyKind::RoundRobin, AdmissionConfig::default());
    let p = prompt(&tokens(40, 1));
    let mut seen = Vec::new();
    for i in 0..6 {
        let RouteOutcome::Dispatch(a) = r.route(&req(&p)) else {
            panic!()
        };
        let RouteOutcome::Dispatch(b) = r.route(&req(&p)) else {
            panic!()
        };
        assert_eq!(a, b);
        r.dispatch(RequestId(i), &req(&p), &a, Time::ZERO).unwrap();
        seen.push(a.worker.0);
    }
    assert_eq!(seen, vec![1, 2, 3, 1, 2, 3]);
}

#[test]
fn busy_workers_are_skipped_then_queued_or_shed() {
    let adm = AdmissionConfig {
        busy_prefill_tokens: Some(500),
        ..AdmissionConfig::default()
    };
    let mut r = router(PolicyKind::Kv, adm.clone());
    let t = tokens(600, 3);
    store(&mut r, 1, &t);
    let p = prompt(&t);
    let load_up = |r: &mut Router, id: u64, w: u64| {
        let other = prompt(&tokens(600, 100 + id as u32));
        let sel = Selection {
            worker: WorkerId(w),
            matched_blocks: 0,
            loadable: Loadable::default(),
            cached_tokens: 0,
            cost: None,
            prefill: None,
        };
        r.dispatch(RequestId(id), &req(&other), &sel, Time::ZERO)
            .unwrap();
    };
    let RouteOutcome::Dispatch(s) = r.route(&req(&p)) else {
        panic!()
    };
    assert_eq!(s.worker, WorkerId(1), "the prefix holder while it is free");
    load_up(&mut r, 1, 1);
    let RouteOutcome::Dispatch(s) = r.route(&req(&p)) else {
        panic!()
    };
    assert_ne!(
        s.worker,
        WorkerId(1),
        "busy worker skipped despite its cache"
    );
    load_up(&mut r, 2, 2);
    let RouteOutcome::Dispatch(s) = r.route(&req(&p)) else {
        panic!()
    };
    assert_eq!(s.worker, WorkerId(3), "the only free worker");
    let ex = r.explain(&req(&p));
    assert_eq!(ex.winner, Some(WorkerId(3)));
    assert!(ex.workers[0].busy && !ex.workers[0].eligible && ex.workers[0].cost.is_none());
    assert_eq!(ex.workers[0].matched_blocks, 37);
    load_up(&mut r, 3, 3);
    assert_eq!(r.route(&req(&p)), RouteOutcome::Queue);
    let mut shed = AdmissionConfig {
        mode: AdmissionMode::Shed,
        ..adm
    };
    r.config.admission = shed.clone();
    assert_eq!(
        r.route(&req(&p)),
        RouteOutcome::Reject(RejectReason::AllWorkersBusy, None)
    );
    shed.mode = AdmissionMode::None;
    r.config.admission = shed;
    assert!(matches!(r.route(&req(&p)), RouteOutcome::Dispatch(_)));
}

#[test]
fn no_workers_is_a_rejection_not_a_panic() {
    let r = Router::new(RouterConfig::default()).unwrap();
    let p = prompt(&tokens(100, 1));
    assert_eq!(
        r.route(&req(&p)),
        RouteOutcome::Reject(RejectReason::NoWorkers, None)
    );
    let ex = r.explain(&req(&p));
    assert!(ex.workers.is_empty() && ex.winner.is_none());
}

#[test]
fn approximate_mode_learns_from_its_own_routing() {
    let cfg = RouterConfig {
        block_size: BS,
        approx: ApproxConfig {
            ttl_secs: 60.0,
            max_blocks_per_worker: 10_000,
        },
        policy: PolicyConfig {
            kind: crate::policy::PolicyKind::Kv,
            ..PolicyConfig::default()
        },
        ..RouterConfig::default()
    };
    let mut r = Router::new(cfg).unwrap();
    for w in 1..=4 {
        r.add_worker_with(
            WorkerId(w),
            WorkerCapacity::default(),
            Tracking::Approximate,
        )
        .unwrap();
    }
    let t = tokens(800, 9);
    let p = prompt(&t);
    let RouteOutcome::Dispatch(first) = r.route(&req(&p)) else {
        panic!()
    };
    r.dispatch(RequestId(1), &req(&p), &first, Time::ZERO)
        .unwrap();
    r.finish(RequestId(1), Time::from_millis(500)).unwrap();
    let follow = prompt(&[t.clone(), tokens(200, 5)].concat());
    let RouteOutcome::Dispatch(second) = r.route(&req(&follow)) else {
        panic!()
    };
    assert_eq!(second.worker, first.worker);
    assert_eq!(second.matched_blocks, 50);
    r.prune(Time::from_millis(61_000));
    let RouteOutcome::Dispatch(third) = r.route(&req(&follow)) else {
        panic!()
    };
    assert_eq!(third.matched_blocks, 0, "guesses expired");
}

#[test]
fn explain_serialises_every_worker() {
    let mut r = router(PolicyKind::Kv, AdmissionConfig::default());
    let t = tokens(320, 2);
    store(&mut r, 3, &t);
    let p = prompt(&t);
    let ex = r.explain(&req(&p));
    assert_eq!(ex.policy, "kv");
    assert_eq!(ex.winner, Some(WorkerId(3)));
    assert_eq!(ex.workers.len(), 3);
    assert_eq!(ex.workers.iter().filter(|w| w.chosen).count(), 1);
    let json = serde_json::to_value(&ex).unwrap();
    // The whole prompt is stored, but its last block is computed (the hit stops at 319).
    assert_eq!(json["workers"][2]["matched_blocks"], 19);
    assert_eq!(json["decision"], "dispatch");
    let expect = local_block_hashes(&t, BS).len();
    assert_eq!(ex.prompt_blocks, expect);
}

#[test]
fn invalid_config_is_refused() {
    for cfg in [
        RouterConfig {
            block_size: 0,
            ..RouterConfig::default()
        },
        RouterConfig {
            affinity_bias: 2.0,
            ..RouterConfig::default()
        },
        RouterConfig {
            max_inflight: 0,
            ..RouterConfig::default()
        },
    ] {
        assert!(matches!(Router::new(cfg), Err(RouteError::Config(_))));
    }
    let json = r#"{"block_size": 32, "policy": {"kind": "kv", "kv": {"overlap_weight": 2.0}}}"#;
    let cfg: RouterConfig = serde_json::from_str(json).unwrap();
    assert_eq!(cfg.policy.kv.overlap_weight, 2.0);
    assert!(serde_json::from_str::<RouterConfig>(r#"{"blocksize": 32}"#).is_err());
}

#[test]
fn sessions_bias_toward_their_last_worker() {
    let mut cfg = RouterConfig {
        block_size: BS,
        affinity_bias: 0.5,
        max_sessions: 8,
        session_ttl_secs: 10.0,
        ..RouterConfig::default()
    };
    cfg.policy.kind = PolicyKind::Kv;
    let mut r = Router::new(cfg).unwrap();
    for w in 1..=2 {
        r.add_worker(WorkerId(w), WorkerCapacity::default())
            .unwrap();
    }
    let p = prompt(&tokens(160, 1));
    let in_session = RouteRequest {
        session: Some(77),
        ..req(&p)
    };
    // Put a little load on worker 1 and send the session there by hand.
    let sel = Selection {
        worker: WorkerId(1),
        matched_blocks: 0,
        loadable: Loadable::default(),
        cached_tokens: 0,
        cost: None,
        prefill: None,
    };
    r.dispatch(RequestId(1), &in_session, &sel, Time::ZERO)
        .unwrap();
    assert_eq!(r.sessions(), 1);
    // Worker 1 now costs 10 prefill blocks + 10 active blocks more than idle worker 2 ...
    let RouteOutcome::Dispatch(s) = r.route(&req(&p)) else {
        panic!()
    };
    assert_eq!(
        s.worker,
        WorkerId(2),
        "without a session the idle worker wins"
    );
    // ... but halving its cost (40 -> 20 against 10) is not enough: a bias, not a pin.
    let RouteOutcome::Dispatch(s) = r.route(&in_session) else {
        panic!()
    };
    assert_eq!(s.worker, WorkerId(2));
    r.finish(RequestId(1), Time::from_millis(10)).unwrap();
    // Equal costs: the session's worker wins instead of a coin toss.
    for _ in 0..10 {
        let RouteOutcome::Dispatch(s) = r.route(&in_session) else {
            panic!()
        };
        assert_eq!(s.worker, WorkerId(1));
    }
    r.prune(Time::from_secs_f64(11.0));
    assert_eq!(r.sessions(), 0, "idle sessions expire");
}

#[test]
fn an_excluded_worker_is_never_chosen() {
    let mut r = router(PolicyKind::Kv, AdmissionConfig::default());
    let t = tokens(320, 3);
    store(&mut r, 2, &t);
    let p = prompt(&t);
    let RouteOutcome::Dispatch(best) = r.route(&req(&p)) else {
        panic!("expected dispatch")
    };
    assert_eq!(best.worker, WorkerId(2));
    let except = Eligible::Except(WorkerId(2));
    let retry = RouteRequest {
        eligible: &except,
        ..req(&p)
    };
    let RouteOutcome::Dispatch(other) = r.route(&retry) else {
        panic!("expected dispatch")
    };
    assert_ne!(other.worker, WorkerId(2));
    assert_eq!(other.matched_blocks, 0);
    // A subset: only its workers are chosen, the best among them; an empty one allows none.
    for subset in [[WorkerId(1)], [WorkerId(2)]] {
        let only = Eligible::only(subset);
        let RouteOutcome::Dispatch(s) = r.route(&RouteRequest {
            eligible: &only,
            ..req(&p)
        }) else {
            panic!("expected dispatch")
        };
        assert_eq!(s.worker, subset[0]);
    }
    let none = Eligible::only([]);
    assert!(!matches!(
        r.route(&RouteRequest {
            eligible: &none,
            ..req(&p)
        }),
        RouteOutcome::Dispatch(_)
    ));
}

#[test]
fn eligible_sets_allow_what_they_name() {
    let only = Eligible::only([WorkerId(3), WorkerId(1), WorkerId(3)]);
    assert_eq!(only, Eligible::only([WorkerId(1), WorkerId(3)]));
    assert!(only.allows(WorkerId(1)) && only.allows(WorkerId(3)) && !only.allows(WorkerId(2)));
    assert_eq!(
        only.after_failure(WorkerId(3)),
        Eligible::only([WorkerId(1)])
    );
    assert!(Eligible::Any.allows(WorkerId(9)));
    assert_eq!(Eligible::except(None), Eligible::Any);
    let ex = Eligible::except(Some(WorkerId(2)));
    assert!(!ex.allows(WorkerId(2)) && ex.allows(WorkerId(1)));
    assert_eq!(ex.after_failure(WorkerId(1)), Eligible::Except(WorkerId(1)));
    let (one, two) = (Eligible::only([WorkerId(1)]), Eligible::only([WorkerId(2)]));
    assert!(!one.overlaps(&two) && one.overlaps(&only) && Eligible::Any.overlaps(&two));
    assert!(!Eligible::Except(WorkerId(1)).overlaps(&one));
    assert!(Eligible::Except(WorkerId(1)).overlaps(&two));
    assert!(!Eligible::Any.overlaps(&Eligible::only([])));
}

/// `check_dispatch` says no exactly when `dispatch` would fail, and changes nothing.
#[test]
fn check_dispatch_agrees_with_dispatch() {
    let cfg = RouterConfig {
        block_size: BS,
        max_inflight: 2,
        ..RouterConfig::default()
    };
    let mut r = Router::new(cfg).unwrap();
    r.add_worker(WorkerId(1), WorkerCapacity::default())
        .unwrap();
    let p = prompt(&tokens(100, 1));
    let RouteOutcome::Dispatch(sel) = r.route(&req(&p)) else {
        panic!("one idle worker takes the request");
    };
    let other = Selection {
        worker: WorkerId(9),
        ..sel.clone()
    };
    let cases: [(RequestId, &Selection, bool); 5] = [
        (RequestId(1), &other, false), // unknown worker
        (RequestId(1), &sel, true),
        (RequestId(1), &sel, false), // the same request again
        (RequestId(2), &sel, true),
        (RequestId(3), &sel, false), // two in flight at most
    ];
    for (id, s, ok) in cases {
        let checked = r.check_dispatch(id, s);
        let inflight = r.ledger().inflight();
        assert_eq!(checked.is_ok(), ok, "check of {id:?} on {:?}", s.worker);
        assert_eq!(r.ledger().inflight(), inflight, "a check changes nothing");
        let done = r.dispatch(id, &req(&p), s, Time::ZERO);
        assert_eq!(done.is_ok(), ok, "dispatch of {id:?} on {:?}", s.worker);
    }
}

#[test]
fn a_fully_cached_block_aligned_prompt_is_predicted_one_block_short_as_engines_compute_it() {
    let mut r = router(PolicyKind::Kv, AdmissionConfig::default());
    let t = tokens(320, 4);
    store(&mut r, 1, &t);
    let RouteOutcome::Dispatch(sel) = r.route(&req(&prompt(&t))) else {
        panic!()
    };
    // vLLM caps a hit at prompt length - 1: 319 tokens hold 19 full blocks.
    assert_eq!((sel.worker, sel.matched_blocks), (WorkerId(1), 19));
    assert_eq!(sel.cached_tokens, 304);
    // One token more and the whole stored prefix counts.
    let longer = prompt(&[t.clone(), vec![1]].concat());
    let RouteOutcome::Dispatch(sel) = r.route(&req(&longer)) else {
        panic!()
    };
    assert_eq!((sel.matched_blocks, sel.cached_tokens), (20, 320));
}

#[test]
fn workers_tracked_by_events_and_approximately_share_one_router() {
    let mut r = router(PolicyKind::Kv, AdmissionConfig::default());
    r.add_worker_with(
        WorkerId(4),
        WorkerCapacity::default(),
        Tracking::Approximate,
    )
    .unwrap();
    assert_eq!(r.tracking(WorkerId(1)), Some(Tracking::Events));
    assert_eq!(r.tracking(WorkerId(4)), Some(Tracking::Approximate));
    assert_eq!(r.tracking(WorkerId(9)), None);
    // Events of an approximately tracked worker are ignored.
    let t = tokens(640, 3);
    store(&mut r, 4, &t);
    assert_eq!(r.cached_blocks(WorkerId(4)), 0);
    // Its guesses come from dispatches to it.
    let p = prompt(&t);
    send_to(&mut r, 4, 1, &p, 0);
    assert_eq!(r.cached_blocks(WorkerId(4)), 40);
    // Worker 2 holds a shorter prefix by events: both count, the deeper one wins.
    store(&mut r, 2, &t[..320]);
    let ex = r.explain(&req(&p));
    let depth = |w: u64| {
        ex.workers
            .iter()
            .find(|x| x.worker == WorkerId(w))
            .map(|x| x.matched_blocks)
    };
    assert_eq!((depth(2), depth(4)), (Some(20), Some(39)));
    assert_eq!(ex.winner, Some(WorkerId(4)));
    // Switching a worker to events drops its guesses.
    r.add_worker_with(WorkerId(4), WorkerCapacity::default(), Tracking::Events)
        .unwrap();
    assert_eq!(r.cached_blocks(WorkerId(4)), 0);
    assert_eq!(r.tracking(WorkerId(4)), Some(Tracking::Events));
}

#[test]
fn an_unavailable_worker_keeps_its_index_but_is_not_chosen() {
    let mut r = router(PolicyKind::Kv, AdmissionConfig::default());
    let t = tokens(640, 8);
    store(&mut r, 2, &t);
    let p = prompt(&[t.clone(), vec![5]].concat());
    r.set_available(WorkerId(2), false);
    assert!(!r.is_available(WorkerId(2)));
    let RouteOutcome::Dispatch(sel) = r.route(&req(&p)) else {
        panic!()
    };
    assert_ne!(sel.worker, WorkerId(2));
    assert_eq!(r.cached_blocks(WorkerId(2)), 40);
    r.set_available(WorkerId(2), true);
    let RouteOutcome::Dispatch(sel) = r.route(&req(&p)) else {
        panic!()
    };
    assert_eq!((sel.worker, sel.matched_blocks), (WorkerId(2), 40));
    // With every worker unavailable there is nobody to send to.
    for w in 1..=3 {
        r.set_available(WorkerId(w), false);
    }
    assert_eq!(
        r.route(&req(&p)),
        RouteOutcome::Reject(RejectReason::NoWorkers, None)
    );
}

#[test]
fn a_dispatched_prompt_counts_as_cached_until_its_events_come_or_time_passes() {
    let cfg = RouterConfig {
        block_size: BS,
        pending_secs: 5.0,
        ..RouterConfig::default()
    };
    let mut r = Router::new(cfg).unwrap();
    for w in 1..=2 {
        r.add_worker(WorkerId(w), WorkerCapacity::default())
            .unwrap();
    }
    let t = tokens(640, 6);
    let p = prompt(&t);
    send_to(&mut r, 2, 1, &p, 0);
    // No event yet: the follow-up still finds its prefix where it was sent.
    let follow = prompt(&[t.clone(), tokens(100, 1)].concat());
    let depth = |r: &Router| {
        r.explain(&req(&follow))
            .workers
            .iter()
            .map(|w| (w.worker, w.matched_blocks))
            .collect::<Vec<_>>()
    };
    assert_eq!(depth(&r), vec![(WorkerId(1), 0), (WorkerId(2), 40)]);
    // Events showing fewer blocks do not lower it; the deeper of the two counts.
    store(&mut r, 2, &t[..320]);
    assert_eq!(depth(&r)[1], (WorkerId(2), 40));
    // A restart clears both.
    r.apply_event(WorkerId(2), &KvEvent::Cleared).unwrap();
    assert_eq!(depth(&r)[1], (WorkerId(2), 0));
    // And the guess expires.
    send_to(&mut r, 2, 2, &p, 200);
    assert_eq!(depth(&r)[1], (WorkerId(2), 40));
    r.prune(Time::from_millis(5_300));
    assert_eq!(depth(&r)[1], (WorkerId(2), 0));
}

#[test]
fn an_eviction_the_engine_announces_after_a_dispatch_lowers_the_prediction_at_once() {
    // Issue 40: a revisited conversation was predicted 624 cached tokens where the engine,
    // having evicted blocks (events applied) within `pending_secs`, held and reported 352.
    let cfg = RouterConfig {
        block_size: BS,
        pending_secs: 5.0,
        ..RouterConfig::default()
    };
    let mut r = Router::new(cfg).unwrap();
    r.add_worker(WorkerId(1), WorkerCapacity::default())
        .unwrap();
    let t = tokens(640, 7);
    let p = prompt(&t);
    // The engine holds the 40 blocks (its events said so), and the prompt is sent there.
    store(&mut r, 1, &t);
    send_to(&mut r, 1, 1, &p, 0);
    let depth = |r: &Router| r.explain(&req(&p)).workers[0].matched_blocks;
    assert_eq!(
        depth(&r),
        39,
        "capped at the last full block before the last token"
    );
    // Then it evicts blocks 20..40 and says so: the guess made at the dispatch no longer
    // covers them.
    let evicted: Vec<EngineHash> = (20..40).map(|i| EngineHash(1 << 32 | i)).collect();
    r.apply_event(
        WorkerId(1),
        &KvEvent::Removed {
            block_hashes: evicted,
        },
    )
    .unwrap();
    assert_eq!(depth(&r), 20);
    // A removal in the middle breaks the guessed prefix there, through every path that
    // applies events: batches, and batches with each event's result told. (Other
    // conversations, on workers 2 and 3: each engine names its blocks by their position.)
    for w in 2..=3 {
        r.add_worker(WorkerId(w), WorkerCapacity::default())
            .unwrap();
        store(&mut r, w, &t);
        send_to(&mut r, w, w, &p, 100);
    }
    let at = |r: &Router, w: u64| {
        r.explain(&req(&p))
            .workers
            .iter()
            .find(|x| x.worker == WorkerId(w))
            .map_or(0, |x| x.matched_blocks)
    };
    assert_eq!((at(&r, 2), at(&r, 3)), (39, 39));
    r.apply_events(
        WorkerId(2),
        &[KvEvent::Removed {
            block_hashes: vec![EngineHash(2 << 32 | 10)],
        }],
    );
    r.apply_events_with(
        WorkerId(3),
        &[KvEvent::Removed {
            block_hashes: vec![EngineHash(3 << 32 | 5)],
        }],
        |_, res| res.unwrap(),
    );
    assert_eq!((at(&r, 2), at(&r, 3)), (10, 5));
    // The engine storing them again shows them again.
    store(&mut r, 2, &t);
    assert_eq!(at(&r, 2), 39);
}

#[test]
fn max_workers_counts_every_worker_however_tracked() {
    let cfg = RouterConfig {
        block_size: BS,
        max_workers: 2,
        ..RouterConfig::default()
    };
    let mut r = Router::new(cfg).unwrap();
    let cap = WorkerCapacity::default();
    r.add_worker_with(WorkerId(1), cap, Tracking::Approximate)
        .unwrap();
    r.add_worker_with(WorkerId(2), cap, Tracking::Events)
        .unwrap();
    // A third is refused, whichever way it would be tracked.
    for tracking in [Tracking::Approximate, Tracking::Events] {
        let err = r.add_worker_with(WorkerId(3), cap, tracking).unwrap_err();
        assert!(
            matches!(
                err,
                RouteError::Index(IndexError::TooManyWorkers { limit: 2, .. })
            ),
            "{err}"
        );
    }
    // A known worker may change its tracking or capacity; one that left frees its place.
    r.add_worker_with(WorkerId(1), cap, Tracking::Events)
        .unwrap();
    r.remove_worker(WorkerId(2));
    r.add_worker_with(WorkerId(3), cap, Tracking::Approximate)
        .unwrap();
    assert_eq!(r.ledger().worker_count(), 2);
}

mod split;
