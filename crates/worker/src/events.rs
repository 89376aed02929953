//! The KV event hub: numbers each engine step's events as one batch (consecutive sequence
//! numbers from 0 per engine incarnation), keeps the last batches for replay and hands them
//! to in-process subscribers (a broadcast channel; the ZMQ publisher is one of them).

use kvroute_core::{KvEvent, Namespace};
use kvroute_protocol::kv_events::{encode_payload, Event, EventBatch, EventFormat};
use parking_lot::{Mutex, MutexGuard};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use tokio::sync::broadcast;

/// Batches a broadcast subscriber may fall behind by before it misses some (it is told so
/// by `RecvError::Lagged` and can catch up with a replay).
pub(crate) const BROADCAST_CAPACITY: usize = 16_384;

/// See the module documentation. Only the engine driver publishes; anyone may read.
pub(crate) struct EventHub {
    state: Mutex<State>,
    tx: broadcast::Sender<Arc<EventBatch>>,
    format: EventFormat,
    /// The data-parallel rank stamped on batches (a worker plays one rank of an engine).
    dp_rank: u32,
    /// The adapter name and cache salt of each namespace requests used (the engine's events
    /// carry only the namespace's hash; the wire names them). Bounded by [`MAX_NAMES`].
    names: Mutex<HashMap<Namespace, Names>>,
    /// Fault injection: batches go out live without their events (see `/admin/faults`).
    blank_live: std::sync::atomic::AtomicBool,
    /// TensorRT-LLM's pull API queue, when the worker plays it.
    pull: Option<Mutex<crate::kv_pull::PullQueue>>,
}

/// A namespace's adapter name and cache salt.
type Names = (Option<String>, Option<String>);

/// Namespaces remembered at most (started afresh beyond: a stored event of a namespace
/// forgotten meanwhile goes out without its names).
const MAX_NAMES: usize = 4096;

struct State {
    next_seq: u64,
    buffer: VecDeque<(Arc<EventBatch>, usize)>,
    capacity: usize,
    /// Estimated bytes of the buffered batches, and their bound.
    bytes: usize,
    max_bytes: usize,
}

/// About how many bytes a batch holds (its vectors' contents and the fixed parts).
fn batch_bytes(batch: &EventBatch) -> usize {
    let event = |e: &Event| match e {
        Event::Stored(s) => {
            s.block_hashes.len() * 8 + s.token_ids.len() * 4 + s.extra_keys.len() * 32 + 160
        }
        Event::Removed(r) => r.block_hashes.len() * 8 + 64,
        _ => 32,
    };
    64 + batch.events.iter().map(event).sum::<usize>()
}

impl EventHub {
    /// A hub keeping the last `replay` batches, writing them in `format`.
    pub(crate) fn new(replay: usize, format: EventFormat) -> Self {
        let (tx, _) = broadcast::channel(BROADCAST_CAPACITY);
        Self {
            format,
            dp_rank: 0,
            names: Mutex::new(HashMap::new()),
            blank_live: Default::default(),
            pull: None,
            state: Mutex::new(State {
                next_seq: 0,
                buffer: VecDeque::with_capacity(replay.min(1024)),
                capacity: replay,
                bytes: 0,
                max_bytes: usize::MAX,
            }),
            tx,
        }
    }

    /// Bounds the replay buffer by its estimated bytes too (the oldest batches leave first).
    pub(crate) fn with_replay_bytes(self, max_bytes: usize) -> Self {
        self.state().max_bytes = max_bytes;
        self
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock()
    }

    /// Also queues every event for TensorRT-LLM's pull API (at most `capacity`), for an
    /// engine of `blocks` KV blocks.
    pub(crate) fn with_pull(mut self, capacity: usize, blocks: u64) -> Self {
        self.pull = Some(Mutex::new(crate::kv_pull::PullQueue::new(
            capacity,
            blocks,
            self.dp_rank,
        )));
        self
    }

    /// The hub of data-parallel rank `rank` (set before [`Self::with_pull`]).
    pub(crate) fn with_rank(mut self, rank: u32) -> Self {
        self.dp_rank = rank;
        self
    }

    /// The pull API's queued events, drained; None when the worker does not serve it.
    pub(crate) fn pull(&self) -> Option<Vec<serde_json::Value>> {
        let q = self.pull.as_ref()?;
        Some(q.lock().drain())
    }

    /// Remembers the names of a namespace requests use.
    pub(crate) fn name(&self, ns: Namespace, lora: Option<&str>, salt: Option<&str>) {
        if ns.is_default() {
            return;
        }
        let mut names = self.names.lock();
        if names.len() >= MAX_NAMES && !names.contains_key(&ns) {
            names.clear();
        }
        names.insert(ns, (lora.map(str::to_string), salt.map(str::to_string)));
    }

    /// Fault injection: publish batches live without their events (the replay buffer keeps
    /// them whole), or stop doing so.
    pub(crate) fn set_blank_live(&self, on: bool) {
        self.blank_live
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// A batch's payload in the hub's wire format.
    pub(crate) fn encode(&self, b: &EventBatch) -> Vec<u8> {
        encode_payload(self.format, b.ts, &b.events, b.dp_rank)
    }

    /// Publishes the events of one engine step at virtual time `ts` (seconds) as the next
    /// batch: the device's, then the host tier's (medium `CPU`); nothing when there are
    /// none. Returns the batch.
    pub(crate) fn publish(
        &self,
        ts: f64,
        events: &[KvEvent],
        host: &[KvEvent],
    ) -> Option<Arc<EventBatch>> {
        let mut events: Vec<Event> = {
            let names = self.names.lock();
            events
                .iter()
                .filter_map(|e| {
                    let (lora, salt) = match e {
                        KvEvent::Stored(s) => names
                            .get(&s.namespace)
                            .map_or((None, None), |(l, t)| (l.as_deref(), t.as_deref())),
                        _ => (None, None),
                    };
                    Event::from_kv_event(e, lora, salt)
                })
                .collect()
        };
        // The pull API (TensorRT-LLM's form) carries the device tier only.
        let device = events.len();
        events.extend(host.iter().filter_map(|e| {
            let mut e = Event::from_kv_event(e, None, None)?;
            match &mut e {
                Event::Stored(s) => s.medium = Some("CPU".into()),
                Event::Removed(r) => r.medium = Some("CPU".into()),
                _ => {}
            }
            Some(e)
        }));
        if events.is_empty() {
            return None;
        }
        if let Some(q) = &self.pull {
            q.lock().push_events(&events[..device]);
        }
        let mut st = self.state();
        let batch = Arc::new(EventBatch {
            seq: st.next_seq,
            ts,
            events,
            dp_rank: Some(i64::from(self.dp_rank)),
        });
        st.next_seq += 1;
        if st.capacity > 0 {
            let size = batch_bytes(&batch);
            st.bytes += size;
            st.buffer.push_back((batch.clone(), size));
            while st.buffer.len() > st.capacity || (st.bytes > st.max_bytes && st.buffer.len() > 1)
            {
                if let Some((_, gone)) = st.buffer.pop_front() {
                    st.bytes -= gone;
                }
            }
        }
        // Sent under the lock, so subscribers see batches in sequence order. No subscriber
        // is not an error.
        let live = if self.blank_live.load(std::sync::atomic::Ordering::Relaxed) {
            Arc::new(EventBatch {
                seq: batch.seq,
                ts: batch.ts,
                events: Vec::new(),
                dp_rank: batch.dp_rank,
            })
        } else {
            batch.clone()
        };
        let _ = self.tx.send(live);
        drop(st);
        Some(batch)
    }

    /// A new incarnation of the engine: the sequence restarts at 0 and the replay buffer is
    /// emptied.
    pub(crate) fn restart(&self) {
        {
            let mut st = self.state();
            st.next_seq = 0;
            st.buffer.clear();
            st.bytes = 0;
        }
        if let Some(q) = &self.pull {
            q.lock().restart();
        }
    }

    /// The buffered batches with a sequence number of `seq` or more, in order.
    pub(crate) fn replay_from(&self, seq: u64) -> Vec<Arc<EventBatch>> {
        let st = self.state();
        let first = st.buffer.partition_point(|(b, _)| b.seq < seq);
        st.buffer.range(first..).map(|(b, _)| b.clone()).collect()
    }

    /// A receiver of the batches published from now on.
    pub(crate) fn subscribe(&self) -> broadcast::Receiver<Arc<EventBatch>> {
        self.tx.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvroute_core::{EngineHash, Namespace, StoredBlocks};

    fn stored(h: u64) -> KvEvent {
        KvEvent::Stored(StoredBlocks {
            parent: None,
            block_hashes: vec![EngineHash(h)],
            token_ids: vec![1, 2],
            block_size: 2,
            namespace: Namespace::default(),
            block_keys: Vec::new(),
        })
    }

    #[test]
    fn batches_are_numbered_buffered_and_broadcast() {
        let hub = EventHub::new(3, EventFormat::Vllm);
        let mut rx = hub.subscribe();
        assert!(
            hub.publish(0.5, &[], &[]).is_none(),
            "empty steps publish nothing"
        );
        for h in 0..5 {
            hub.publish(h as f64, &[stored(h)], &[]).unwrap();
        }
        for want in 0..5 {
            let b = rx.try_recv().unwrap();
            assert_eq!((b.seq, b.dp_rank), (want, Some(0)));
        }
        let seqs = |v: Vec<Arc<EventBatch>>| v.iter().map(|b| b.seq).collect::<Vec<_>>();
        assert_eq!(
            seqs(hub.replay_from(0)),
            vec![2, 3, 4],
            "only the last 3 kept"
        );
        assert_eq!(seqs(hub.replay_from(3)), vec![3, 4]);
        assert_eq!(seqs(hub.replay_from(9)), Vec::<u64>::new());
        hub.restart();
        assert!(hub.replay_from(0).is_empty());
        let b = hub.publish(9.0, &[KvEvent::Cleared], &[]).unwrap();
        assert_eq!((b.seq, &b.events[..]), (0, &[Event::Cleared][..]));
        assert_eq!(seqs(hub.replay_from(0)), vec![0]);
    }

    #[test]
    fn the_replay_buffer_is_bounded_by_bytes_too() {
        // Each batch of one 2-token block is about 64 + 8 + 8 + 160 = 240 bytes: 1,000 bytes
        // hold 4 of them (the newest always stays, whatever its size).
        let hub = EventHub::new(100, EventFormat::Vllm).with_replay_bytes(1_000);
        for h in 0..10 {
            hub.publish(h as f64, &[stored(h)], &[]).unwrap();
        }
        let seqs: Vec<u64> = hub.replay_from(0).iter().map(|b| b.seq).collect();
        assert_eq!(seqs, vec![6, 7, 8, 9]);
        let tiny = EventHub::new(100, EventFormat::Vllm).with_replay_bytes(1);
        tiny.publish(1.0, &[stored(1)], &[]).unwrap();
        tiny.publish(2.0, &[stored(2)], &[]).unwrap();
        assert_eq!(tiny.replay_from(0).len(), 1);
    }

    #[test]
    fn a_zero_replay_buffer_keeps_nothing() {
        let hub = EventHub::new(0, EventFormat::Vllm);
        hub.publish(1.0, &[stored(1)], &[]).unwrap();
        assert!(hub.replay_from(0).is_empty());
    }
}
