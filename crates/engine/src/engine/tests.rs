use super::*;
use crate::Profile;
use kvroute_core::hashing::local_block_hashes;
use kvroute_core::{BlockSize, KvEvent, Namespace, PrefixIndex, WorkerId};
use std::sync::Arc;

fn tiny() -> EngineConfig {
    EngineConfig::from_profile(&Profile::builtin("tiny").unwrap())
}

fn req(id: u64, tokens: Vec<u32>, max_tokens: u32) -> EngineRequest {
    EngineRequest::new(RequestId(id), tokens, max_tokens)
}

fn prompt(n: usize, salt: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| i.wrapping_mul(7).wrapping_add(salt) % 1000)
        .collect()
}

/// Drives the engine through `arrivals` (time in ms, request) until it is idle; returns
/// every step output.
fn drive(e: &mut Engine, mut arrivals: Vec<(u64, EngineRequest)>) -> Vec<StepOutput> {
    arrivals.sort_by_key(|a| a.0);
    let mut arrivals: VecDeque<_> = arrivals.into();
    let mut outs = Vec::new();
    for _ in 0..1_000_000 {
        let next_arrival = arrivals.front().map(|a| Time::from_millis(a.0));
        let t = match (next_arrival, e.next_event_time()) {
            (None, None) => return outs,
            (Some(a), None) => a,
            (None, Some(s)) => s,
            (Some(a), Some(s)) => a.min(s),
        };
        while arrivals
            .front()
            .is_some_and(|a| Time::from_millis(a.0) <= t)
        {
            let (_, r) = arrivals.pop_front().unwrap();
            e.submit(r, t).unwrap();
        }
        outs.push(e.step(t));
        e.pool().check_invariants().unwrap();
        assert!(e.running.len() <= e.cfg.max_num_seqs);
    }
    panic!("the engine never went idle");
}

fn finished(outs: &[StepOutput]) -> Vec<Finished> {
    let mut f: Vec<Finished> = outs.iter().flat_map(|o| o.finished.clone()).collect();
    f.sort_by_key(|f| f.id);
    f
}

#[test]
fn one_request_prefills_then_decodes_on_the_step_model() {
    let mut e = Engine::new(tiny()).unwrap();
    let outs = drive(&mut e, vec![(0, req(1, prompt(10, 0), 3))]);
    let f = finished(&outs);
    assert_eq!(f.len(), 1);
    assert_eq!(f[0].output.len(), 3);
    assert_eq!(f[0].cached_tokens, 0);
    // tiny: prefill 1 ms + 0.01 ms/token, decode 2 ms.
    let first = f[0].first_token.as_secs_f64();
    assert!((first - 0.0011).abs() < 1e-9, "{first}");
    let last = f[0].finished.as_secs_f64();
    assert!((last - (0.0011 + 2.0 * 0.002)).abs() < 1e-9, "{last}");
    assert_eq!(e.metrics().generated_tokens_total, 3);
    assert_eq!(e.pool().used_count(), 0, "blocks released");
    // 10 prompt + 2 generated tokens with KV = 12 tokens = 3 full blocks cached.
    assert_eq!(e.pool().cached_count(), 3);
}

#[test]
fn a_repeated_prompt_hits_the_prefix_cache() {
    let mut e = Engine::new(tiny()).unwrap();
    let p = prompt(22, 3);
    let outs = drive(
        &mut e,
        vec![(0, req(1, p.clone(), 2)), (100, req(2, p.clone(), 2))],
    );
    let f = finished(&outs);
    assert_eq!(
        f[1].cached_tokens, 20,
        "all full blocks but the last token's"
    );
    let ttft = |f: &Finished| f.first_token.since(f.arrived).as_secs_f64();
    assert!(ttft(&f[1]) < ttft(&f[0]));
    let m = e.metrics();
    assert_eq!((m.prompt_tokens_total, m.prefix_hit_tokens_total), (44, 20));
    // A prompt of exactly whole blocks still computes its last block.
    let q = prompt(8, 9);
    let outs = drive(
        &mut e,
        vec![(200, req(3, q.clone(), 1)), (300, req(4, q, 1))],
    );
    assert_eq!(finished(&outs)[1].cached_tokens, 4);
}

#[test]
fn limits_on_sequences_and_tokens_per_step_hold() {
    let mut e = Engine::new(tiny()).unwrap();
    let arrivals = (0..20)
        .map(|i| (0, req(i, prompt(30, i as u32 * 100), 4)))
        .collect();
    let outs = drive(&mut e, arrivals);
    assert_eq!(finished(&outs).len(), 20);
    assert!(e.metrics().steps_total > 0);
    // Budget: the 64-token step budget forces chunks; with 20 x 30 prompt tokens there must
    // be at least 600 / 64 prefill steps.
    assert!(e.metrics().steps_total >= 10, "{}", e.metrics().steps_total);
}

#[test]
fn long_prompts_are_prefilled_in_chunks() {
    let mut e = Engine::new(tiny()).unwrap();
    let outs = drive(&mut e, vec![(0, req(1, prompt(200, 5), 1))]);
    // 200 tokens at 64 per step: 4 steps of 1 + 0.01 * chunk ms.
    let f = &finished(&outs)[0];
    let expect = 3.0 * (1.0 + 0.64) + (1.0 + 0.08);
    assert!((f.first_token.as_secs_f64() * 1e3 - expect).abs() < 1e-6);
    assert_eq!(e.metrics().steps_total, 4);
}

#[test]
fn preemption_recomputes_and_everything_finishes() {
    let mut cfg = tiny();
    cfg.num_gpu_blocks = 64; // 256 tokens for 8 sequences of up to 48 tokens
    let mut e = Engine::new(cfg).unwrap();
    let arrivals = (0..8)
        .map(|i| (0, req(i, prompt(16, i as u32 * 50), 32)))
        .collect();
    let outs = drive(&mut e, arrivals);
    let f = finished(&outs);
    assert_eq!(f.len(), 8);
    assert!(f.iter().all(|f| f.output.len() == 32));
    assert!(
        e.metrics().preemptions_total > 0,
        "the pool was too small for all"
    );
    assert!(f.iter().any(|f| f.preemptions > 0));
    assert_eq!(e.pool().free_count(), 64);
    // Outputs do not depend on preemption: token k of request i is fixed.
    for f in &f {
        for (k, t) in f.output.iter().enumerate() {
            assert_eq!(*t, request::output_token(f.id, k as u32, None));
        }
    }
}

#[test]
fn same_inputs_same_run() {
    let run = || {
        let mut e = Engine::new(tiny()).unwrap();
        let arrivals = (0..12)
            .map(|i| {
                (
                    i * 3,
                    req(i, prompt(10 + i as usize * 7, (i % 3) as u32), 5),
                )
            })
            .collect();
        drive(&mut e, arrivals)
    };
    assert_eq!(run(), run());
}

#[test]
fn bad_requests_are_refused() {
    let mut cfg = tiny();
    cfg.max_waiting = 1;
    let mut e = Engine::new(cfg).unwrap();
    let t = Time::ZERO;
    assert_eq!(
        e.submit(req(1, vec![], 1), t),
        Err(EngineError::EmptyPrompt(RequestId(1)))
    );
    assert_eq!(
        e.submit(req(1, vec![1], 0), t),
        Err(EngineError::ZeroMaxTokens(RequestId(1)))
    );
    assert!(matches!(
        e.submit(req(1, prompt(1_000, 0), 100), t),
        Err(EngineError::TooLong { .. })
    ));
    e.submit(req(1, vec![1, 2], 1), t).unwrap();
    assert_eq!(
        e.submit(req(2, vec![1], 1), t),
        Err(EngineError::QueueFull(1))
    );
    let mut e = Engine::new(tiny()).unwrap();
    e.submit(req(1, vec![1, 2], 1), t).unwrap();
    assert_eq!(
        e.submit(req(1, vec![1], 1), t),
        Err(EngineError::DuplicateRequest(RequestId(1)))
    );
    let mut bad = tiny();
    bad.num_gpu_blocks = 0;
    assert!(Engine::new(bad).is_err());
    // Pool links take 30 bits: a larger pool is refused, not truncated.
    let mut bad = tiny();
    bad.num_gpu_blocks = crate::pool::MAX_BLOCKS + 1;
    assert!(matches!(
        Engine::new(bad),
        Err(EngineError::InvalidConfig(m)) if m.contains("2^30")
    ));
}

#[test]
fn aborted_requests_free_their_blocks() {
    let mut e = Engine::new(tiny()).unwrap();
    e.submit(req(1, prompt(40, 1), 50), Time::ZERO).unwrap();
    e.submit(req(2, prompt(40, 2), 50), Time::ZERO).unwrap();
    let o = e.step(Time::ZERO);
    assert!(o.tokens.is_empty());
    assert!(e.abort(RequestId(1), Time::ZERO));
    assert!(!e.abort(RequestId(1), Time::ZERO));
    let outs = drive(&mut e, vec![]);
    let f = finished(&outs);
    assert_eq!(
        f.iter().map(|f| f.id).collect::<Vec<_>>(),
        vec![RequestId(2)]
    );
    assert_eq!(e.pool().used_count(), 0);
}

#[test]
fn kv_events_keep_a_router_index_in_step_with_the_cache() {
    // Token events; hashed events naming blocks by pool index, kept by the index in a map or
    // in an array.
    for (with_tokens, block_ids) in [(true, false), (false, false), (false, true)] {
        events_keep_the_index_in_step(with_tokens, block_ids);
    }
}

fn events_keep_the_index_in_step(with_tokens: bool, block_ids: bool) {
    let mut cfg = tiny();
    cfg.kv_events_with_tokens = with_tokens;
    let blocks = cfg.num_gpu_blocks;
    let mut e = Engine::new(cfg).unwrap();
    let mut ix = PrefixIndex::new(BlockSize::new(4).unwrap());
    let w = WorkerId(0);
    ix.add_worker(w).unwrap();
    if block_ids {
        assert!(ix.use_block_ids(w, blocks));
    }
    // Shared prefixes, reuse and eviction pressure (256 blocks, ~40 x 25 blocks).
    let arrivals: Vec<(u64, EngineRequest)> = (0..40)
        .map(|i| {
            let mut p = prompt(40, (i % 4) as u32);
            p.extend(prompt(50 + i as usize, 1_000 + i as u32));
            (i * 2, req(i, p, 8))
        })
        .collect();
    let prompts: Vec<Vec<u32>> = arrivals
        .iter()
        .map(|a| match &a.1.prompt {
            EnginePrompt::Tokens(t) => t.clone(),
            EnginePrompt::Hashed { .. } => unreachable!("token prompts"),
        })
        .collect();
    let outs = drive(&mut e, arrivals);
    let mut removed = 0;
    for o in &outs {
        for ev in &o.events {
            removed += matches!(ev, KvEvent::Removed { .. }) as usize;
            let hashed = matches!(ev, KvEvent::StoredHashed(_));
            let tokens = matches!(ev, KvEvent::Stored(_));
            if with_tokens {
                assert!(!hashed, "token events were asked for");
            } else {
                assert!(!tokens, "hashed events were asked for");
            }
            ix.apply(w, ev).unwrap();
        }
    }
    assert!(removed > 0, "the test must exercise eviction");
    assert_eq!(ix.block_count(w), e.pool().cached_count());
    for p in &prompts {
        let locals = local_block_hashes(p, 4);
        let seqs = kvroute_core::hashing::sequence_hashes(&locals);
        assert_eq!(
            ix.find_matches(&locals).depth(w),
            e.pool().match_prefix(&seqs)
        );
    }
}

#[test]
fn request_overhead_delays_the_first_step() {
    let mut cfg = tiny();
    cfg.request_overhead = Duration::from_millis(50);
    let mut e = Engine::new(cfg).unwrap();
    e.submit(req(1, prompt(10, 0), 2), Time::ZERO).unwrap();
    assert_eq!(e.next_event_time(), Some(Time::from_millis(50)));
    let o = e.step(Time::from_millis(10));
    assert!(o.tokens.is_empty());
    assert_eq!(
        e.metrics().steps_total,
        0,
        "nothing runs before the overhead"
    );
    let outs = drive(&mut e, vec![]);
    let f = finished(&outs);
    let first = f[0].first_token.as_secs_f64();
    assert!((first - (0.050 + 0.0011)).abs() < 1e-9, "{first}");
}

#[test]
fn hashed_prompts_run_like_token_prompts() {
    let p = prompt(42, 3);
    let blocked =
        kvroute_core::BlockedPrompt::new(&p, BlockSize::new(4).unwrap(), Namespace::default());
    let hashed = |id| EngineRequest {
        id: RequestId(id),
        prompt: EnginePrompt::Hashed {
            blocks: blocked.sequence.clone(),
            tail: p[40..].to_vec(),
        },
        max_tokens: 5,
        namespace: Namespace::default(),
        remote_tokens: 0,
        priority: 0,
    };
    let run = |with_tokens: bool, r: EngineRequest| {
        let mut cfg = tiny();
        cfg.kv_events_with_tokens = with_tokens;
        let mut e = Engine::new(cfg).unwrap();
        let outs = drive(&mut e, vec![(0, r), (50, req(9, p.clone(), 2))]);
        (finished(&outs), e.pool().match_prefix(&blocked.sequence))
    };
    let (by_tokens, cached_t) = run(false, req(1, p.clone(), 5));
    let (by_hashes, cached_h) = run(false, hashed(1));
    assert_eq!(by_tokens, by_hashes);
    assert_eq!((cached_t, cached_h), (10, 10));
    assert_eq!(
        by_hashes[1].cached_tokens, 40,
        "the second request hits the hashed blocks"
    );
    // Refused where it cannot work.
    let mut e = Engine::new(tiny()).unwrap();
    assert!(matches!(
        e.submit(hashed(1), Time::ZERO),
        Err(EngineError::BadPrompt { .. })
    ));
    let mut cfg = tiny();
    cfg.kv_events_with_tokens = false;
    let mut e = Engine::new(cfg).unwrap();
    let long_tail = EngineRequest {
        prompt: EnginePrompt::Hashed {
            blocks: vec![],
            tail: vec![1, 2, 3, 4],
        },
        ..hashed(2)
    };
    assert!(matches!(
        e.submit(long_tail, Time::ZERO),
        Err(EngineError::BadPrompt { .. })
    ));
}

#[test]
fn a_prefix_evicted_from_the_device_is_loaded_back_from_the_host_tier() {
    let mut cfg = tiny();
    cfg.num_gpu_blocks = 12;
    cfg.host_blocks = 64;
    cfg.host_load_secs_per_token = 1e-6;
    let bs = cfg.block_size;
    let mut e = Engine::new(cfg).unwrap();
    let a = prompt(10 * bs, 1);
    // Two other prompts in between take every device block: a's blocks leave the device.
    let outs = drive(
        &mut e,
        vec![
            (0, req(1, a.clone(), 1)),
            (1_000, req(2, prompt(10 * bs, 2), 1)),
            (2_000, req(3, prompt(10 * bs, 3), 1)),
            (3_000, req(4, a.clone(), 1)),
        ],
    );
    let f = finished(&outs);
    assert_eq!(f[0].cached_tokens, 0);
    // All its full blocks but the last token's come back from the host tier.
    assert_eq!(f[3].cached_tokens, 9 * bs);
    let ttft = |f: &Finished| f.first_token.since(f.arrived).as_secs_f64();
    assert!(ttft(&f[3]) < ttft(&f[0]), "{} {}", ttft(&f[3]), ttft(&f[0]));
    assert_eq!(
        e.metrics().host_blocks,
        30,
        "three prompts of 10 full blocks"
    );

    // A router fed both event streams (host events after the device's, as published)
    // holds what the engine holds, tier by tier, and nothing is refused.
    let mut r = kvroute_core::Router::new(kvroute_core::RouterConfig {
        block_size: bs,
        ..Default::default()
    })
    .unwrap();
    r.add_worker(WorkerId(1), Default::default()).unwrap();
    for o in &outs {
        for ev in &o.events {
            r.apply_event(WorkerId(1), ev).unwrap();
        }
        for ev in &o.host_events {
            r.apply_tier_event(WorkerId(1), kvroute_core::Tier::Host, ev)
                .unwrap();
        }
    }
    assert_eq!(
        r.offloaded()
            .block_count(WorkerId(1), kvroute_core::Tier::Host),
        e.metrics().host_blocks
    );
    assert_eq!(
        r.index().block_count(WorkerId(1)),
        e.metrics().cached_blocks
    );
}

#[test]
fn output_ids_are_the_simulators_without_a_table() {
    // Pinned: the fleet simulator's outputs (and the follow-ups it builds from them) must not
    // move when a worker samples from a table.
    let pinned = [
        (0, 0, 15_635),
        (1, 0, 22_565),
        (7, 3, 21_706),
        (123_456_789, 199, 12_132),
    ];
    for (id, k, want) in pinned {
        assert_eq!(request::output_token(RequestId(id), k, None), want);
    }
    assert_eq!(tiny().output_ids, None);
    // A table picks by the same hash: entry hash % len.
    let table = [3u32, 5, 8, 13, 21];
    let picked = [(0, 0, 3), (1, 0, 3), (7, 3, 5), (123_456_789, 199, 8)];
    for (id, k, want) in picked {
        assert_eq!(request::output_token(RequestId(id), k, Some(&table)), want);
    }
    let mut cfg = tiny();
    cfg.output_ids = Some(Vec::new().into());
    assert!(matches!(
        Engine::new(cfg),
        Err(EngineError::InvalidConfig(_))
    ));
}

#[test]
fn a_table_of_output_ids_is_sampled_and_a_follow_up_finds_the_answer_cached() {
    let table: Arc<[u32]> = (0..40u32).map(|i| 5_000 + 7 * i).collect();
    for fast in [true, false] {
        let mut cfg = tiny();
        cfg.output_ids = Some(table.clone());
        let mut e = Engine::new(cfg).unwrap();
        e.set_fast_paths(fast);
        let first = prompt(21, 3);
        let outs = drive(&mut e, vec![(0, req(1, first.clone(), 30))]);
        let f = finished(&outs);
        assert_eq!(f[0].output.len(), 30);
        for (k, t) in f[0].output.iter().enumerate() {
            assert!(table.contains(t), "{t}");
            assert_eq!(*t, request::output_token(f[0].id, k as u32, Some(&table)));
        }
        // The next turn: the history (prompt and answer) then a new message.
        let mut next = first.clone();
        next.extend_from_slice(&f[0].output);
        let cacheable = next.len() - 1;
        next.extend(prompt(9, 77));
        let outs = drive(&mut e, vec![(10_000, req(2, next, 1))]);
        let bs = e.config().block_size;
        // Every full block but the one holding the last output token (never computed).
        assert_eq!(finished(&outs)[0].cached_tokens, cacheable / bs * bs);
    }
}

#[test]
fn kv_sent_with_a_request_is_written_not_computed_and_cached_like_computed_kv() {
    let p = prompt(22, 5);
    let sent = |id, tokens| EngineRequest {
        remote_tokens: tokens,
        priority: 0,
        ..req(id, p.clone(), 2)
    };
    // tiny: blocks of 4, prefill 1 ms + 0.01 ms/token. The KV of 22 tokens sent: 5 full
    // blocks of it (never the last token) written, 2 tokens computed.
    let mut e = Engine::new(tiny()).unwrap();
    let outs = drive(&mut e, vec![(0, sent(1, 22))]);
    let f = finished(&outs);
    assert_eq!(
        f[0].cached_tokens, 20,
        "reported cached, as engines report loaded KV"
    );
    let first = f[0].first_token.as_secs_f64();
    assert!((first - 0.00102).abs() < 1e-9, "{first}");
    assert_eq!(e.metrics().remote_tokens_total, 20);
    let stored: usize = outs
        .iter()
        .flat_map(|o| &o.events)
        .map(|ev| match ev {
            KvEvent::Stored(s) => s.block_hashes.len(),
            _ => 0,
        })
        .sum();
    assert_eq!(
        stored, 5,
        "the 5 blocks sent announced (23 tokens with KV at the end)"
    );
    // A prefix already cached is not sent again: only what the cache lacks counts.
    let mut e = Engine::new(tiny()).unwrap();
    let outs = drive(
        &mut e,
        vec![(0, req(1, p[..9].to_vec(), 1)), (100, sent(2, 22))],
    );
    assert_eq!(finished(&outs)[1].cached_tokens, 20);
    assert_eq!(e.metrics().remote_tokens_total, 12, "2 blocks were cached");
    // Less sent than cached: the cache's hit stands.
    let mut e = Engine::new(tiny()).unwrap();
    let outs = drive(
        &mut e,
        vec![(0, req(1, p[..13].to_vec(), 1)), (100, sent(2, 5))],
    );
    assert_eq!(finished(&outs)[1].cached_tokens, 12);
    assert_eq!(e.metrics().remote_tokens_total, 0);
}

fn with_priority(id: u64, tokens: Vec<u32>, max_tokens: u32, priority: i32) -> EngineRequest {
    EngineRequest {
        priority,
        ..req(id, tokens, max_tokens)
    }
}

#[test]
fn priority_scheduling_takes_waiting_requests_by_priority_then_arrival() {
    let order = |priority_scheduling: bool| {
        let mut cfg = tiny();
        cfg.max_num_seqs = 1;
        cfg.priority_scheduling = priority_scheduling;
        let mut e = Engine::new(cfg).unwrap();
        let arrivals = [(0, 5), (1, 5), (2, 1), (3, 3), (4, 1)]
            .into_iter()
            .map(|(i, p)| (i, with_priority(i, prompt(8, i as u32 * 10), 4, p)))
            .collect();
        let mut f = finished(&drive(&mut e, arrivals));
        f.sort_by_key(|f| f.first_token);
        f.iter().map(|f| f.id.0).collect::<Vec<_>>()
    };
    // The first runs alone; then the lowest value first, equal values by arrival.
    assert_eq!(order(true), [0, 2, 4, 3, 1]);
    assert_eq!(order(false), [0, 1, 2, 3, 4], "first come, first served");
}

#[test]
fn priority_scheduling_preempts_the_largest_priority_value() {
    let preempted = |priority_scheduling: bool| {
        let mut cfg = tiny();
        cfg.num_gpu_blocks = 64;
        cfg.priority_scheduling = priority_scheduling;
        let mut e = Engine::new(cfg).unwrap();
        // Four of priority 9, then four of priority 0 a moment later.
        let arrivals = (0..8)
            .map(|i| {
                let (at, p) = if i < 4 { (0, 9) } else { (1, 0) };
                (at, with_priority(i, prompt(16, i as u32 * 50), 32, p))
            })
            .collect();
        let f = finished(&drive(&mut e, arrivals));
        assert_eq!(f.len(), 8);
        assert_eq!(e.pool().free_count(), 64);
        f.iter()
            .map(|f| (f.id.0 >= 4, f.preemptions))
            .collect::<Vec<_>>()
    };
    let by_priority = preempted(true);
    assert!(
        by_priority.iter().any(|&(high, n)| !high && n > 0),
        "{by_priority:?}"
    );
    assert!(
        by_priority.iter().all(|&(high, n)| !high || n == 0),
        "{by_priority:?}"
    );
    // First come, first served preempts the most recently admitted: the later ones.
    let fcfs = preempted(false);
    assert!(fcfs.iter().any(|&(high, n)| high && n > 0), "{fcfs:?}");
}
