use super::*;
use crate::ledger::{PrefillEstimate, WorkerCapacity, WorkerLoad};
use crate::tiers::{Loadable, TierConfig};

fn cand(id: u64, matched: usize, active_blocks: u64) -> Candidate {
    Candidate {
        worker: WorkerId(id),
        matched_blocks: matched,
        loadable: Loadable::default(),
        cached_blocks: 0,
        cache_blocks: None,
        load: WorkerLoad {
            active_blocks,
            ..WorkerLoad::default()
        },
        capacity: WorkerCapacity::default(),
        prefill: None,
        service_secs: None,
        decode: None,
        output_tokens: None,
    }
}

fn input(candidates: &[Candidate], tokens: usize, decision: u64) -> PolicyInput<'_> {
    PolicyInput {
        prompt_tokens: tokens,
        block_size: 16,
        candidates,
        decision,
        seed: 42,
        affinity: None,
        affinity_bias: 0.0,
        tiers: TierConfig::default(),
        class: Default::default(),
    }
}

#[test]
fn kv_worked_example_picks_worker_two_with_cost_30() {
    // 100-block prompt; workers hold 20 / 75 / 10 blocks with decode loads 10 / 5 / 9.
    let cs = [cand(1, 20, 10), cand(2, 75, 5), cand(3, 10, 9)];
    let choice = KvCost::default().select(&input(&cs, 1_600, 0));
    assert_eq!(cs[choice.chosen].worker, WorkerId(2));
    assert_eq!(choice.costs, vec![Some(90.0), Some(30.0), Some(99.0)]);
}

#[test]
fn kv_counts_outstanding_prefill_and_optionally_new_blocks() {
    let mut busy = cand(1, 10, 0);
    busy.load.prefill_tokens = 3_200;
    let cs = [busy, cand(2, 0, 0)];
    let plain = KvCost::default().costs(&input(&cs, 160, 0));
    assert_eq!(plain, vec![200.0, 10.0]);
    let with_new = KvCost::new(KvConfig {
        count_new_blocks: true,
        overlap_weight: 2.0,
        ..KvConfig::default()
    })
    .costs(&input(&cs, 170, 0));
    // worker 1: 2 * (3200 + 10) / 16 + (11 - 10); worker 2: 2 * 170 / 16 + 11.
    assert_eq!(
        with_new,
        vec![2.0 * 3_210.0 / 16.0 + 1.0, 2.0 * 170.0 / 16.0 + 11.0]
    );
}

#[test]
fn kv_ties_go_to_least_cached_data_then_seeded_random() {
    let mut a = cand(1, 0, 0);
    a.cached_blocks = 500;
    let b = cand(2, 0, 0);
    let cs = [a, b];
    for d in 0..20 {
        let c = KvCost::default().select(&input(&cs, 64, d));
        assert_eq!(cs[c.chosen].worker, WorkerId(2));
    }
    let cs = [cand(1, 0, 0), cand(2, 0, 0), cand(3, 0, 0)];
    let picks: Vec<usize> = (0..60)
        .map(|d| KvCost::default().select(&input(&cs, 64, d)).chosen)
        .collect();
    let again: Vec<usize> = (0..60)
        .map(|d| KvCost::default().select(&input(&cs, 64, d)).chosen)
        .collect();
    assert_eq!(picks, again, "deterministic for a seed");
    for i in 0..3 {
        assert!(picks.contains(&i), "random tie-break reaches every worker");
    }
}

/// Caches of known sizes tie by how full they are: a smaller cache holding fewer blocks is
/// not the least cached when it is as full (it would take every new prefix and evict its
/// own), and a fuller large cache loses to an emptier small one.
#[test]
fn kv_ties_between_caches_of_known_sizes_go_by_how_full_they_are() {
    let sized = |id, cached, size| {
        let mut c = cand(id, 0, 0);
        c.cached_blocks = cached;
        c.cache_blocks = Some(size);
        c
    };
    // Both full: a random pick among them, not always the smaller.
    let cs = [sized(1, 23, 23), sized(2, 19, 19)];
    let picks: Vec<usize> = (0..60)
        .map(|d| KvCost::default().select(&input(&cs, 64, d)).chosen)
        .collect();
    assert!(picks.contains(&0) && picks.contains(&1), "{picks:?}");
    // Half full beats three-quarters full, whatever the counts.
    let cs = [sized(1, 300, 400), sized(2, 100, 200)];
    for d in 0..20 {
        assert_eq!(KvCost::default().select(&input(&cs, 64, d)).chosen, 1);
    }
    // A size unknown for one of them: counts, as before.
    let mut unknown = sized(2, 100, 200);
    unknown.cache_blocks = None;
    let cs = [sized(1, 150, 400), unknown];
    for d in 0..20 {
        assert_eq!(KvCost::default().select(&input(&cs, 64, d)).chosen, 1);
    }
}

#[test]
fn kv_temperature_samples_mostly_the_cheapest() {
    let cs = [cand(1, 100, 0), cand(2, 0, 0)];
    let kv = KvCost::new(KvConfig {
        temperature: 0.25,
        ..KvConfig::default()
    });
    let cheap = (0..1_000)
        .filter(|&d| kv.select(&input(&cs, 1_600, d)).chosen == 0)
        .count();
    // p(cheap) = 1 / (1 + e^-4) = 0.982.
    assert!((960..=998).contains(&cheap), "{cheap}");
}

#[test]
fn round_robin_cycles_and_random_is_seeded() {
    let cs = [cand(1, 0, 0), cand(2, 0, 0), cand(3, 0, 0)];
    let rr: Vec<usize> = (0..6)
        .map(|d| RoundRobin.select(&input(&cs, 1, d)).chosen)
        .collect();
    assert_eq!(rr, vec![0, 1, 2, 0, 1, 2]);
    let r1: Vec<usize> = (0..50)
        .map(|d| RandomChoice.select(&input(&cs, 1, d)).chosen)
        .collect();
    let r2: Vec<usize> = (0..50)
        .map(|d| RandomChoice.select(&input(&cs, 1, d)).chosen)
        .collect();
    assert_eq!(r1, r2);
    let mut other = input(&cs, 1, 0);
    other.seed = 7;
    let r3: Vec<usize> = (0..50)
        .map(|d| {
            RandomChoice
                .select(&PolicyInput {
                    decision: d,
                    ..other
                })
                .chosen
        })
        .collect();
    assert_ne!(r1, r3, "another seed, another stream");
}

#[test]
fn least_loaded_and_power_of_two_prefer_less_load() {
    let mut cs = vec![cand(1, 0, 0), cand(2, 0, 0), cand(3, 0, 0)];
    cs[0].load.inflight = 5;
    cs[1].load.inflight = 1;
    cs[2].load.inflight = 3;
    assert_eq!(LeastLoaded.select(&input(&cs, 1, 0)).chosen, 1);
    for d in 0..100 {
        let c = PowerOfTwo.select(&input(&cs, 1, d));
        let sampled: Vec<usize> = (0..3).filter(|&i| c.costs[i].is_some()).collect();
        assert_eq!(sampled.len(), 2);
        let best = *sampled
            .iter()
            .min_by_key(|&&i| cs[i].load.inflight)
            .unwrap();
        assert_eq!(c.chosen, best);
        // The most loaded never wins.
        assert_ne!(c.chosen, 0);
    }
    assert_eq!(PowerOfTwo.select(&input(&cs[..1], 1, 0)).chosen, 0);
}

#[test]
fn affinity_is_a_soft_bias() {
    let cs = [cand(1, 0, 100), cand(2, 0, 105)];
    let mut inp = input(&cs, 16, 0);
    assert_eq!(KvCost::default().select(&inp).chosen, 0);
    inp.affinity = Some(WorkerId(2));
    inp.affinity_bias = 0.1;
    assert_eq!(
        KvCost::default().select(&inp).chosen,
        1,
        "a small gap is bridged"
    );
    let far = [cand(1, 0, 100), cand(2, 0, 200)];
    let inp = PolicyInput {
        candidates: &far,
        ..inp
    };
    assert_eq!(KvCost::default().select(&inp).chosen, 0, "not a pin");
}

fn est(tokens_per_sec: f64) -> Option<PrefillEstimate> {
    Some(PrefillEstimate {
        secs_per_token: 1.0 / tokens_per_sec,
        overhead_secs: 0.01,
        samples: 10,
    })
}

#[test]
fn predictive_trades_cache_against_queued_prefill() {
    let p = Predictive::default();
    let mut hot = cand(1, 200, 0);
    hot.prefill = est(10_000.0);
    let mut cold = cand(2, 0, 0);
    cold.prefill = est(10_000.0);
    let cs = [hot.clone(), cold.clone()];
    let t = p.predict(&input(&cs, 4_000, 0));
    assert!((t[0] - (0.01 + 800.0 / 10_000.0)).abs() < 1e-9, "{t:?}");
    assert!((t[1] - (0.01 + 4_000.0 / 10_000.0)).abs() < 1e-9, "{t:?}");
    assert_eq!(p.select(&input(&cs, 4_000, 0)).chosen, 0);
    // The cached worker is buried in prefill work: the cold one is faster.
    hot.load.prefill_tokens = 50_000;
    let cs = [hot, cold];
    assert_eq!(p.select(&input(&cs, 4_000, 0)).chosen, 1);
}

#[test]
fn predictive_uses_fleet_speed_for_unmeasured_workers_and_penalises_limits() {
    let p = Predictive::default();
    let mut fast = cand(1, 0, 0);
    fast.prefill = est(20_000.0);
    let slow_unknown = cand(2, 0, 0);
    let t = p.predict(&input(&[fast.clone(), slow_unknown], 2_000, 0));
    assert!(
        (t[0] - t[1]).abs() < 1e-12,
        "unmeasured borrows the fleet mean: {t:?}"
    );
    // With nobody measured the prior applies.
    let t = p.predict(&input(&[cand(1, 0, 0)], 5_000, 0));
    assert!((t[0] - 0.5).abs() < 1e-12);
    // Batch limit: a full worker waits for a slot.
    let mut full = fast.clone();
    full.capacity.max_batch = Some(4);
    full.load.inflight = 4;
    full.service_secs = Some(8.0);
    let t = p.predict(&input(&[full], 2_000, 0));
    assert!((t[0] - (0.01 + 0.1 + 8.0 / 4.0)).abs() < 1e-9, "{t:?}");
    // KV overflow: the cached prefix is assumed lost.
    let mut tight = fast;
    tight.matched_blocks = 100;
    tight.capacity.kv_blocks = Some(100);
    tight.load.active_blocks = 90;
    tight.service_secs = Some(10.0);
    let t = p.predict(&input(&[tight], 1_600 + 320, 0));
    let expect = 0.01 + 320.0 / 20_000.0 + 1_600.0 / 20_000.0 + 10.0 / 100.0 * 10.0;
    assert!((t[0] - expect).abs() < 1e-9, "{t:?} vs {expect}");
}

#[test]
fn policy_names_parse_and_configs_validate() {
    for k in PolicyKind::ALL {
        assert_eq!(k.as_str().parse::<PolicyKind>(), Ok(k));
        let cfg = PolicyConfig {
            kind: k,
            ..PolicyConfig::default()
        };
        assert_eq!(cfg.build().name(), k.as_str());
    }
    assert!("fastest".parse::<PolicyKind>().is_err());
    let mut cfg = PolicyConfig::default();
    cfg.kv.temperature = -1.0;
    assert!(cfg.validate().is_err());
    let mut cfg = PolicyConfig::default();
    cfg.predictive.prior_tokens_per_sec = 0.0;
    assert!(cfg.validate().is_err());
}

fn decode(base: f64, per_ktoken: f64) -> Option<crate::ledger::DecodeEstimate> {
    Some(crate::ledger::DecodeEstimate {
        base_secs: base,
        per_seq_secs: 0.0,
        per_ktoken_secs: per_ktoken,
        samples: 100,
    })
}

/// Two workers learned alike (prefill 10k tokens/s, 20 ms decode steps + 0.1 ms per 1,000
/// tokens of context, answers of 800 tokens); the first holds the prompt's prefix.
fn goodput_pair(hot_running: u32, cold_running: u32) -> [Candidate; 2] {
    let mut hot = cand(1, 200, 0);
    let mut cold = cand(2, 0, 0);
    for (c, n) in [(&mut hot, hot_running), (&mut cold, cold_running)] {
        c.prefill = est(10_000.0);
        c.decode = decode(0.020, 0.0001);
        c.output_tokens = Some(800.0);
        c.load.inflight = n;
        c.load.miss_weights = f64::from(n);
        c.load.context_tokens = u64::from(n) * 6_000;
    }
    [hot, cold]
}

#[test]
fn goodput_keeps_a_prefix_where_it_is_while_the_decode_cost_is_small() {
    let g = Goodput::default();
    // 3,400 tokens, 3,200 cached on the first: both within 600 ms, decode loads alike.
    let cs = goodput_pair(10, 8);
    assert_eq!(g.select(&input(&cs, 3_400, 0)).chosen, 0);
}

#[test]
fn goodput_spreads_decode_load_that_predictive_would_pack() {
    let g = Goodput::default();
    let p = Predictive::default();
    // The cached worker runs 40 requests, the other 4: the prefix saves 0.32 s of prefill
    // but every token there takes 20% longer for the new request and the 40.
    let cs = goodput_pair(40, 4);
    assert_eq!(
        p.select(&input(&cs, 3_400, 0)).chosen,
        0,
        "predictive packs"
    );
    let choice = g.select(&input(&cs, 3_400, 0));
    assert_eq!(choice.chosen, 1, "{:?}", choice.costs);
}

#[test]
fn goodput_counts_a_missed_first_token_against_the_worker() {
    let g = Goodput::default();
    // 12,000 tokens, 11,200 cached on the busier first worker: elsewhere the first token
    // takes 1.2 s (a miss); the decode gap (20 against 8 running) does not pay for it.
    let mut cs = goodput_pair(20, 8);
    cs[0].matched_blocks = 700;
    let costs = g.predict(&input(&cs, 12_000, 0));
    assert_eq!(g.select(&input(&cs, 12_000, 0)).chosen, 0, "{costs:?}");
    // With looser objectives the cold worker's first token is in time, and its lighter
    // decode wins.
    let loose = Goodput::new(
        GoodputConfig {
            ttft_secs: 2.0,
            tpot_secs: 0.06,
        },
        Predictive::default(),
    );
    assert_eq!(loose.select(&input(&cs, 12_000, 0)).chosen, 1);
}

#[test]
fn goodput_judges_a_request_by_its_classs_objectives_and_weighs_its_miss() {
    let g = Goodput::default();
    // As above: only the busier first worker gives the first token within 600 ms.
    let mut cs = goodput_pair(20, 8);
    cs[0].matched_blocks = 700;
    assert_eq!(g.select(&input(&cs, 12_000, 0)).chosen, 0);
    // A class whose objective is 30 s misses nowhere: the lighter decode wins.
    let batch = PolicyInput {
        class: ClassNeeds {
            ttft_secs: Some(30.0),
            ..ClassNeeds::default()
        },
        ..input(&cs, 12_000, 0)
    };
    assert_eq!(g.select(&batch).chosen, 1);
    // A miss weighed ten times costs ten times its own time more.
    let own = |w: f64| {
        g.predict(&PolicyInput {
            class: ClassNeeds {
                miss_weight: w,
                ..ClassNeeds::default()
            },
            ..input(&cs, 12_000, 0)
        })[1]
    };
    assert!(own(10.0) > own(1.0) + 5.0, "{} vs {}", own(10.0), own(1.0));
}

#[test]
fn goodput_weighs_the_running_requests_misses_by_their_classes() {
    let g = Goodput::default();
    // 60 running on each, alike: the 20,000-token prompt's prefill (2 s, 5 ms a token of the
    // 400 they have left) pushes their steps past 60 ms on either worker.
    let mut cs = goodput_pair(60, 60);
    cs[0].matched_blocks = 0;
    let pick = |cs: &[Candidate]| g.select(&input(cs, 20_000, 0)).chosen;
    // Ten of the first's weigh ten each (an interactive class): the request goes to the
    // second; the same weights on the second send it to the first.
    cs[0].load.miss_weights = 150.0;
    assert_eq!(pick(&cs), 1);
    (cs[0].load.miss_weights, cs[1].load.miss_weights) = (60.0, 150.0);
    assert_eq!(pick(&cs), 0);
}

#[test]
fn goodput_counts_the_wait_a_full_batch_adds_for_the_next_arrival() {
    // 12,000 tokens, 11,200 cached on the first worker, which runs 64 requests of 40 s: a
    // first token there waits for a running one to leave (a miss), as it misses on the cold
    // worker (1.2 s of prefill). Seconds alone keep it on the cached worker...
    let g = Goodput::default();
    let mut cs = goodput_pair(64, 40);
    cs[0].matched_blocks = 700;
    for c in &mut cs {
        c.service_secs = Some(40.0);
    }
    assert_eq!(g.select(&input(&cs, 12_000, 0)).chosen, 0);
    // ...but at the batch limit one more request there makes the next arrival wait past
    // the objective as well.
    for c in &mut cs {
        c.capacity.max_batch = Some(64);
    }
    let costs = g.predict(&input(&cs, 12_000, 0));
    assert_eq!(g.select(&input(&cs, 12_000, 0)).chosen, 1, "{costs:?}");
}

#[test]
fn goodput_spreads_from_the_start_before_anything_is_learned() {
    let g = Goodput::default();
    let mut a = cand(1, 0, 0);
    let mut b = cand(2, 0, 0);
    a.load.inflight = 6;
    b.load.inflight = 2;
    (a.load.miss_weights, b.load.miss_weights) = (6.0, 2.0);
    let cs = [a, b];
    assert_eq!(g.select(&input(&cs, 1_000, 0)).chosen, 1);
    assert!(GoodputConfig {
        ttft_secs: 0.0,
        tpot_secs: 0.06
    }
    .validate()
    .is_err());
}
