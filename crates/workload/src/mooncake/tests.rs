//! Tests of the Mooncake trace parser.
// Tests and benchmarks of a pure crate may read the clock, files and the environment (they
// time themselves, open fixtures); the crate's clippy.toml rules are for its library code.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

use super::*;
use crate::prompt::token_block;
use std::path::PathBuf;

fn opts() -> TraceOptions {
    TraceOptions::default()
}

fn line_error(text: &str) -> (usize, LineError) {
    match parse_str(text, &opts()) {
        Err(TraceError::Line { line, error }) => (line, error),
        other => panic!("expected a line error, got {other:?}"),
    }
}

const TWO: &str = r#"{"timestamp": 0, "input_length": 1000, "output_length": 10, "hash_ids": [0, 1]}
{"timestamp": 1500, "input_length": 600, "output_length": 7, "hash_ids": [0, 2], "extra": "x"}
"#;

#[test]
fn parses_requests_and_ignores_unknown_keys() {
    let reqs = parse_str(TWO, &opts()).unwrap();
    assert_eq!(reqs.len(), 2);
    assert_eq!(reqs[0].arrival, Time::ZERO);
    assert_eq!(reqs[1].arrival, Time::from_millis(1500));
    assert_eq!(reqs[1].max_tokens, 7);
    assert_eq!(
        reqs[1].prompt,
        Prompt::HashBlocks {
            ids: vec![0, 2],
            block_tokens: 512,
            len: 600
        }
    );
    // Shared first id: shared first block of tokens.
    let (a, b) = (reqs[0].prompt.materialize(), reqs[1].prompt.materialize());
    assert_eq!(a[..512], b[..512]);
    assert_eq!(a[..512], token_block(0, 512)[..]);
    assert_ne!(a[512..600], b[512..600]);
}

#[test]
fn blank_lines_and_crlf_are_fine_and_numbering_counts_them() {
    let text = "\n{\"timestamp\": 5, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [3]}\r\n\n  \n{\"timestamp\": 6}\n";
    let (line, err) = line_error(text);
    assert_eq!(line, 5);
    assert_eq!(err, LineError::MissingField("input_length"));
    let ok = parse_str(&text[..text.len() - 17], &opts()).unwrap();
    assert_eq!(ok.len(), 1);
    assert_eq!(ok[0].arrival, Time::from_millis(5));
}

#[test]
fn malformed_lines_name_line_and_problem() {
    let good = r#"{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [0]}"#;
    let cases: Vec<(&str, LineError)> = vec![
        ("{not json", LineError::Json(String::new())),
        ("[1, 2]", LineError::NotAnObject("an array")),
        (
            r#"{"input_length": 10, "output_length": 1, "hash_ids": [0]}"#,
            LineError::MissingField("timestamp"),
        ),
        (
            r#"{"timestamp": 0, "input_length": 10, "output_length": 1}"#,
            LineError::MissingField("hash_ids"),
        ),
        (
            r#"{"timestamp": 0, "input_length": 0, "output_length": 1, "hash_ids": []}"#,
            LineError::Zero("input_length"),
        ),
        (
            r#"{"timestamp": 0, "input_length": 10, "output_length": 0, "hash_ids": [0]}"#,
            LineError::Zero("output_length"),
        ),
        (
            r#"{"timestamp": 0, "input_length": -4, "output_length": 1, "hash_ids": [0]}"#,
            LineError::BadValue {
                field: "input_length",
                expected: "a positive integer",
                got: "-4".into(),
            },
        ),
        (
            r#"{"timestamp": -1, "input_length": 10, "output_length": 1, "hash_ids": [0]}"#,
            LineError::BadValue {
                field: "timestamp",
                expected: "a non-negative number of milliseconds",
                got: "-1".into(),
            },
        ),
        (
            r#"{"timestamp": 0, "input_length": "10", "output_length": 1, "hash_ids": [0]}"#,
            LineError::BadValue {
                field: "input_length",
                expected: "a positive integer",
                got: "\"10\"".into(),
            },
        ),
        (
            r#"{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [-1]}"#,
            LineError::BadValue {
                field: "hash_ids",
                expected: "an array of non-negative integers",
                got: "element -1".into(),
            },
        ),
        (
            r#"{"timestamp": 0, "input_length": 20000000, "output_length": 1, "hash_ids": []}"#,
            LineError::TooLarge {
                field: "input_length",
                value: 2e7,
                max: 1e7,
            },
        ),
        (
            r#"{"timestamp": 0, "input_length": 513, "output_length": 1, "hash_ids": [0]}"#,
            LineError::HashIdCount {
                input_length: 513,
                block_tokens: 512,
                expected: 2,
                got: 1,
            },
        ),
        (
            r#"{"timestamp": 0, "input_length": 512, "output_length": 1, "hash_ids": [0, 1]}"#,
            LineError::HashIdCount {
                input_length: 512,
                block_tokens: 512,
                expected: 1,
                got: 2,
            },
        ),
    ];
    for (bad, want) in cases {
        let text = format!("{good}\n\n{bad}\n{good}\n");
        let (line, err) = line_error(&text);
        assert_eq!(line, 3, "{bad}");
        match (&err, &want) {
            (LineError::Json(msg), LineError::Json(_)) => assert!(!msg.is_empty()),
            _ => assert_eq!(err, want, "{bad}"),
        }
        let shown = TraceError::Line { line, error: err }.to_string();
        assert!(shown.starts_with("line 3: "), "{shown}");
    }
}

#[test]
fn error_messages_are_readable() {
    let (_, err) = line_error(
        r#"{"timestamp": 0, "input_length": 1100, "output_length": 1, "hash_ids": [0]}"#,
    );
    assert_eq!(
        err.to_string(),
        "`hash_ids` has 1 ids, but input_length 1100 in blocks of 512 needs \
         ceil(1100 / 512) = 3"
    );
    let e = parse_str("\u{0}", &opts()).unwrap_err();
    assert_eq!(e.line(), Some(1));
    assert!(e.to_string().contains("bad JSON"), "{e}");
}

#[test]
fn invalid_utf8_and_overlong_lines_are_errors() {
    let bytes: &[u8] = b"\xff\xfe\n";
    let e = parse_reader(bytes, &opts()).unwrap_err();
    assert!(matches!(
        e,
        TraceError::Line {
            line: 1,
            error: LineError::Json(_)
        }
    ));
    let long = vec![b' '; MAX_LINE_BYTES + 10];
    let e = parse_reader(&long[..], &opts()).unwrap_err();
    assert!(matches!(
        e,
        TraceError::Line {
            line: 1,
            error: LineError::TooLong
        }
    ));
}

#[test]
fn options_are_validated() {
    for speedup in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        let o = TraceOptions { speedup, ..opts() };
        assert!(matches!(parse_str(TWO, &o), Err(TraceError::Options(_))));
    }
    let o = TraceOptions {
        block_tokens: 0,
        ..opts()
    };
    assert!(o.validate().is_err());
}

#[test]
fn speedup_divides_arrivals_and_block_size_is_configurable() {
    let o = TraceOptions {
        speedup: 4.0,
        ..opts()
    };
    let reqs = parse_str(TWO, &o).unwrap();
    assert_eq!(reqs[1].arrival, Time::from_millis(375));
    let text = r#"{"timestamp": 3, "input_length": 40, "output_length": 2, "hash_ids": [4, 5, 6]}"#;
    let o = TraceOptions {
        block_tokens: 16,
        speedup: 0.5,
        ..opts()
    };
    let reqs = parse_str(text, &o).unwrap();
    assert_eq!(reqs[0].arrival, Time::from_millis(6));
    assert_eq!(reqs[0].prompt.materialize().len(), 40);
    assert!(parse_str(text, &opts()).is_err());
}

fn numbered(n: usize) -> String {
    (0..n)
        .map(|i| {
            let len = 100 * (i + 1);
            format!(
                "{{\"timestamp\": {i}, \"input_length\": {len}, \"output_length\": 1, \"hash_ids\": [{}]}}\n",
                (0..len.div_ceil(512)).map(|b| (i * 10 + b).to_string()).collect::<Vec<_>>().join(", ")
            )
        })
        .collect()
}

#[test]
fn length_filter_then_first_k() {
    let text = numbered(10); // lengths 100, 200, ..., 1000
    let o = TraceOptions {
        max_input_tokens: Some(500),
        ..opts()
    };
    let lens: Vec<usize> = parse_str(&text, &o)
        .unwrap()
        .iter()
        .map(|r| r.prompt.len())
        .collect();
    assert_eq!(lens, vec![100, 200, 300, 400, 500]);
    // First K counts kept requests: with the filter dropping odd lines, K = 3 reads further.
    let mut alternating = String::new();
    for (i, l) in text.lines().enumerate() {
        alternating.push_str(l);
        alternating.push('\n');
        if i % 2 == 0 {
            alternating.push_str(
                r#"{"timestamp": 99, "input_length": 9000, "output_length": 1, "hash_ids": [1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18]}"#,
            );
            alternating.push('\n');
        }
    }
    let o = TraceOptions {
        max_input_tokens: Some(5000),
        first: Some(3),
        ..opts()
    };
    let lens: Vec<usize> = parse_str(&alternating, &o)
        .unwrap()
        .iter()
        .map(|r| r.prompt.len())
        .collect();
    assert_eq!(lens, vec![100, 200, 300]);
    // Reading stops after K: a broken line after them is not reached.
    let broken = format!("{}garbage\n", numbered(2));
    let o = TraceOptions {
        first: Some(2),
        ..opts()
    };
    assert_eq!(parse_str(&broken, &o).unwrap().len(), 2);
    assert!(parse_str(&broken, &opts()).is_err());
    let o = TraceOptions {
        first: Some(0),
        ..opts()
    };
    assert!(parse_str(&broken, &o).unwrap().is_empty());
}

#[test]
fn stats_count_repeated_ids_as_hits() {
    let text = r#"{"timestamp": 0, "input_length": 1000, "output_length": 10, "hash_ids": [0, 1]}
{"timestamp": 2000, "input_length": 1100, "output_length": 5, "hash_ids": [0, 1, 2]}
"#;
    let s = TraceStats::of(&parse_str(text, &opts()).unwrap());
    assert_eq!(s.requests, 2);
    assert_eq!(s.input_tokens, 2100);
    assert_eq!(s.output_tokens, 15);
    assert_eq!(s.blocks, 5);
    assert_eq!(s.distinct_ids, 3);
    assert_eq!(s.span_secs, 2.0);
    assert_eq!(s.ideal_block_hit_rate, Some(2.0 / 5.0));
    // Hits: block 0 (512) and block 1, full in the second request (512 tokens).
    assert_eq!(s.ideal_token_hit_rate, Some(1024.0 / 2100.0));
    assert_eq!(TraceStats::of(&[]).ideal_block_hit_rate, None);
}

fn mooncake_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data/mooncake")
}

/// Opens a trace of the shared data folder, or says why the test is skipped.
fn open_trace(name: &str) -> Option<(PathBuf, std::fs::File)> {
    let path = mooncake_dir().join(name);
    match std::fs::File::open(&path) {
        Ok(f) => Some((path, f)),
        Err(e) => {
            println!(
                "SKIPPED: cannot open {} ({e}); the shared data folder is not beside the workspace",
                path.display()
            );
            None
        }
    }
}

#[test]
fn real_synthetic_trace_matches_readme() {
    let Some((_, file)) = open_trace("synthetic_trace.jsonl") else {
        return;
    };
    let s = TraceStats::of(&parse_reader(std::io::BufReader::new(file), &opts()).unwrap());
    assert_eq!(s.requests, 3_993);
    assert_eq!(s.input_tokens, 61_194_628);
    assert_eq!(s.output_tokens, 595_432);
    assert_eq!(s.blocks, 121_877);
    assert_eq!(s.distinct_ids, 43_924);
    let hit = s.ideal_block_hit_rate.unwrap();
    assert!((hit - 0.6396).abs() < 5e-5, "{hit}");
    let tok = s.ideal_token_hit_rate.unwrap();
    assert!((tok - 0.6512).abs() < 5e-5, "{tok}");
}

#[test]
fn real_conversation_trace_matches_readme() {
    let Some((path, file)) = open_trace("conversation_trace.jsonl") else {
        return;
    };
    let reqs = parse_reader(std::io::BufReader::new(file), &opts()).unwrap();
    let s = TraceStats::of(&reqs);
    assert_eq!(s.requests, 12_031);
    assert_eq!(s.input_tokens, 144_793_823);
    assert_eq!(s.output_tokens, 4_122_048);
    assert_eq!(s.blocks, 288_500);
    assert_eq!(s.distinct_ids, 182_790);
    assert!((s.span_secs - 3_536.999).abs() < 1e-9, "{}", s.span_secs);
    let hit = s.ideal_block_hit_rate.unwrap();
    assert!((hit - 0.3664).abs() < 5e-5, "{hit}");
    let tok = s.ideal_token_hit_rate.unwrap();
    assert!((tok - 0.3736).abs() < 5e-5, "{tok}");
    assert!(reqs.windows(2).all(|w| w[0].arrival <= w[1].arrival));
    // The filters on real data: first K after a length cap.
    let o = TraceOptions {
        max_input_tokens: Some(8_192),
        first: Some(100),
        speedup: 10.0,
        ..opts()
    };
    let few = parse_reader(
        std::io::BufReader::new(std::fs::File::open(&path).unwrap()),
        &o,
    )
    .unwrap();
    assert_eq!(few.len(), 100);
    assert!(few.iter().all(|r| r.prompt.len() <= 8_192));
}

/// The prefix-sharing structure AIPerf's `mooncake_trace` mode asks for (512 tokens per hash
/// id, the last block holding the rest, equal ids giving equal blocks): prompts are exactly
/// `input_length` long and two prompts share exactly the tokens of their common leading ids.
#[test]
fn prompts_share_exactly_the_blocks_their_hash_ids_share() {
    let trace = r#"{"timestamp": 0, "input_length": 1536, "output_length": 1, "hash_ids": [1, 2, 3]}
{"timestamp": 1, "input_length": 1400, "output_length": 1, "hash_ids": [1, 2, 4]}
{"timestamp": 2, "input_length": 700, "output_length": 1, "hash_ids": [1, 5]}
{"timestamp": 3, "input_length": 512, "output_length": 1, "hash_ids": [6]}
{"timestamp": 4, "input_length": 2048, "output_length": 1, "hash_ids": [1, 2, 3, 7]}
{"timestamp": 5, "input_length": 300, "output_length": 1, "hash_ids": [1]}
"#;
    let reqs = parse_str(trace, &opts()).unwrap();
    let prompts: Vec<Vec<u32>> = reqs.iter().map(|r| r.prompt.materialize()).collect();
    let ids: Vec<Vec<u64>> = trace
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["hash_ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap())
                .collect()
        })
        .collect();
    let lengths: Vec<usize> = prompts.iter().map(Vec::len).collect();
    assert_eq!(lengths, vec![1536, 1400, 700, 512, 2048, 300]);
    let common = |a: &[u32], b: &[u32]| a.iter().zip(b).take_while(|(x, y)| x == y).count();
    for i in 0..prompts.len() {
        for j in 0..prompts.len() {
            let shared_ids = ids[i]
                .iter()
                .zip(&ids[j])
                .take_while(|(x, y)| x == y)
                .count();
            let expected = (shared_ids * MOONCAKE_BLOCK_TOKENS)
                .min(prompts[i].len())
                .min(prompts[j].len());
            assert_eq!(
                common(&prompts[i], &prompts[j]),
                expected,
                "requests {i} and {j} share {shared_ids} ids"
            );
        }
    }
}

#[test]
fn bursts_spread_evenly_over_their_window_in_order() {
    let req = |ms: u64, id: u64| TraceRequest {
        arrival: Time::from_millis(ms),
        prompt: crate::Prompt::hash_blocks(vec![id], 16, 16).unwrap(),
        max_tokens: 1,
    };
    let mut t = vec![
        req(0, 1),
        req(0, 2),
        req(0, 3),
        req(0, 4),
        req(3000, 5),
        req(3000, 6),
        req(9000, 7),
    ];
    spread_bursts(&mut t, std::time::Duration::from_secs(3));
    let ms: Vec<u64> = t
        .iter()
        .map(|r| r.arrival.since(Time::ZERO).as_millis() as u64)
        .collect();
    assert_eq!(ms, [0, 750, 1500, 2250, 3000, 4500, 9000]);
    // A window past the next step interleaves the bursts, still in arrival order.
    let mut t = vec![req(0, 1), req(0, 2), req(1000, 3)];
    spread_bursts(&mut t, std::time::Duration::from_secs(4));
    let ms: Vec<u64> = t
        .iter()
        .map(|r| r.arrival.since(Time::ZERO).as_millis() as u64)
        .collect();
    assert_eq!(ms, [0, 1000, 2000]);
}
