//! Encoding KV events the way vLLM publishes them (map form, tagged by `"type"`), for the
//! simulated worker's PUB socket and its replay answers.

use super::Event;
use kvroute_core::KvEvent;
use serde::Serialize;

#[derive(Serialize)]
#[serde(tag = "type")]
enum Wire<'a> {
    BlockStored {
        block_hashes: Vec<u64>,
        parent_block_hash: Option<u64>,
        token_ids: &'a [u32],
        block_size: u64,
        lora_id: Option<i64>,
        medium: Option<&'a str>,
    },
    BlockRemoved {
        block_hashes: Vec<u64>,
        medium: Option<&'a str>,
    },
    AllBlocksCleared {},
}

impl Event {
    /// The wire event of a core event (None for the in-process `StoredHashed`, which has no
    /// token ids to publish).
    pub fn from_kv_event(e: &KvEvent) -> Option<Event> {
        Some(match e {
            KvEvent::Stored(s) => Event::Stored {
                block_hashes: s.block_hashes.clone(),
                parent: s.parent,
                token_ids: s.token_ids.clone(),
                block_size: s.block_size as u64,
                lora_id: None,
                medium: Some("GPU".into()),
            },
            KvEvent::Removed { block_hashes } => Event::Removed {
                block_hashes: block_hashes.clone(),
                medium: Some("GPU".into()),
            },
            KvEvent::Cleared => Event::Cleared,
            KvEvent::StoredHashed(_) => return None,
        })
    }
}

/// Encodes a payload `[ts, [event, ...], dp_rank]` with events as maps tagged by `"type"`.
/// Unknown events are skipped.
pub fn encode_payload(ts: f64, events: &[Event], dp_rank: Option<i64>) -> Vec<u8> {
    let wire: Vec<Wire<'_>> = events
        .iter()
        .filter_map(|e| {
            Some(match e {
                Event::Stored {
                    block_hashes,
                    parent,
                    token_ids,
                    block_size,
                    lora_id,
                    medium,
                } => Wire::BlockStored {
                    block_hashes: block_hashes.iter().map(|h| h.0).collect(),
                    parent_block_hash: parent.map(|p| p.0),
                    token_ids,
                    block_size: *block_size,
                    lora_id: *lora_id,
                    medium: medium.as_deref(),
                },
                Event::Removed {
                    block_hashes,
                    medium,
                } => Wire::BlockRemoved {
                    block_hashes: block_hashes.iter().map(|h| h.0).collect(),
                    medium: medium.as_deref(),
                },
                Event::Cleared => Wire::AllBlocksCleared {},
                Event::Unknown(_) => return None,
            })
        })
        .collect();
    // Plain data (numbers, strings, vectors) always serialises.
    rmp_serde::to_vec_named(&(ts, wire, dp_rank)).unwrap_or_default()
}

/// The three frames of a message: topic, sequence number (u64 big-endian), payload.
pub fn encode_message(topic: &str, seq: u64, payload: Vec<u8>) -> [Vec<u8>; 3] {
    [
        topic.as_bytes().to_vec(),
        seq.to_be_bytes().to_vec(),
        payload,
    ]
}
