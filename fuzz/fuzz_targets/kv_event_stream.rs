//! Fuzzes the KV event path from whole ZMQ messages to the index: the input is a stream of
//! multipart messages as a SUB socket hands them over (each: a frame count byte, then per
//! frame a 16-bit little-endian length and its bytes), every message decoded as the gateway
//! decodes it and its events applied to one router, in its tier, for one of two workers, with
//! a small per-worker block limit. Any stream gives applied or refused events, never a panic,
//! and the limit always holds. `cargo +nightly fuzz run kv_event_stream` (from `fuzz/`; seeds
//! from real vLLM frames: `bash scripts/fuzz.sh`).
#![no_main]

use kvroute_core::{Router, RouterConfig, WorkerCapacity, WorkerId};
use kvroute_protocol::kv_events::decode_message;
use libfuzzer_sys::fuzz_target;

const LIMIT: usize = 64;

fn messages(mut data: &[u8]) -> Vec<Vec<&[u8]>> {
    let mut out = Vec::new();
    while let Some((&count, rest)) = data.split_first() {
        data = rest;
        let mut frames = Vec::new();
        for _ in 0..count % 6 {
            if data.len() < 2 {
                break;
            }
            let len = usize::from(u16::from_le_bytes([data[0], data[1]]));
            let end = (2 + len).min(data.len());
            frames.push(&data[2..end]);
            data = &data[end..];
        }
        out.push(frames);
    }
    out
}

fuzz_target!(|data: &[u8]| {
    let config = RouterConfig {
        // vLLM's CPU backend: a multiple of 32, as in the seed frames.
        block_size: 32,
        max_blocks_per_worker: LIMIT,
        ..RouterConfig::default()
    };
    let Ok(mut router) = Router::new(config) else {
        return;
    };
    let workers = [WorkerId(0), WorkerId(1)];
    for w in workers {
        let _ = router.add_worker(w, WorkerCapacity::default());
    }
    for (i, frames) in messages(data).iter().enumerate() {
        let Ok(batch) = decode_message(frames) else {
            continue;
        };
        let worker = workers[i % 2];
        for event in &batch.events {
            if let Some(kv) = event.to_kv_event() {
                let _ = router.apply_tier_event(worker, event.tier(), &kv);
            }
        }
        for w in workers {
            assert!(router.index().block_count(w) <= LIMIT);
        }
    }
});
