use super::*;
use crate::hashing::{sequence_hashes, LocalBlockHash};
use crate::BlockSize;

fn ledger() -> LoadLedger {
    let mut l = LoadLedger::new(BlockSize::new(16).unwrap());
    l.add_worker(WorkerId(1), WorkerCapacity::default());
    l.add_worker(WorkerId(2), WorkerCapacity::default());
    l
}

fn seqs(ids: &[u64]) -> Vec<SequenceHash> {
    sequence_hashes(&ids.iter().map(|i| LocalBlockHash(*i)).collect::<Vec<_>>())
}

fn book(
    l: &mut LoadLedger,
    id: u64,
    w: u64,
    tokens: usize,
    cached: usize,
    blocks: &[SequenceHash],
) {
    l.book(
        &Booking {
            request: RequestId(id),
            worker: WorkerId(w),
            prompt_tokens: tokens,
            cached_tokens: cached,
            blocks,
            miss_weight: 1.0,
        },
        Time::from_millis(id),
    )
    .unwrap();
}

#[test]
fn shared_prefix_blocks_count_once() {
    let mut l = ledger();
    let a = seqs(&[1, 2, 3]);
    let b = seqs(&[1, 2, 4]);
    book(&mut l, 1, 1, 50, 0, &a); // 3 full blocks + partial
    book(&mut l, 2, 1, 48, 32, &b); // 3 full blocks, 2 shared
    let w = l.load(WorkerId(1)).unwrap();
    assert_eq!(w.inflight, 2);
    assert_eq!(w.prefill_tokens, 50 + 16);
    assert_eq!(w.active_blocks, 4 + 1);
    l.first_token(RequestId(1), Time::from_millis(100)).unwrap();
    assert_eq!(l.load(WorkerId(1)).unwrap().prefill_tokens, 16);
    l.finish(RequestId(1), Time::from_millis(200)).unwrap();
    let w = l.load(WorkerId(1)).unwrap();
    assert_eq!((w.inflight, w.prefill_tokens, w.active_blocks), (1, 16, 3));
    l.finish(RequestId(2), Time::from_millis(200)).unwrap();
    assert_eq!(l.load(WorkerId(1)).unwrap(), WorkerLoad::default());
    assert_eq!(l.inflight(), 0);
}

#[test]
fn finish_without_first_token_releases_prefill() {
    let mut l = ledger();
    book(&mut l, 7, 2, 100, 0, &seqs(&[1, 2, 3, 4, 5, 6]));
    l.finish(RequestId(7), Time::from_millis(50)).unwrap();
    assert_eq!(l.load(WorkerId(2)).unwrap(), WorkerLoad::default());
    assert!(
        l.prefill_estimate(WorkerId(2)).is_none(),
        "failures teach no prefill speed"
    );
    assert!(l.service_secs(WorkerId(2)).is_some());
}

#[test]
fn misuse_is_reported() {
    let mut l = ledger();
    let s = seqs(&[1]);
    book(&mut l, 1, 1, 16, 0, &s);
    let dup = Booking {
        request: RequestId(1),
        worker: WorkerId(1),
        prompt_tokens: 16,
        cached_tokens: 0,
        blocks: &s,
        miss_weight: 1.0,
    };
    assert_eq!(
        l.book(&dup, Time::ZERO),
        Err(LedgerError::DuplicateRequest(RequestId(1)))
    );
    let unknown = Booking {
        request: RequestId(2),
        worker: WorkerId(9),
        ..dup
    };
    assert_eq!(
        l.book(&unknown, Time::ZERO),
        Err(LedgerError::UnknownWorker(WorkerId(9)))
    );
    assert_eq!(
        l.first_token(RequestId(5), Time::ZERO),
        Err(LedgerError::UnknownRequest(RequestId(5)))
    );
    l.first_token(RequestId(1), Time::from_millis(10)).unwrap();
    l.first_token(RequestId(1), Time::from_millis(20)).unwrap();
    l.finish(RequestId(1), Time::from_millis(30)).unwrap();
    assert_eq!(
        l.finish(RequestId(1), Time::ZERO),
        Err(LedgerError::UnknownRequest(RequestId(1)))
    );
    let mut small = LoadLedger::with_max_inflight(BlockSize::new(16).unwrap(), 1);
    small.add_worker(WorkerId(1), WorkerCapacity::default());
    book(&mut small, 1, 1, 16, 0, &s);
    let more = Booking {
        request: RequestId(2),
        ..dup
    };
    assert_eq!(
        small.book(&more, Time::ZERO),
        Err(LedgerError::TooManyInflight(1))
    );
}

#[test]
fn removed_worker_does_not_leak_into_its_successor() {
    let mut l = ledger();
    book(&mut l, 1, 1, 40, 0, &seqs(&[1, 2]));
    l.remove_worker(WorkerId(1));
    l.add_worker(WorkerId(1), WorkerCapacity::default());
    book(&mut l, 2, 1, 40, 0, &seqs(&[1, 2]));
    l.finish(RequestId(1), Time::from_millis(9)).unwrap();
    let w = l.load(WorkerId(1)).unwrap();
    assert_eq!((w.inflight, w.prefill_tokens, w.active_blocks), (1, 40, 3));
}

#[test]
fn first_tokens_teach_the_prefill_speed() {
    let mut l = ledger();
    for i in 0..20u64 {
        let tokens = 1_000 + 100 * i as usize;
        book(&mut l, 100 + i, 1, tokens, 0, &[]);
        let booked = Time::from_millis(100 + i);
        // 10,000 tokens/s, 5 ms overhead.
        let ttft = 0.005 + tokens as f64 / 10_000.0;
        l.first_token(
            RequestId(100 + i),
            booked.plus(std::time::Duration::from_secs_f64(ttft)),
        )
        .unwrap();
        l.finish(
            RequestId(100 + i),
            booked.plus(std::time::Duration::from_secs(1)),
        )
        .unwrap();
    }
    let e = l.prefill_estimate(WorkerId(1)).unwrap();
    assert!((1.0 / e.secs_per_token - 10_000.0).abs() < 50.0, "{e:?}");
    assert!((e.overhead_secs - 0.005).abs() < 1e-3, "{e:?}");
    assert!((l.service_secs(WorkerId(1)).unwrap() - 1.0).abs() < 1e-6);
}

#[test]
fn decode_speed_is_learned_from_finished_requests_against_their_batch() {
    // A worker whose decode step takes 10 ms + 2 ms per running sequence: rounds of k
    // requests (prompts fully cached, 64 tokens each) decoding 101 tokens side by side.
    let step = |k: u64| 0.010 + 0.002 * k as f64;
    let mut l = ledger();
    let mut t = 0.0;
    let mut id = 0;
    for round in 0..60 {
        let k = [1, 2, 4, 8][round % 4];
        let ids: Vec<u64> = (0..k)
            .map(|_| {
                id += 1;
                id
            })
            .collect();
        let at = |s: f64| Time(std::time::Duration::from_secs_f64(s));
        for &i in &ids {
            let blocks = seqs(&[i * 10, i * 10 + 1, i * 10 + 2, i * 10 + 3]);
            l.book(
                &Booking {
                    request: RequestId(i),
                    worker: WorkerId(1),
                    prompt_tokens: 64,
                    cached_tokens: 64,
                    blocks: &blocks,
                    miss_weight: 1.0,
                },
                at(t),
            )
            .unwrap();
        }
        for &i in &ids {
            l.first_token(RequestId(i), at(t + 0.05)).unwrap();
        }
        let end = t + 0.05 + 100.0 * step(k);
        for &i in &ids {
            l.finish_with(RequestId(i), at(end), Some(101)).unwrap();
        }
        t = end + 1.0;
    }
    let view = l.views().next().unwrap();
    let e = view.decode.expect("learned");
    for k in [1u64, 4, 8] {
        // KV grows with the batch here (4 blocks each): the fit may put it in either term.
        let predicted = e.step_secs(k as f64, (k * 64) as f64);
        assert!(
            (predicted - step(k)).abs() < 1e-4,
            "batch {k}: {predicted} vs {} ({e:?})",
            step(k)
        );
    }
    assert_eq!(view.output_tokens, Some(101.0));
    // A finish without a count teaches nothing.
    assert!(l.views().nth(1).unwrap().decode.is_none());
}

#[test]
fn a_worker_that_looked_slow_is_measured_again_after_the_others_took_its_share() {
    // Worker 1's first requests were slow (a cold start: 0.25 s overhead); then every
    // request goes to worker 2. Past `STALE_PER_WORKER` bookings per worker elsewhere its
    // old figures are no longer routed on, and its next first token starts its fit afresh.
    let mut l = ledger();
    let at = |ms: u64| Time::from_millis(ms);
    let mut id = 0;
    let mut serve = |l: &mut LoadLedger, w: u64, tokens: usize, ttft_ms: u64, t: u64| {
        id += 1;
        let blocks = seqs(&[id * 100]);
        l.book(
            &Booking {
                request: RequestId(id),
                worker: WorkerId(w),
                prompt_tokens: tokens,
                cached_tokens: 0,
                blocks: &blocks,
                miss_weight: 1.0,
            },
            at(t),
        )
        .unwrap();
        l.first_token(RequestId(id), at(t + ttft_ms)).unwrap();
        l.finish(RequestId(id), at(t + ttft_ms + 10)).unwrap();
    };
    // Worker 1 keeps a request in flight (an idle worker goes stale sooner: below).
    l.book(
        &Booking {
            request: RequestId(1_000_000),
            worker: WorkerId(1),
            prompt_tokens: 16,
            cached_tokens: 16,
            blocks: &seqs(&[7]),
            miss_weight: 1.0,
        },
        at(0),
    )
    .unwrap();
    for i in 0..10 {
        serve(
            &mut l,
            1,
            1_000 + 100 * i,
            250 + 10 * i as u64,
            1_000 * i as u64,
        );
    }
    let slow = |l: &LoadLedger| l.views().next().unwrap().prefill;
    assert!(slow(&l).is_some());
    let limit = STALE_PER_WORKER * 2;
    for i in 0..limit {
        serve(&mut l, 2, 1_000, 20, 100_000 + 100 * i);
    }
    assert!(
        slow(&l).is_some(),
        "{limit} bookings elsewhere: still fresh"
    );
    serve(&mut l, 2, 1_000, 20, 200_000);
    assert!(
        slow(&l).is_none(),
        "{limit} + 1: stale, the fleet's figures stand in"
    );
    // Sent work again, it is measured afresh: its new speed alone counts.
    serve(&mut l, 1, 1_000, 20, 300_000);
    let e = slow(&l).expect("measured again");
    assert!((e.ttft_secs(1_000.0) - 0.020).abs() < 1e-3, "{e:?}");
}

#[test]
fn an_idle_worker_avoided_on_its_figures_is_measured_again_soon() {
    // Worker 1 looked slow and has nothing in flight; every request goes to worker 2. Past
    // `IDLE_STALE_PER_WORKER` bookings per worker elsewhere its figures are set aside.
    let mut l = ledger();
    let at = |ms: u64| Time::from_millis(ms);
    for i in 0..11u64 {
        let w = if i < 10 { 1 } else { 2 };
        l.book(
            &Booking {
                request: RequestId(i),
                worker: WorkerId(w),
                prompt_tokens: 1_000 + 100 * i as usize,
                cached_tokens: 0,
                blocks: &seqs(&[i * 100]),
                miss_weight: 1.0,
            },
            at(1_000 * i),
        )
        .unwrap();
        l.first_token(RequestId(i), at(1_000 * i + 250)).unwrap();
        if w == 1 {
            l.finish(RequestId(i), at(1_000 * i + 260)).unwrap();
        }
    }
    // Request 10 stays in flight on worker 2; its booking was the first elsewhere.
    let slow = |l: &LoadLedger| l.views().next().unwrap().prefill;
    let limit = IDLE_STALE_PER_WORKER * 2;
    for i in 11..10 + limit {
        l.book(
            &Booking {
                request: RequestId(i),
                worker: WorkerId(2),
                prompt_tokens: 1_000,
                cached_tokens: 0,
                blocks: &seqs(&[i * 100]),
                miss_weight: 1.0,
            },
            at(1_000 * i),
        )
        .unwrap();
    }
    assert!(
        slow(&l).is_some(),
        "{limit} bookings elsewhere: still fresh"
    );
    l.book(
        &Booking {
            request: RequestId(100),
            worker: WorkerId(2),
            prompt_tokens: 1_000,
            cached_tokens: 0,
            blocks: &seqs(&[100 * 100]),
            miss_weight: 1.0,
        },
        at(100_000),
    )
    .unwrap();
    assert!(slow(&l).is_none(), "{limit} + 1 while idle: stale");
    // Sent work, it is measured afresh: its new speed alone counts.
    l.book(
        &Booking {
            request: RequestId(101),
            worker: WorkerId(1),
            prompt_tokens: 1_000,
            cached_tokens: 0,
            blocks: &seqs(&[101 * 100]),
            miss_weight: 1.0,
        },
        at(101_000),
    )
    .unwrap();
    l.first_token(RequestId(101), at(101_020)).unwrap();
    let e = slow(&l).expect("measured again");
    assert!((e.ttft_secs(1_000.0) - 0.020).abs() < 1e-3, "{e:?}");
}

#[test]
fn a_worker_chosen_for_split_decodes_keeps_its_prefill_figures() {
    let mut l = ledger();
    let blocks = seqs(&[1, 2]);
    for id in 1..=3 {
        book(&mut l, id, 1, 32 * id as usize, 0, &blocks);
        l.first_token(RequestId(id), Time::from_millis(id + 10 * id))
            .unwrap();
        l.finish(RequestId(id), Time::from_millis(100)).unwrap();
    }
    let learned = l.prefill_estimate(WorkerId(1));
    assert!(learned.is_some());
    let fresh = |l: &LoadLedger| {
        l.views()
            .find(|v| v.worker == WorkerId(1))
            .unwrap()
            .prefill
            .is_some()
    };
    // Far more bookings elsewhere than the staleness limit (256 per worker), worker 1
    // taking split requests' decodes (their prompts computed elsewhere) all along.
    for id in 10..=1_400u64 {
        let t = Time::from_millis(1_000 + id);
        if id % 10 == 0 {
            let b = Booking {
                request: RequestId(id),
                worker: WorkerId(1),
                prompt_tokens: 64,
                cached_tokens: 0,
                blocks: &blocks,
                miss_weight: 1.0,
            };
            l.book_decode(&b, t).unwrap();
        } else {
            book(&mut l, id, 2, 64, 0, &blocks);
        }
        l.first_token(RequestId(id), t).unwrap();
        l.finish(RequestId(id), t).unwrap();
    }
    assert!(fresh(&l), "figures of a worker being chosen are not stale");
    assert_eq!(l.prefill_estimate(WorkerId(1)), learned);
}

#[test]
fn miss_weights_are_summed_while_in_flight_and_given_back() {
    let mut l = ledger();
    let s = seqs(&[1]);
    let weighted = |id, w: f64| Booking {
        request: RequestId(id),
        worker: WorkerId(1),
        prompt_tokens: 16,
        cached_tokens: 0,
        blocks: &s,
        miss_weight: w,
    };
    for (id, w) in [(1, 10.0), (2, 1.0), (3, 0.3), (4, f64::NAN), (5, -2.0)] {
        l.book(&weighted(id, w), Time::ZERO).unwrap();
    }
    // A weight that is not a number counts 1, a negative one 0.
    let sum = |l: &LoadLedger| l.load(WorkerId(1)).unwrap().miss_weights;
    assert!((sum(&l) - 12.3).abs() < 1e-9, "{}", sum(&l));
    l.finish(RequestId(1), Time::from_millis(5)).unwrap();
    assert!((sum(&l) - 2.3).abs() < 1e-9, "{}", sum(&l));
    for id in 2..=5 {
        l.finish(RequestId(id), Time::from_millis(5)).unwrap();
    }
    assert_eq!(sum(&l), 0.0);
}
