//! Feed items to and from the plane's wire items ([`kvroute_protocol::plane::Item`]).

use kvroute_fleet::feed::FeedItem;
use kvroute_protocol::kv_events::EventFormat;
use kvroute_protocol::plane::{batch_of, batch_payload, Item};
use std::sync::Arc;

/// The wire item of a feed item, a batch's payload in `format`.
pub fn to_wire(item: &FeedItem, format: EventFormat) -> Item {
    match item {
        FeedItem::Batch(b) => Item::Batch {
            seq: b.seq,
            payload: batch_payload(b, format),
        },
        FeedItem::Undecodable(error) => Item::Undecodable {
            error: error.clone(),
        },
        FeedItem::Connected => Item::Connected,
        FeedItem::Disconnected => Item::Disconnected,
        FeedItem::Lost { reason } => Item::Lost {
            reason: reason.clone(),
        },
        FeedItem::Restarted => Item::Restarted,
    }
}

/// The feed item the ingestion reads; a batch whose payload does not decode is
/// [`FeedItem::Undecodable`] (counted; its sequence number is then a gap to replay).
pub fn from_wire(item: Item) -> FeedItem {
    match item {
        Item::Batch { seq, payload } => match batch_of(seq, &payload) {
            Ok(b) => FeedItem::Batch(Arc::new(b)),
            Err(e) => FeedItem::Undecodable(format!("batch {seq}: {e}")),
        },
        Item::Connected => FeedItem::Connected,
        Item::Disconnected => FeedItem::Disconnected,
        Item::Lost { reason } => FeedItem::Lost { reason },
        Item::Restarted => FeedItem::Restarted,
        Item::Undecodable { error } => FeedItem::Undecodable(error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvroute_protocol::kv_events::{Event, EventBatch, Removed};

    #[test]
    fn every_feed_item_comes_back_as_it_went() {
        let b = Arc::new(EventBatch {
            seq: 7,
            ts: 2.5,
            events: vec![Event::Removed(Removed {
                block_hashes: vec![kvroute_core::EngineHash(3)],
                medium: Some("GPU".into()),
                group_idx: Some(0),
            })],
            dp_rank: None,
        });
        let items = [
            FeedItem::Batch(b),
            FeedItem::Connected,
            FeedItem::Disconnected,
            FeedItem::Lost {
                reason: "dropped".into(),
            },
            FeedItem::Restarted,
            FeedItem::Undecodable("bad".into()),
        ];
        for item in items {
            let back = from_wire(to_wire(&item, EventFormat::Vllm));
            assert_eq!(format!("{back:?}"), format!("{item:?}"));
        }
        let bad = from_wire(Item::Batch {
            seq: 3,
            payload: vec![1, 2, 3],
        });
        assert!(matches!(bad, FeedItem::Undecodable(m) if m.contains("batch 3")));
    }
}
