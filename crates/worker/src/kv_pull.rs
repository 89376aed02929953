//! TensorRT-LLM's HTTP pull API for KV events, played by the simulated worker when it speaks
//! TensorRT-LLM's format: `POST /kv_cache_events` drains the queued events as a JSON array
//! (`{event_id, data, window_size}`, `data` of type `created`, `stored`, `removed`), each
//! returned once; the queue keeps at most `capacity` events and drops the oldest beyond
//! (the `event_id` then jumps, as TensorRT-LLM's bounded buffer makes it do); a restart
//! numbers from 0 again after a `created` event. The shape follows TensorRT-LLM's
//! `KVCacheEventSerializer` (tensorrt_llm/_utils.py); like it, it names no LoRA adapter.

use kvroute_protocol::kv_events::Event;
use serde_json::{json, Value};
use std::collections::VecDeque;

/// The attention window reported with every event (one full-attention window).
const WINDOW: u64 = 1 << 20;

/// The queue of events not pulled yet, kept as events (a few bytes a token) and written as
/// JSON only when pulled.
pub(crate) struct PullQueue {
    next_id: u64,
    /// Each with its id; None: the cache was created.
    events: VecDeque<(u64, Option<Event>)>,
    capacity: usize,
    blocks: u64,
    /// The attention-DP rank the events are of.
    rank: u32,
}

impl PullQueue {
    /// An empty queue for rank `rank` of an engine of `blocks` KV blocks, starting with its
    /// `created` event.
    pub(crate) fn new(capacity: usize, blocks: u64, rank: u32) -> Self {
        let mut q = Self {
            next_id: 0,
            events: VecDeque::new(),
            capacity: capacity.max(1),
            blocks,
            rank,
        };
        q.push(None);
        q
    }

    fn push(&mut self, e: Option<Event>) {
        if self.events.len() == self.capacity {
            self.events.pop_front();
        }
        self.events.push_back((self.next_id, e));
        self.next_id += 1;
    }

    /// A new incarnation of the engine: ids from 0, after a `created` event.
    pub(crate) fn restart(&mut self) {
        self.events.clear();
        self.next_id = 0;
        self.push(None);
    }

    /// Queues one step's events (TensorRT-LLM has no event for a dropped cache: a restart
    /// says it).
    pub(crate) fn push_events(&mut self, events: &[Event]) {
        for e in events {
            if matches!(e, Event::Stored(_) | Event::Removed(_)) {
                self.push(Some(e.clone()));
            }
        }
    }

    /// Every queued event as TensorRT-LLM writes it, oldest first; the queue is left empty.
    pub(crate) fn drain(&mut self) -> Vec<Value> {
        let events = std::mem::take(&mut self.events);
        events
            .into_iter()
            .map(|(id, e)| {
                json!({
                    "event_id": id,
                    "data": self.data(&e),
                    "window_size": WINDOW,
                    "attention_dp_rank": self.rank,
                })
            })
            .collect()
    }

    /// An event's `data` object.
    fn data(&self, e: &Option<Event>) -> Value {
        match e {
            None => {
                json!({"type": "created", "num_blocks_per_cache_level": [self.blocks, 0]})
            }
            Some(Event::Stored(s)) => {
                let bs = usize::try_from(s.block_size).unwrap_or(usize::MAX).max(1);
                let blocks: Vec<Value> = s
                    .block_hashes
                    .iter()
                    .zip(s.token_ids.chunks(bs))
                    .enumerate()
                    .map(|(i, (h, tokens))| {
                        let salt = (i == 0 && s.parent.is_none())
                            .then_some(s.cache_salt.as_deref())
                            .flatten();
                        json!({
                            "type": "stored_block",
                            "block_hash": h.0,
                            "tokens": tokens.iter().map(|t| json!({
                                "type": "unique_token", "token_id": t, "token_extra_id": 0
                            })).collect::<Vec<_>>(),
                            "cache_salt": salt,
                            "cache_level": 0,
                            "priority": 35,
                            "mm_keys": [],
                        })
                    })
                    .collect();
                json!({
                    "type": "stored",
                    "parent_hash": s.parent.map(|p| p.0),
                    "blocks": blocks,
                })
            }
            Some(Event::Removed(r)) => json!({
                "type": "removed",
                "block_hashes": r.block_hashes.iter().map(|h| h.0).collect::<Vec<_>>(),
            }),
            Some(_) => Value::Null,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvroute_core::EngineHash;
    use kvroute_protocol::kv_events::{Removed, Stored};

    #[test]
    fn events_are_numbered_drained_once_and_bounded() {
        let mut q = PullQueue::new(3, 100, 0);
        q.push_events(&[Event::Stored(Stored {
            block_hashes: vec![EngineHash(u64::MAX), EngineHash(2)],
            token_ids: vec![1, 2, 3, 4],
            block_size: 2,
            cache_salt: Some("s".into()),
            ..Stored::default()
        })]);
        let got = q.drain();
        assert_eq!(got.len(), 2);
        assert_eq!(got[0]["data"]["type"], "created");
        let stored = &got[1];
        assert_eq!(stored["event_id"], 1);
        assert_eq!(stored["data"]["parent_hash"], Value::Null);
        assert_eq!(stored["data"]["blocks"][0]["block_hash"], u64::MAX);
        assert_eq!(stored["data"]["blocks"][0]["cache_salt"], "s");
        assert_eq!(stored["data"]["blocks"][1]["cache_salt"], Value::Null);
        assert_eq!(stored["data"]["blocks"][1]["tokens"][1]["token_id"], 4);
        assert!(q.drain().is_empty(), "each event once");
        // Past the capacity the oldest go: the ids jump.
        for h in 0..5 {
            q.push_events(&[Event::Removed(Removed {
                block_hashes: vec![EngineHash(h)],
                ..Removed::default()
            })]);
        }
        let ids: Vec<u64> = q
            .drain()
            .iter()
            .map(|e| e["event_id"].as_u64().unwrap())
            .collect();
        assert_eq!(ids, [4, 5, 6]);
        q.restart();
        let again = q.drain();
        assert_eq!((again[0]["event_id"].as_u64(), again.len()), (Some(0), 1));
    }
}
