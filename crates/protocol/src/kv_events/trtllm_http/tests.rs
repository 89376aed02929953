//! Tests of the TensorRT-LLM pull API decoder and the gap-detecting puller.

use super::*;
use kvroute_core::Namespace;
use proptest::prelude::*;

/// The research example: constructed from the documented shape of TensorRT-LLM's
/// `KVCacheEventSerializer` (`tensorrt_llm/_utils.py`), V1 manager, attention DP on,
/// 4 tokens per block. Not captured from a running engine.
const EXAMPLE: &str = r#"[
{"event_id":0,"data":{"type":"created","num_blocks_per_cache_level":[4096,0]},"window_size":4096,"attention_dp_rank":0},
{"event_id":1,"data":{"type":"stored","parent_hash":null,"blocks":[
{"type":"stored_block","block_hash":9622824665191806685,"tokens":[{"type":"unique_token","token_id":1,"token_extra_id":0},{"type":"unique_token","token_id":2,"token_extra_id":0},{"type":"unique_token","token_id":3,"token_extra_id":0},{"type":"unique_token","token_id":4,"token_extra_id":0}],"cache_salt":null,"cache_level":0,"priority":35,"mm_keys":[]},
{"type":"stored_block","block_hash":1311768467463790320,"tokens":[{"type":"unique_token","token_id":5,"token_extra_id":0},{"type":"unique_token","token_id":6,"token_extra_id":0},{"type":"unique_token","token_id":7,"token_extra_id":0},{"type":"unique_token","token_id":8,"token_extra_id":0}],"cache_salt":null,"cache_level":0,"priority":35,"mm_keys":[]}]},"window_size":4096,"attention_dp_rank":0},
{"event_id":2,"data":{"type":"stored","parent_hash":1311768467463790320,"blocks":[
{"type":"stored_block","block_hash":17275492310112893437,"tokens":[{"type":"unique_token","token_id":9,"token_extra_id":0},{"type":"unique_token","token_id":10,"token_extra_id":0},{"type":"unique_token","token_id":11,"token_extra_id":0},{"type":"unique_token","token_id":12,"token_extra_id":0}],"cache_salt":null,"cache_level":0,"priority":35,"mm_keys":[]}]},"window_size":4096,"attention_dp_rank":0},
{"event_id":3,"data":{"type":"updated","block_hash":17275492310112893437,"cache_level":{"type":"event_diff","new_value":1,"old_value":0},"priority":null},"window_size":4096,"attention_dp_rank":0},
{"event_id":4,"data":{"type":"removed","block_hashes":[17275492310112893437]},"window_size":4096,"attention_dp_rank":0}
]"#;

const H1: u64 = 9622824665191806685;
const H2: u64 = 1311768467463790320;
const H3: u64 = 17275492310112893437;

fn ev(event_id: u64, data: PulledData) -> PulledEvent {
    let window_size = Some(4096);
    PulledEvent {
        event_id,
        rank: 0,
        window_size,
        data,
    }
}

fn blk(hash: u64, n: u32) -> PulledBlock {
    let (hash, tokens, mm_keys) = (EngineHash(hash), (0..n).collect(), vec![]);
    PulledBlock {
        hash,
        tokens,
        cache_level: 0,
        cache_salt: None,
        mm_keys,
        lora_id: None,
    }
}

fn created(id: u64, host_blocks: u64) -> PulledEvent {
    ev(
        id,
        PulledData::Created {
            blocks_per_level: vec![100, host_blocks],
        },
    )
}

/// A store of full blocks (4 tokens) after `parent` (0: the root).
fn stored(id: u64, parent: u64, hashes: &[u64]) -> PulledEvent {
    stored_blocks(id, parent, hashes.iter().map(|&h| blk(h, 4)).collect())
}

fn stored_blocks(id: u64, parent: u64, blocks: Vec<PulledBlock>) -> PulledEvent {
    let parent = (parent != 0).then_some(EngineHash(parent));
    ev(id, PulledData::Stored { parent, blocks })
}

fn removed(id: u64, hashes: &[u64]) -> PulledEvent {
    let block_hashes = hashes.iter().copied().map(EngineHash).collect();
    ev(id, PulledData::Removed { block_hashes })
}

fn updated(id: u64, hash: u64, cache_level: Option<(i64, i64)>) -> PulledEvent {
    ev(
        id,
        PulledData::Updated {
            block_hash: EngineHash(hash),
            cache_level,
        },
    )
}

fn windowed(window: Option<u64>, mut e: PulledEvent) -> PulledEvent {
    e.window_size = window;
    e
}

/// The events in short: `+GPU[1,2]<-5` (stored after 5), `-CPU[3]`, `clear`, `?tag`.
fn show(p: &Pulled) -> String {
    let hs = |v: &[EngineHash]| v.iter().map(|h| h.0.to_string()).collect::<Vec<_>>();
    let medium = |m: &Option<String>| m.clone().unwrap_or_default();
    let one = |e: &Event| match e {
        Event::Stored(s) => {
            let parent = s.parent.map(|p| format!("<-{}", p.0)).unwrap_or_default();
            format!(
                "+{}[{}]{parent}",
                medium(&s.medium),
                hs(&s.block_hashes).join(",")
            )
        }
        Event::Removed(r) => {
            format!("-{}[{}]", medium(&r.medium), hs(&r.block_hashes).join(","))
        }
        Event::Cleared => "clear".into(),
        Event::Unknown(tag) => format!("?{tag}"),
    };
    p.events.iter().map(one).collect::<Vec<_>>().join(" ")
}

#[test]
fn decodes_the_research_example() {
    let events = decode(EXAMPLE.as_bytes()).expect("the example decodes");
    assert_eq!(events.len(), 5);
    assert!(events
        .iter()
        .all(|e| e.rank == 0 && e.window_size == Some(4096)));
    assert_eq!(
        events[0].data,
        PulledData::Created {
            blocks_per_level: vec![4096, 0]
        }
    );
    let PulledData::Stored {
        parent: None,
        blocks,
    } = &events[1].data
    else {
        panic!()
    };
    assert_eq!(
        (blocks[0].hash, &blocks[0].tokens[..]),
        (EngineHash(H1), &[1, 2, 3, 4][..])
    );
    assert!(blocks
        .iter()
        .all(|b| b.cache_level == 0 && b.mm_keys.is_empty()));
    assert_eq!(events[3].data, updated(3, H3, Some((0, 1))).data);
    let p = Puller::new(4).accept(events);
    assert_eq!((p.restarted, p.gap, p.ignored), (false, None, 0));
    // Stored twice, offloaded (it leaves the device), then evicted from the host.
    assert_eq!(
        show(&p),
        format!("+GPU[{H1},{H2}] +GPU[{H3}]<-{H2} -GPU[{H3}] -CPU[{H3}]")
    );
    let Event::Stored(s) = &p.events[0] else {
        panic!()
    };
    assert_eq!((s.token_ids.clone(), s.block_size), ((1..=8).collect(), 4));
}

#[test]
fn hashes_may_be_unsigned_signed_or_strings() {
    let sha = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
    let body = format!(
        r#"[{{"event_id":0,"window_size":8,"hash_algo":"v2_sha256","layer_group_id":1,
        "data":{{"type":"removed","block_hashes":
        [18446744073709551615,-2,"ff","0123456789ABCDEF","{sha}","zz","+1",""]}}}},
        {{"event_id":1,"data":{{"type":"stored","parent_hash":"{sha}","blocks":[]}}}}]"#
    );
    let events = decode(body.as_bytes()).expect("decodes");
    let xx = |s: &str| xxhash_rust::xxh3::xxh3_64(s.as_bytes());
    let want = [
        u64::MAX,
        u64::MAX - 1,
        0xff,
        0x0123_4567_89ab_cdef,
        xx(sha),
        xx("zz"),
    ];
    let want = [&want[..], &[xx("+1"), xx("")]].concat();
    let block_hashes = want.into_iter().map(EngineHash).collect();
    assert_eq!(events[0].data, PulledData::Removed { block_hashes });
    assert_eq!((events[1].rank, events[1].window_size), (0, None));
    let parent = Some(EngineHash(xx(sha)));
    assert_eq!(
        events[1].data,
        PulledData::Stored {
            parent,
            blocks: vec![]
        }
    );
}

#[test]
fn bad_answers_are_errors_not_panics() {
    let ev = |data: &str| format!(r#"[{{"event_id":3,"data":{data}}}]"#);
    let block = |b: &str| {
        ev(&format!(
            r#"{{"type":"stored","parent_hash":null,"blocks":[{b}]}}"#
        ))
    };
    let token = |id: &str| {
        block(&format!(
            r#"{{"block_hash":1,"tokens":[{{"token_id":{id}}}]}}"#
        ))
    };
    let removed = |hashes: &str| ev(&format!(r#"{{"type":"removed","block_hashes":{hashes}}}"#));
    for bad in [
        "".into(),
        "{}".into(),
        "[1]".into(),
        r#"[{"data":{"type":"removed","block_hashes":[]}}]"#.into(),
        r#"[{"event_id":-1,"data":{"type":"removed","block_hashes":[]}}]"#.into(),
        r#"[{"event_id":0,"window_size":"8","data":{"type":"removed","block_hashes":[]}}]"#.into(),
        ev("[]"),
        ev(r#"{"type":7}"#),
        ev(r#"{"type":"removed"}"#),
        ev(r#"{"type":"updated","block_hash":true}"#),
        removed("[1.5]"),
        removed("[18446744073709551616]"),
        removed(r#"{"a":1}"#),
        block(r#"{"block_hash":1}"#),
        token("-1"),
        token(r#""7""#),
        token("4294967296"),
    ] {
        assert!(decode(bad.as_bytes()).is_err(), "{bad}");
    }
    let e = decode(token("4294967296").as_bytes()).unwrap_err();
    assert_eq!(
        e,
        HttpDecodeError::TokenId {
            event_id: 3,
            token_id: 1 << 32
        }
    );
    assert_eq!(
        e.to_string(),
        "KV cache event 3: token id 4294967296 does not fit in 32 bits"
    );
    assert!(decode(token("4294967295").as_bytes()).is_ok());
}

#[test]
fn unknown_types_and_keys_are_tolerated() {
    let body = r#"[{"event_id":0,"new":{"x":[1]},"data":{"type":"moved","cache_level":"x"}}]"#;
    let events = decode(body.as_bytes()).expect("decodes");
    assert_eq!(events[0].data, PulledData::Unknown("moved".into()));
    let p = Puller::new(4).accept(events);
    assert_eq!((show(&p).as_str(), p.ignored), ("?moved", 0));
}

#[test]
fn a_gap_clears_and_reports_the_first() {
    let mut puller = Puller::new(4);
    puller.accept(vec![created(0, 0), stored(1, 0, &[1])]);
    let p = puller.accept(vec![
        stored(2, 1, &[2]),
        stored(5, 0, &[5]),
        stored(9, 0, &[9]),
    ]);
    assert_eq!(
        (p.gap, p.restarted, show(&p).as_str()),
        (Some((3, 5)), false, "clear +GPU[9]")
    );
    // A rank's first event need not be 0: there is nothing to clear yet.
    let p = Puller::new(4).accept(vec![stored(7, 0, &[7])]);
    assert_eq!((p.gap, show(&p).as_str()), (None, "+GPU[7]"));
}

#[test]
fn event_id_zero_again_is_a_restart() {
    let mut puller = Puller::new(4);
    puller.accept(vec![stored(0, 0, &[1]), stored(1, 0, &[2])]);
    let p = puller.accept(vec![stored(2, 0, &[3]), stored(0, 0, &[4])]);
    assert_eq!(
        (p.restarted, p.gap, show(&p).as_str()),
        (true, None, "clear +GPU[4]")
    );
    // Counting goes on in the new life.
    assert_eq!(show(&puller.accept(vec![removed(1, &[4])])), "-GPU[4]");
}

#[test]
fn created_after_other_events_is_a_restart() {
    let mut puller = Puller::new(4);
    // One `created` per window at start (ids 0, 1): not a restart.
    let p = puller.accept(vec![created(0, 0), created(1, 0), stored(2, 0, &[1])]);
    assert_eq!(
        (p.restarted, p.gap, show(&p).as_str()),
        (false, None, "+GPU[1]")
    );
    let p = puller.accept(vec![created(3, 0)]);
    assert_eq!((p.restarted, show(&p).as_str()), (true, "clear"));
}

#[test]
fn duplicates_are_ignored_and_ranks_count_separately() {
    let mut puller = Puller::new(4);
    puller.accept(vec![stored(0, 0, &[1]), stored(1, 0, &[2])]);
    let mut other_rank = stored(0, 0, &[3]);
    other_rank.rank = 1;
    let p = puller.accept(vec![stored(1, 0, &[2]), other_rank, removed(2, &[1])]);
    assert_eq!((p.ignored, p.restarted, p.gap), (1, false, None));
    assert_eq!(show(&p), "+GPU[3] -GPU[1]");
}

#[test]
fn only_the_largest_window_counts() {
    let small = |e| windowed(Some(512), e);
    let mut puller = Puller::new(4);
    let p = puller.accept(vec![
        small(created(0, 0)),
        created(1, 0),
        small(stored(2, 0, &[1])),
        stored(3, 0, &[2]),
        small(removed(4, &[2])),
    ]);
    assert_eq!((p.ignored, show(&p).as_str()), (2, "+GPU[2]"));
    // Without `created`: the largest seen so far. No window given: kept.
    let mut puller = Puller::new(4);
    let events = vec![
        stored(0, 0, &[1]),
        small(removed(1, &[1])),
        windowed(None, removed(2, &[1])),
    ];
    let p = puller.accept(events);
    assert_eq!((p.ignored, show(&p).as_str()), (1, "+GPU[1] -GPU[1]"));
}

#[test]
fn partial_blocks_and_their_removals_are_dropped() {
    let mut puller = Puller::new(4);
    let p = puller.accept(vec![
        stored_blocks(0, 0, vec![blk(1, 4), blk(2, 4), blk(3, 2), blk(4, 4)]),
        stored_blocks(1, 0, vec![blk(5, 3)]),
        stored(2, 3, &[6]), // after a partial block
    ]);
    assert_eq!((p.ignored, show(&p).as_str()), (2, "+GPU[1,2]"));
    let p = puller.accept(vec![removed(3, &[5, 2, 3, 4]), removed(4, &[6])]);
    assert_eq!((p.ignored, show(&p).as_str()), (1, "-GPU[2]"));
    // Stored in full later: known to the index again.
    let p = puller.accept(vec![stored(5, 0, &[4]), removed(6, &[4])]);
    assert_eq!(show(&p), "+GPU[4] -GPU[4]");
}

#[test]
fn offload_and_onboard_round_trip() {
    let mut puller = Puller::new(4);
    let mut b2 = blk(2, 4);
    b2.mm_keys = vec![KeyValue::List(vec![
        KeyValue::Str("img".into()),
        KeyValue::Int(1),
    ])];
    puller.accept(vec![created(0, 64), stored_blocks(1, 1, vec![b2.clone()])]);
    let p = puller.accept(vec![
        updated(2, 2, Some((0, 1))),
        updated(3, 2, Some((1, 0))),
    ]);
    assert_eq!(show(&p), "-GPU[2] +GPU[2]<-1");
    let Event::Stored(s) = &p.events[1] else {
        panic!()
    };
    assert_eq!(
        (&s.token_ids, &s.extra_keys),
        (&b2.tokens, &vec![Some(b2.mm_keys.clone())])
    );
    // Unknown blocks cannot come back (nor be removed); level changes within one tier and
    // priority updates do nothing.
    let p = puller.accept(vec![
        updated(4, 9, Some((1, 0))),
        updated(5, 2, Some((1, 2))),
        updated(6, 2, None),
        removed(7, &[9]),
    ]);
    assert_eq!((p.ignored, show(&p).as_str()), (4, ""));
}

#[test]
fn blocks_are_forgotten_when_no_host_tier_is_announced() {
    let mut puller = Puller::new(4);
    let p = puller.accept(vec![
        created(0, 0),
        stored(1, 0, &[1]),
        updated(2, 1, Some((0, 1))),
        updated(3, 1, Some((1, 0))),
        removed(4, &[1]),
    ]);
    assert_eq!((p.ignored, show(&p).as_str()), (2, "+GPU[1] -GPU[1]"));
}

#[test]
fn host_level_blocks_split_a_store_and_keys_and_salt_pass() {
    let (mut b1, mut b2, mut b3) = (blk(1, 4), blk(2, 4), blk(3, 4));
    b1.cache_salt = Some("salt".into());
    b2.mm_keys = vec![KeyValue::List(vec![
        KeyValue::Str("img".into()),
        KeyValue::Int(0),
    ])];
    b3.cache_level = 1;
    let events = vec![
        stored_blocks(0, 0, vec![b1, b2.clone(), b3]),
        removed(1, &[3]),
    ];
    let p = Puller::new(4).accept(events);
    assert_eq!(show(&p), "+GPU[1,2] +CPU[3]<-2 -CPU[3]");
    let Event::Stored(s) = &p.events[0] else {
        panic!()
    };
    assert_eq!(s.cache_salt.as_deref(), Some("salt"));
    assert_eq!(s.extra_keys, vec![None, Some(b2.mm_keys)]);
    let Some(kvroute_core::KvEvent::Stored(k)) = p.events[0].to_kv_event() else {
        panic!()
    };
    assert_ne!(k.namespace, Namespace::default());
    assert!(k.block_keys[0] == 0 && k.block_keys[1] != 0);
}

#[test]
fn mm_keys_decode_as_pairs() {
    let body = r#"[{"event_id":0,"data":{"type":"stored","parent_hash":-5,"blocks":[
        {"type":"stored_block","block_hash":"ab","tokens":[],"cache_salt":"s","lora_id":3,
         "mm_keys":[{"type":"mm_key","hash":"uuid-1","start_offset":2},{"hash":7}]}]}}]"#;
    let events = decode(body.as_bytes()).expect("decodes");
    let PulledData::Stored { parent, blocks } = &events[0].data else {
        panic!()
    };
    assert_eq!(*parent, Some(EngineHash::from_i64(-5)));
    let b = &blocks[0];
    assert_eq!(
        (b.hash, b.cache_salt.as_deref(), b.lora_id),
        (EngineHash(0xab), Some("s"), Some(3))
    );
    let uuid = KeyValue::List(vec![KeyValue::Str("uuid-1".into()), KeyValue::Int(2)]);
    assert_eq!(
        b.mm_keys,
        vec![uuid, KeyValue::List(vec![KeyValue::Int(7)])]
    );
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        if let Ok(events) = decode(&bytes) {
            Puller::new(4).accept(events);
        }
    }

    #[test]
    fn corrupted_examples_never_panic(at in 0usize..4000, byte in any::<u8>()) {
        let mut body = EXAMPLE.as_bytes().to_vec();
        let i = at % body.len();
        body[i] = byte;
        if let Ok(events) = decode(&body) {
            Puller::new(4).accept(events);
        }
    }

    #[test]
    fn arbitrary_event_streams_never_panic(answers in prop::collection::vec(
        prop::collection::vec((0u64..12, 0i64..3, 0u64..5, 0u8..5, 0u64..8, 0u32..6), 0..8),
        0..4,
    )) {
        let mut puller = Puller::new(4);
        for answer in answers {
            let events = answer.into_iter().map(|(id, rank, w, kind, h, n)| {
                let mut e = match kind {
                    0 => created(id, w),
                    1 => stored_blocks(id, h / 2, vec![blk(h, n), PulledBlock { cache_level: 1, ..blk(h + 1, 4) }]),
                    2 => removed(id, &[h, h + 1]),
                    3 => updated(id, h, Some((rank % 2, i64::from(n % 2)))),
                    _ => updated(id, h, None),
                };
                e.rank = rank;
                windowed((w > 0).then_some(w * 512), e)
            }).collect();
            let p = puller.accept(events);
            prop_assert!(!p.events.iter().skip(1).any(|e| *e == Event::Cleared));
        }
    }
}
