//! Fuzzes the NATS event plane's decoders (messages come from the network): an envelope, a
//! replay page or request, a batch payload inside them, a replicas' load message; never a panic, and whatever
//! decodes encodes back to something that decodes the same.
#![no_main]

use kvroute_protocol::plane::{
    batch_of, from_bytes, Envelope, Item, LoadMessage, ReplayPage, ReplayRequest, Snapshot,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(e) = Envelope::decode(data) {
        assert_eq!(Envelope::decode(&e.encode()).ok(), Some(e.clone()));
        if let Item::Batch { seq, payload } = &e.item {
            let _ = batch_of(*seq, payload);
        }
    }
    if let Ok(ReplayPage::Batches { batches, .. }) = from_bytes::<ReplayPage>(data) {
        for b in batches {
            let _ = batch_of(b.seq, &b.payload);
        }
    }
    let _ = from_bytes::<ReplayRequest>(data);
    if let Ok(s) = Snapshot::decode(data) {
        assert_eq!(s.pairs().map(|p| p.count()).ok(), Some(s.blocks.len() / 16));
    }
    if let Ok(m) = LoadMessage::decode(data) {
        assert_eq!(LoadMessage::decode(&m.encode()).ok(), Some(m));
    }
});
