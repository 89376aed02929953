//! Offloaded tiers: full and bare stores, the loadable run, and how the router credits it.

use super::*;
use crate::admission::AdmissionConfig;
use crate::hashing::{BlockedPrompt, Namespace};
use crate::index::StoredBlocks;
use crate::ledger::WorkerCapacity;
use crate::policy::PolicyKind;
use crate::router::{RouteOutcome, RouteRequest, Router, RouterConfig};
use crate::types::RequestId;
use crate::Time;

const BS: usize = 16;

fn tokens(n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| i.wrapping_mul(7919) ^ 0x55).collect()
}

/// Worker `w`'s engine hash of block `i`.
fn eh(w: u64, i: usize) -> EngineHash {
    EngineHash(w << 32 | i as u64)
}

/// A stored chain of blocks `from..to` of `t` (parent: block `from - 1`).
fn stored(w: u64, t: &[u32], from: usize, to: usize) -> KvEvent {
    KvEvent::Stored(StoredBlocks {
        parent: from.checked_sub(1).map(|p| eh(w, p)),
        block_hashes: (from..to).map(|i| eh(w, i)).collect(),
        token_ids: t[from * BS..to * BS].to_vec(),
        block_size: BS,
        namespace: Namespace::default(),
        block_keys: Vec::new(),
    })
}

/// A bare store (engine hashes only) of blocks `from..to`, as vLLM's offloading connector
/// sends without `self_describing_kv_events`.
fn bare(w: u64, from: usize, to: usize) -> KvEvent {
    KvEvent::Stored(StoredBlocks {
        parent: None,
        block_hashes: (from..to).map(|i| eh(w, i)).collect(),
        token_ids: Vec::new(),
        block_size: 0,
        namespace: Namespace::default(),
        block_keys: Vec::new(),
    })
}

fn removed(w: u64, from: usize, to: usize) -> KvEvent {
    KvEvent::Removed {
        block_hashes: (from..to).map(|i| eh(w, i)).collect(),
    }
}

fn router(kind: PolicyKind, tiers: TierConfig) -> Router {
    let mut cfg = RouterConfig {
        block_size: BS,
        tiers,
        pending_secs: 0.0,
        admission: AdmissionConfig::default(),
        ..RouterConfig::default()
    };
    cfg.policy.kind = kind;
    let mut r = Router::new(cfg).unwrap();
    for w in 1..=2 {
        r.add_worker(WorkerId(w), WorkerCapacity::default())
            .unwrap();
    }
    r
}

fn prompt(t: &[u32]) -> BlockedPrompt {
    BlockedPrompt::new(
        t,
        crate::types::BlockSize::new(BS).unwrap(),
        Namespace::default(),
    )
}

fn req(p: &BlockedPrompt) -> RouteRequest<'_> {
    RouteRequest::new(p)
}

fn loadable(r: &Router, w: u64, t: &[u32]) -> Loadable {
    let p = prompt(t);
    let device = r.index().find_matches_seq(&p.sequence).depth(WorkerId(w));
    r.offloaded()
        .loadable(WorkerId(w), &p.sequence, device, p.sequence.len())
}

#[test]
fn a_full_offloaded_store_continues_the_device_prefix() {
    let t = tokens(8 * BS + 3);
    let mut r = router(PolicyKind::Predictive, TierConfig::default());
    r.apply_event(WorkerId(1), &stored(1, &t, 0, 8)).unwrap();
    // The engine moves blocks 2..8 to host memory (the chain's parent is on the device),
    // then evicts them from the device.
    r.apply_tier_event(WorkerId(1), Tier::Host, &stored(1, &t, 2, 8))
        .unwrap();
    r.apply_event(WorkerId(1), &removed(1, 2, 8)).unwrap();
    assert_eq!(r.offloaded().block_count(WorkerId(1), Tier::Host), 6);
    assert_eq!(r.index().block_count(WorkerId(1)), 2);
    assert_eq!(loadable(&r, 1, &t), Loadable { host: 6, disk: 0 });
    // Its children stored on the host again resolve through the host index.
    let longer = tokens(10 * BS);
    assert_eq!(longer[..8 * BS], t[..8 * BS]);
    r.apply_tier_event(WorkerId(1), Tier::Host, &stored(1, &longer, 8, 10))
        .unwrap();
    assert_eq!(loadable(&r, 1, &longer), Loadable { host: 8, disk: 0 });
}

#[test]
fn a_bare_store_is_resolved_through_what_the_worker_reported() {
    let t = tokens(6 * BS);
    let mut r = router(PolicyKind::Predictive, TierConfig::default());
    r.apply_event(WorkerId(1), &stored(1, &t, 0, 6)).unwrap();
    r.apply_tier_event(WorkerId(1), Tier::Host, &bare(1, 0, 6))
        .unwrap();
    r.apply_event(WorkerId(1), &removed(1, 1, 6)).unwrap();
    assert_eq!(loadable(&r, 1, &t), Loadable { host: 5, disk: 0 });
    // From host to disk: resolved through the host index, the device no longer has them.
    r.apply_tier_event(WorkerId(1), Tier::Disk, &bare(1, 3, 6))
        .unwrap();
    r.apply_tier_event(WorkerId(1), Tier::Host, &removed(1, 3, 6))
        .unwrap();
    assert_eq!(loadable(&r, 1, &t), Loadable { host: 2, disk: 3 });
    // Hashes never reported: the known ones are kept, the event is refused and says so.
    let err = r
        .apply_tier_event(WorkerId(2), Tier::Host, &bare(2, 0, 2))
        .unwrap_err();
    assert_eq!(
        err,
        IndexError::UnknownBlock {
            worker: WorkerId(2),
            unknown: 2,
            total: 2
        }
    );
    assert_eq!(r.offloaded().block_count(WorkerId(2), Tier::Host), 0);
}

#[test]
fn the_loadable_run_stops_at_the_first_block_no_tier_holds() {
    let t = tokens(8 * BS + 1);
    let mut r = router(PolicyKind::Predictive, TierConfig::default());
    r.apply_event(WorkerId(1), &stored(1, &t, 0, 8)).unwrap();
    r.apply_tier_event(WorkerId(1), Tier::Host, &bare(1, 2, 8))
        .unwrap();
    r.apply_event(WorkerId(1), &removed(1, 2, 8)).unwrap();
    r.apply_tier_event(WorkerId(1), Tier::Host, &removed(1, 5, 6))
        .unwrap();
    assert_eq!(loadable(&r, 1, &t), Loadable { host: 3, disk: 0 });
    // A parent unknown everywhere refuses a full store.
    let err = r
        .apply_tier_event(WorkerId(2), Tier::Disk, &stored(2, &t, 3, 5))
        .unwrap_err();
    assert!(matches!(err, IndexError::UnknownParent { .. }), "{err:?}");
}

#[test]
fn clearing_the_device_keeps_offloaded_blocks_and_a_restart_drops_every_tier() {
    let t = tokens(4 * BS + 1);
    let mut r = router(PolicyKind::Predictive, TierConfig::default());
    r.apply_event(WorkerId(1), &stored(1, &t, 0, 4)).unwrap();
    r.apply_tier_event(WorkerId(1), Tier::Host, &bare(1, 0, 4))
        .unwrap();
    r.apply_event(WorkerId(1), &KvEvent::Cleared).unwrap();
    assert_eq!(loadable(&r, 1, &t), Loadable { host: 4, disk: 0 });
    r.clear_worker(WorkerId(1));
    assert_eq!(loadable(&r, 1, &t), Loadable::default());
    r.apply_tier_event(WorkerId(1), Tier::Host, &stored(1, &t, 0, 4))
        .unwrap();
    r.remove_worker(WorkerId(1));
    assert!(r.offloaded().is_empty());
}

#[test]
fn loaded_blocks_count_as_cached_and_cost_their_load_time() {
    // Worker 1 holds 2 blocks on the device and the next 6 in host memory; worker 2 holds
    // the first 4 on the device. The prompt is 8 blocks and 1 token.
    let t = tokens(8 * BS + 1);
    let p = prompt(&t);
    let fleet = |kind, tiers| {
        let mut r = router(kind, tiers);
        r.apply_event(WorkerId(1), &stored(1, &t, 0, 2)).unwrap();
        r.apply_tier_event(WorkerId(1), Tier::Host, &stored(1, &t, 2, 8))
            .unwrap();
        r.apply_event(WorkerId(2), &stored(2, &t, 0, 4)).unwrap();
        let RouteOutcome::Dispatch(sel) = r.route(&req(&p)) else {
            panic!("dispatch expected")
        };
        (r, sel)
    };
    for kind in [PolicyKind::Predictive, PolicyKind::Kv] {
        let (mut r, sel) = fleet(kind, TierConfig::default());
        // Worker 1 computes 1 token and loads 96 at a tenth: 10.6 tokens of work; worker 2
        // computes 65.
        assert_eq!(sel.worker, WorkerId(1), "{kind:?}");
        assert_eq!(sel.matched_blocks, 2);
        assert_eq!(sel.loadable, Loadable { host: 6, disk: 0 });
        assert_eq!(sel.cached_tokens, 8 * BS);
        let ex = r.explain(&req(&p));
        assert_eq!(ex.workers[0].loadable.host, 6);
        assert_eq!(ex.workers[0].uncached_tokens, 1);
        // The ledger books the work: the computed token and the load's equivalent.
        r.dispatch(RequestId(1), &req(&p), &sel, Time::from_millis(0))
            .unwrap();
        let load = r.ledger().load(WorkerId(1)).unwrap();
        assert_eq!(
            load.prefill_tokens,
            1 + (6.0 * BS as f64 * 0.1f64).ceil() as u64
        );

        // Loading as slowly as computing: worker 2's longer device prefix wins.
        let slow = TierConfig {
            host_load_ratio: 1.0,
            disk_load_ratio: 1.0,
        };
        assert_eq!(fleet(kind, slow).1.worker, WorkerId(2), "{kind:?}");
    }
}

#[test]
fn a_loadable_run_stops_before_the_prompts_last_token() {
    // The prompt is exactly 4 blocks: an engine computes the last token, so at most 3 count.
    let t = tokens(4 * BS);
    let mut r = router(PolicyKind::Predictive, TierConfig::default());
    r.apply_event(WorkerId(1), &stored(1, &t, 0, 4)).unwrap();
    r.apply_tier_event(WorkerId(1), Tier::Host, &bare(1, 0, 4))
        .unwrap();
    r.apply_event(WorkerId(1), &removed(1, 1, 4)).unwrap();
    let p = prompt(&t);
    let RouteOutcome::Dispatch(sel) = r.route(&req(&p)) else {
        panic!("dispatch expected")
    };
    assert_eq!((sel.matched_blocks, sel.loadable.host), (1, 2));
    assert_eq!(sel.cached_tokens, 3 * BS);
}

#[test]
fn load_ratios_are_checked() {
    for bad in [-0.1, 1.5, f64::NAN] {
        let c = TierConfig {
            host_load_ratio: bad,
            ..TierConfig::default()
        };
        assert!(c.validate().is_err(), "{bad}");
    }
    assert!(TierConfig::default().validate().is_ok());
}
