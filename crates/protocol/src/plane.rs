//! The NATS event plane's wire format, in MessagePack: an [`Envelope`] per feed item a relay
//! saw (a batch with the engine's sequence number and payload, connects, disconnects), the
//! replay service's request and answer pages, and worker names as subject tokens. Decoding
//! never panics on outside bytes (fuzz target `plane_envelope`).

use crate::kv_events::{decode_payload, encode_payload, EventBatch, EventFormat};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// A worker name as one subject token: ASCII letters, digits and `-` stay, every other byte
/// becomes `_` and two hex digits (`127.0.0.1:8001` -> `127_2e0_2e0_2e1_3a8001`), so no name
/// can add tokens or wildcards and two names never share a subject.
pub fn subject_token(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 8);
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || b == b'-' {
            out.push(b as char);
        } else {
            out.push_str(&format!("_{b:02x}"));
        }
    }
    if out.is_empty() {
        out.push('_');
    }
    out
}

/// The envelope's format version; a relay of another version is refused, not guessed at.
pub const VERSION: u8 = 1;

/// One feed item of one worker, as a relay publishes it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Envelope {
    /// [`VERSION`].
    pub v: u8,
    /// The worker's name (as the gateways configure it).
    pub worker: String,
    /// The relay's incarnation (a new one each time a relay starts).
    pub relay: u64,
    /// The message's number within the relay's incarnation, from 0, consecutive.
    pub n: u64,
    /// What the relay saw.
    pub item: Item,
}

/// A feed item on the wire.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Item {
    /// A batch: the engine's sequence number and its payload (`[ts, events, dp_rank]`, in
    /// the engine's own wire form).
    Batch {
        /// The engine's sequence number.
        seq: u64,
        /// The payload.
        #[serde(with = "serde_bytes")]
        payload: Vec<u8>,
    },
    /// The engine's publisher connected.
    Connected,
    /// The engine's publisher went away.
    Disconnected,
    /// Events were lost for good.
    Lost {
        /// Why.
        reason: String,
    },
    /// The engine restarted.
    Restarted,
    /// A message from the engine did not decode.
    Undecodable {
        /// The decoder's error.
        error: String,
    },
}

impl Envelope {
    /// The message's dedup id (`Nats-Msg-Id`): the same for a publish retried, different
    /// for every other message of the stream.
    pub fn dedup_id(&self) -> String {
        format!(
            "{}-{:016x}-{}",
            subject_token(&self.worker),
            self.relay,
            self.n
        )
    }

    /// MessagePack bytes.
    pub fn encode(&self) -> Vec<u8> {
        // Plain data (numbers, strings, bytes) always serialises.
        rmp_serde::to_vec_named(self).unwrap_or_default()
    }

    /// Reads an envelope.
    pub fn decode(bytes: &[u8]) -> Result<Self, String> {
        let e: Self = rmp_serde::from_slice(bytes).map_err(|e| format!("envelope: {e}"))?;
        if e.v != VERSION {
            return Err(format!(
                "envelope version {} (this gateway reads {VERSION})",
                e.v
            ));
        }
        Ok(e)
    }
}

/// A batch's payload in `format`.
pub fn batch_payload(b: &EventBatch, format: EventFormat) -> Vec<u8> {
    encode_payload(format, b.ts, &b.events, b.dp_rank)
}

/// A batch from its sequence number and payload.
pub fn batch_of(seq: u64, payload: &[u8]) -> Result<EventBatch, String> {
    let (ts, events, dp_rank) = decode_payload(payload).map_err(|e| e.to_string())?;
    Ok(EventBatch {
        seq,
        ts,
        events,
        dp_rank,
    })
}

/// A replay request: batches from `from` on.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReplayRequest {
    /// The first sequence number wanted.
    pub from: u64,
}

/// One page of a replay answer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReplayPage {
    /// Batches in order (sequence number, payload); `more` when the engine holds batches
    /// past the last one (ask again from the last + 1).
    Batches {
        /// The batches.
        batches: Vec<PageBatch>,
        /// Whether more follow.
        more: bool,
    },
    /// The engine's replay service failed or has none.
    Error {
        /// Why.
        error: String,
    },
}

/// A batch in a replay page.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PageBatch {
    /// Its sequence number.
    pub seq: u64,
    /// Its payload.
    #[serde(with = "serde_bytes")]
    pub payload: Vec<u8>,
}

/// MessagePack bytes of a request or page.
pub fn to_bytes<T: Serialize>(v: &T) -> Vec<u8> {
    rmp_serde::to_vec_named(v).unwrap_or_default()
}

/// Reads a request or page.
pub fn from_bytes<'a, T: Deserialize<'a>>(b: &'a [u8]) -> Result<T, String> {
    rmp_serde::from_slice(b).map_err(|e| e.to_string())
}

/// Cuts a replay answer into a page of at most `page_bytes` (always at least one batch, so a
/// replay makes progress), with `more` set when batches are left.
pub fn page_of(batches: &[Arc<EventBatch>], format: EventFormat, page_bytes: usize) -> ReplayPage {
    let mut out = Vec::new();
    let mut size = 0usize;
    for b in batches {
        let payload = batch_payload(b, format);
        if !out.is_empty() && size + payload.len() + 16 > page_bytes {
            return ReplayPage::Batches {
                batches: out,
                more: true,
            };
        }
        size += payload.len() + 16;
        out.push(PageBatch {
            seq: b.seq,
            payload,
        });
    }
    ReplayPage::Batches {
        batches: out,
        more: false,
    }
}

/// A router replica's bookings, shared with its peers (core NATS, not stored): the
/// operations since its last message, and now and then the list of its requests in flight
/// (which releases what a lost finish left booked on the peers).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LoadMessage {
    /// [`VERSION`].
    pub v: u8,
    /// The replica (a new id each time a gateway starts).
    pub replica: u64,
    /// The message's number within the replica's life, from 0, consecutive.
    pub n: u64,
    /// Bookings in the order they happened.
    pub ops: Vec<LoadOp>,
    /// The replica's requests in flight, when listed.
    pub inflight: Option<Vec<u64>>,
    /// When it was sent, in nanoseconds since the Unix epoch (the sender's clock): the
    /// receivers measure how late bookings reach them.
    #[serde(default)]
    pub sent_ns: u64,
}

/// One booking operation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LoadOp {
    /// A request was sent to a worker.
    Dispatch {
        /// The replica's name for the request.
        req: u64,
        /// The worker's name.
        worker: String,
        /// Prompt tokens.
        prompt_tokens: u64,
        /// Tokens expected cached there.
        cached_tokens: u64,
        /// Sequence hashes of the prompt's full blocks.
        blocks: Vec<u64>,
    },
    /// Its first token arrived.
    FirstToken {
        /// The request.
        req: u64,
    },
    /// It finished (completed, failed, cancelled).
    Finish {
        /// The request.
        req: u64,
        /// Output tokens, when counted.
        output_tokens: Option<u64>,
    },
}

impl LoadMessage {
    /// MessagePack bytes.
    pub fn encode(&self) -> Vec<u8> {
        to_bytes(self)
    }

    /// Reads a message.
    pub fn decode(bytes: &[u8]) -> Result<Self, String> {
        let m: Self = from_bytes(bytes).map_err(|e| format!("load message: {e}"))?;
        if m.v != VERSION {
            return Err(format!(
                "load message version {} (this gateway reads {VERSION})",
                m.v
            ));
        }
        Ok(m)
    }
}

/// A worker's index as a gateway held it after applying batch `seq` (the event plane's
/// object store keeps the latest per worker): a replica that starts loads it, then asks the
/// relay for the batches after `seq`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    /// [`VERSION`].
    pub v: u8,
    /// The worker's name.
    pub worker: String,
    /// The engine's sequence number of the batch applied last.
    pub seq: u64,
    /// That batch's content digest (the gateway's `Mark`).
    pub digest: u64,
    /// When it was taken, nanoseconds since the Unix epoch.
    pub taken_ns: u64,
    /// The blocks: 16 bytes each, the engine's hash then the router's sequence hash, little
    /// endian.
    #[serde(with = "serde_bytes")]
    pub blocks: Vec<u8>,
}

impl Snapshot {
    /// Packs `(engine hash, sequence hash)` pairs.
    pub fn pack(pairs: impl ExactSizeIterator<Item = (u64, u64)>) -> Vec<u8> {
        let mut out = Vec::with_capacity(pairs.len() * 16);
        for (a, b) in pairs {
            out.extend_from_slice(&a.to_le_bytes());
            out.extend_from_slice(&b.to_le_bytes());
        }
        out
    }

    /// The pairs; an error when the bytes are not whole pairs.
    pub fn pairs(&self) -> Result<impl Iterator<Item = (u64, u64)> + '_, String> {
        if !self.blocks.len().is_multiple_of(16) {
            return Err(format!(
                "snapshot of {} bytes: not 16-byte pairs",
                self.blocks.len()
            ));
        }
        Ok(self.blocks.chunks_exact(16).map(|c| {
            let (a, b) = c.split_at(8);
            (
                u64::from_le_bytes(a.try_into().unwrap_or_default()),
                u64::from_le_bytes(b.try_into().unwrap_or_default()),
            )
        }))
    }

    /// Reads a snapshot.
    pub fn decode(bytes: &[u8]) -> Result<Self, String> {
        let s: Self = from_bytes(bytes).map_err(|e| format!("snapshot: {e}"))?;
        if s.v != VERSION {
            return Err(format!(
                "snapshot version {} (this gateway reads {VERSION})",
                s.v
            ));
        }
        let _ = s.pairs()?;
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv_events::{Event, Removed};

    fn batch(seq: u64, hashes: usize) -> Arc<EventBatch> {
        Arc::new(EventBatch {
            seq,
            ts: 1.5,
            events: vec![Event::Removed(Removed {
                block_hashes: (0..hashes as u64).map(kvroute_core::EngineHash).collect(),
                medium: Some("GPU".into()),
                group_idx: Some(0),
            })],
            dp_rank: Some(0),
        })
    }

    #[test]
    fn worker_names_become_single_tokens_that_never_collide() {
        assert_eq!(subject_token("w-1"), "w-1");
        assert_eq!(subject_token("127.0.0.1:8001"), "127_2e0_2e0_2e1_3a8001");
        assert_eq!(subject_token("a.b"), "a_2eb");
        assert_eq!(subject_token("a_2eb"), "a_5f2eb");
        assert_eq!(subject_token("a>*"), "a_3e_2a");
        assert_eq!(subject_token(""), "_");
    }

    #[test]
    fn every_item_crosses_the_wire_unchanged() {
        let items = [
            Item::Batch {
                seq: 7,
                payload: batch_payload(&batch(7, 3), EventFormat::Vllm),
            },
            Item::Connected,
            Item::Disconnected,
            Item::Lost {
                reason: "dropped".into(),
            },
            Item::Restarted,
            Item::Undecodable {
                error: "bad".into(),
            },
        ];
        for (n, item) in items.into_iter().enumerate() {
            let e = Envelope {
                v: VERSION,
                worker: "w.1".into(),
                relay: 42,
                n: n as u64,
                item,
            };
            assert_eq!(Envelope::decode(&e.encode()).unwrap(), e);
        }
        // A batch in SGLang's form (which has no group index) comes back as it was read.
        let mut b = (*batch(9, 4)).clone();
        if let Event::Removed(r) = &mut b.events[0] {
            r.group_idx = None;
        }
        assert_eq!(
            batch_of(9, &batch_payload(&b, EventFormat::Sglang)).unwrap(),
            b
        );
    }

    #[test]
    fn bad_bytes_and_other_versions_are_errors_not_panics() {
        assert!(Envelope::decode(b"").is_err());
        assert!(Envelope::decode(&[0xc1, 0xff, 0x00]).is_err());
        let e = Envelope {
            v: VERSION + 1,
            worker: "w".into(),
            relay: 1,
            n: 0,
            item: Item::Connected,
        };
        assert!(Envelope::decode(&e.encode())
            .unwrap_err()
            .contains("version"));
        assert!(batch_of(3, &[1, 2, 3]).is_err());
        assert!(from_bytes::<ReplayPage>(b"\x93").is_err());
    }

    #[test]
    fn dedup_ids_differ_per_worker_relay_and_number() {
        let e = |w: &str, relay, n| Envelope {
            v: VERSION,
            worker: w.into(),
            relay,
            n,
            item: Item::Connected,
        };
        let ids: std::collections::BTreeSet<String> =
            [e("a", 1, 0), e("a", 1, 1), e("a", 2, 0), e("b", 1, 0)]
                .iter()
                .map(Envelope::dedup_id)
                .collect();
        assert_eq!(ids.len(), 4);
        assert_eq!(e("a", 1, 5).dedup_id(), e("a", 1, 5).dedup_id());
    }

    #[test]
    fn replay_pages_fit_their_bound_and_always_progress() {
        let batches: Vec<_> = (0..10).map(|s| batch(s, 100)).collect();
        let one = batch_payload(&batches[0], EventFormat::Vllm).len();
        let page = |n: usize, bytes: usize| match page_of(&batches[..n], EventFormat::Vllm, bytes) {
            ReplayPage::Batches { batches, more } => (batches, more),
            ReplayPage::Error { error } => panic!("{error}"),
        };
        let (got, more) = page(10, 3 * (one + 16));
        assert_eq!((got.len(), more, got[2].seq), (3, true, 2));
        // A page smaller than one batch still carries one.
        let (got, more) = page(2, 8);
        assert_eq!((got.len(), more), (1, true));
        let (got, more) = page(10, 1 << 20);
        assert_eq!((got.len(), more), (10, false));
        let back: ReplayPage =
            from_bytes(&to_bytes(&ReplayPage::Batches { batches: got, more })).unwrap();
        let ReplayPage::Batches { batches: got, .. } = back else {
            panic!("a page");
        };
        assert_eq!(batch_of(got[4].seq, &got[4].payload).unwrap(), *batches[4]);
    }

    #[test]
    fn load_messages_cross_the_wire_unchanged() {
        let m = LoadMessage {
            v: VERSION,
            replica: 3,
            n: 9,
            ops: vec![
                LoadOp::Dispatch {
                    req: 1,
                    worker: "w.1".into(),
                    prompt_tokens: 40,
                    cached_tokens: 16,
                    blocks: vec![u64::MAX, 7],
                },
                LoadOp::FirstToken { req: 1 },
                LoadOp::Finish {
                    req: 1,
                    output_tokens: Some(5),
                },
            ],
            inflight: Some(vec![2, 3]),
            sent_ns: 1_790_000_000_000_000_000,
        };
        assert_eq!(LoadMessage::decode(&m.encode()).unwrap(), m);
        assert!(LoadMessage::decode(b"\x01").is_err());
        let other = LoadMessage { v: 0, ..m };
        assert!(LoadMessage::decode(&other.encode())
            .unwrap_err()
            .contains("version"));
    }

    #[test]
    fn snapshots_cross_the_wire_and_refuse_torn_pairs() {
        let pairs = vec![(1u64, u64::MAX), (7, 9)];
        let s = Snapshot {
            v: VERSION,
            worker: "w".into(),
            seq: 41,
            digest: 5,
            taken_ns: 1,
            blocks: Snapshot::pack(pairs.clone().into_iter()),
        };
        let back = Snapshot::decode(&to_bytes(&s)).unwrap();
        assert_eq!(back.pairs().unwrap().collect::<Vec<_>>(), pairs);
        let torn = Snapshot {
            blocks: vec![0; 17],
            ..s.clone()
        };
        assert!(Snapshot::decode(&to_bytes(&torn)).is_err());
        assert!(Snapshot::decode(b"\x00").is_err());
    }
}
