//! Golden messages assembled byte by byte from the documented format, in both event forms.

use super::*;
use kvroute_core::Namespace;
use proptest::prelude::*;

/// A msgpack fixstr (under 32 bytes).
fn s(text: &str) -> Vec<u8> {
    assert!(text.len() < 32);
    [&[0xa0 | text.len() as u8][..], text.as_bytes()].concat()
}

/// `[1.5, [BlockStored, BlockRemoved, AllBlocksCleared], 0]` with events as maps.
fn map_form() -> Vec<u8> {
    [
        &[0x93, 0xcb][..],
        &1.5f64.to_be_bytes(),
        &[0x93],
        // BlockStored: 8 entries, one of them unknown.
        &[0x88],
        &s("type"),
        &s("BlockStored"),
        &s("block_hashes"),
        &[0x92, 0x01, 0xfe], // [1, -2]
        &[0xd9, 17],
        b"parent_block_hash",
        &[0xc0],
        &s("token_ids"),
        &[0x94, 1, 2, 3, 4],
        &s("block_size"),
        &[0x02],
        &s("lora_id"),
        &[0xc0],
        &s("medium"),
        &s("GPU"),
        &s("extra"),
        &[0x91, 0x07], // [7], ignored
        // BlockRemoved, its type last.
        &[0x83],
        &s("block_hashes"),
        &[0x91, 0xcf],
        &u64::MAX.to_be_bytes(),
        &s("medium"),
        &s("GPU"),
        &s("type"),
        &s("BlockRemoved"),
        // AllBlocksCleared.
        &[0x81],
        &s("type"),
        &s("AllBlocksCleared"),
        // dp_rank
        &[0x00],
    ]
    .concat()
}

/// The same batch with positional events (no dp_rank, trailing defaults omitted).
fn array_form() -> Vec<u8> {
    [
        &[0x92, 0xcb][..],
        &1.5f64.to_be_bytes(),
        &[0x93],
        &[0x97],
        &s("BlockStored"),
        &[0x92, 0x01, 0xfe],
        &[0xc0],
        &[0x94, 1, 2, 3, 4],
        &[0x02],
        &[0xc0],
        &s("GPU"),
        &[0x93],
        &s("BlockRemoved"),
        &[0x91, 0xcf],
        &u64::MAX.to_be_bytes(),
        &s("GPU"),
        &[0x91],
        &s("AllBlocksCleared"),
    ]
    .concat()
}

fn expected() -> Vec<Event> {
    vec![
        Event::Stored(Stored {
            block_hashes: vec![EngineHash(1), EngineHash(u64::MAX - 1)],
            parent: None,
            token_ids: vec![1, 2, 3, 4],
            block_size: 2,
            medium: Some("GPU".into()),
            ..Stored::default()
        }),
        Event::Removed(Removed {
            block_hashes: vec![EngineHash(u64::MAX)],
            medium: Some("GPU".into()),
            group_idx: None,
        }),
        Event::Cleared,
    ]
}

#[test]
fn both_forms_decode_to_the_same_events() {
    let seq = 41u64.to_be_bytes();
    let m = decode_message(&[b"kv", &seq, &map_form()]).unwrap();
    assert_eq!((m.seq, m.ts, m.dp_rank), (41, 1.5, Some(0)));
    assert_eq!(m.events, expected());
    let a = decode_message(&[b"", &seq, &array_form()]).unwrap();
    assert_eq!((a.seq, a.dp_rank), (41, None));
    assert_eq!(a.events, expected());
    assert!(a.events.iter().all(Event::is_device));
}

#[test]
fn events_become_core_events() {
    let ns = Namespace::default();
    let core: Vec<_> = expected().iter().filter_map(Event::to_kv_event).collect();
    assert_eq!(
        core[0],
        KvEvent::Stored(StoredBlocks {
            parent: None,
            block_hashes: vec![EngineHash(1), EngineHash(u64::MAX - 1)],
            token_ids: vec![1, 2, 3, 4],
            block_size: 2,
            namespace: ns,
            block_keys: Vec::new(),
        })
    );
    assert_eq!(core[2], KvEvent::Cleared);
    assert_eq!(Event::Unknown("BlockMoved".into()).to_kv_event(), None);
}

#[test]
fn unknown_types_parents_bytes_hashes_and_other_media() {
    // [0, [["BlockMoved", 1, 2], {"type": "BlockStored", "block_hashes": [bin 3 bytes],
    //   "parent_block_hash": 9, "token_ids": [5], "block_size": 1, "medium": "CPU"}]]
    let payload = [
        &[0x92, 0x00, 0x92][..],
        &[0x93],
        &s("BlockMoved"),
        &[0x01, 0x02],
        &[0x86],
        &s("type"),
        &s("BlockStored"),
        &s("block_hashes"),
        &[0x91, 0xc4, 3, 0xaa, 0xbb, 0xcc],
        &[0xd9, 17],
        b"parent_block_hash",
        &[0x09],
        &s("token_ids"),
        &[0x91, 0x05],
        &s("block_size"),
        &[0x01],
        &s("medium"),
        &s("CPU"),
    ]
    .concat();
    let (ts, events, dp) = decode_payload(&payload).unwrap();
    assert_eq!((ts, dp), (0.0, None));
    assert_eq!(events[0], Event::Unknown("BlockMoved".into()));
    let Event::Stored(Stored {
        block_hashes,
        parent,
        medium,
        ..
    }) = &events[1]
    else {
        panic!("{:?}", events[1]);
    };
    assert_eq!(
        block_hashes,
        &[EngineHash(xxhash_rust::xxh3::xxh3_64(&[0xaa, 0xbb, 0xcc]))]
    );
    assert_eq!(*parent, Some(EngineHash(9)));
    assert_eq!(medium.as_deref(), Some("CPU"));
    assert!(!events[1].is_device());
}

#[test]
fn bad_messages_are_errors() {
    let seq = 1u64.to_be_bytes();
    assert_eq!(decode_message(&[b"kv", &seq]), Err(DecodeError::Frames(2)));
    assert_eq!(
        decode_message(&[b"kv", &[0, 1], &map_form()]),
        Err(DecodeError::Sequence(2))
    );
    // A stored event without its token ids; a token id beyond u32; a map without a type;
    // not an array at all.
    let no_tokens = [
        &[0x92, 0x00, 0x91, 0x93][..],
        &s("BlockStored"),
        &[0x90, 0xc0],
    ]
    .concat();
    let big_token = [
        &[0x92, 0x00, 0x91, 0x95][..],
        &s("BlockStored"),
        &[0x90, 0xc0, 0x91, 0xcf, 0, 0, 0, 1, 0, 0, 0, 0, 0x01],
    ]
    .concat();
    let no_type = [&[0x92, 0x00, 0x91, 0x81][..], &s("medium"), &s("GPU")].concat();
    for bad in [no_tokens, big_token, no_type, vec![0x07]] {
        let r = decode_payload(&bad);
        assert!(matches!(r, Err(DecodeError::Payload(_))), "{r:?}");
    }
    // Every truncation of a good payload fails cleanly.
    let good = map_form();
    for cut in 0..good.len() {
        assert!(decode_payload(&good[..cut]).is_err(), "cut at {cut}");
    }
}

#[test]
fn a_lying_length_prefix_reserves_nothing_big() {
    // An array claiming 2^32 - 1 events, with none there.
    let payload = [&[0x92, 0x00, 0xdd][..], &u32::MAX.to_be_bytes()].concat();
    assert!(decode_payload(&payload).is_err());
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        let _ = decode_payload(&bytes);
    }

    #[test]
    fn corrupted_golden_messages_never_panic(at in 0usize..120, byte in any::<u8>()) {
        for mut m in [map_form(), array_form()] {
            let i = at % m.len();
            m[i] = byte;
            let _ = decode_payload(&m);
        }
    }
}

proptest! {
    #[test]
    fn encoded_events_decode_to_themselves(
        seq in any::<u64>(),
        ts in 0.0f64..1e9,
        chains in proptest::collection::vec(
            (proptest::collection::vec(any::<u64>(), 0..4), proptest::option::of(any::<u64>()), 0usize..3),
            0..5,
        ),
    ) {
        let mut events = Vec::new();
        for (i, (hashes, parent, kind)) in chains.into_iter().enumerate() {
            let block_hashes: Vec<EngineHash> = hashes.into_iter().map(EngineHash).collect();
            events.push(match kind {
                0 => Event::Stored(Stored {
                    token_ids: (0..block_hashes.len() as u32 * 4).collect(),
                    block_hashes,
                    parent: parent.map(EngineHash),
                    block_size: 4,
                    lora_id: (i % 2 == 1).then_some(i as i64),
                    medium: Some("GPU".into()),
                    ..Stored::default()
                }),
                1 => Event::Removed(Removed { block_hashes, medium: None, group_idx: None }),
                _ => Event::Cleared,
            });
        }
        let frames = encode_message("kv", seq, encode_payload(EventFormat::Vllm, ts, &events, Some(0)));
        let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
        let batch = decode_message(&refs).unwrap();
        prop_assert_eq!(batch.seq, seq);
        prop_assert_eq!(batch.ts, ts);
        prop_assert_eq!(batch.dp_rank, Some(0));
        prop_assert_eq!(batch.events, events);
    }
}

#[test]
fn core_events_go_out_and_come_back() {
    let stored = KvEvent::Stored(StoredBlocks {
        parent: None,
        block_hashes: vec![EngineHash(u64::MAX), EngineHash(2)],
        token_ids: vec![1, 2, 3, 4],
        block_size: 2,
        namespace: Namespace::default(),
        block_keys: Vec::new(),
    });
    let removed = KvEvent::Removed {
        block_hashes: vec![EngineHash(2)],
    };
    let wire: Vec<Event> = [&stored, &removed, &KvEvent::Cleared]
        .into_iter()
        .filter_map(|e| Event::from_kv_event(e, None, None))
        .collect();
    let (_, back, rank) =
        decode_payload(&encode_payload(EventFormat::Vllm, 1.5, &wire, None)).unwrap();
    assert_eq!(rank, None);
    let core: Vec<KvEvent> = back.iter().filter_map(Event::to_kv_event).collect();
    assert_eq!(core, vec![stored, removed, KvEvent::Cleared]);
    assert!(back.iter().all(Event::is_device));
}

#[test]
fn a_payload_may_be_a_map() {
    #[derive(serde::Serialize)]
    struct MapPayload {
        ts: f64,
        events: Vec<(&'static str, Vec<u64>, Option<u64>)>,
        data_parallel_rank: Option<i64>,
        extra: u8,
    }
    let p = MapPayload {
        ts: 3.5,
        events: vec![("BlockRemoved", vec![7, 8], None)],
        data_parallel_rank: Some(2),
        extra: 1,
    };
    let bytes = rmp_serde::to_vec_named(&p).unwrap();
    let (ts, events, rank) = decode_payload(&bytes).unwrap();
    assert_eq!((ts, rank), (3.5, Some(2)));
    assert_eq!(
        events,
        vec![Event::Removed(Removed {
            block_hashes: vec![EngineHash(7), EngineHash(8)],
            medium: None,
            group_idx: None,
        })]
    );
    let no_events =
        rmp_serde::to_vec_named(&std::collections::BTreeMap::from([("ts", 1.0)])).unwrap();
    assert!(decode_payload(&no_events).is_err());
}
