//! Tests of records, summaries and reports.

use super::*;
use proptest::prelude::*;

fn t(ms: u64) -> Time {
    Time::from_millis(ms)
}

/// A completed request: sent at `at`, first token after `ttft` ms, done after `e2e` ms.
fn done(id: u64, at: u64, ttft: u64, e2e: u64, out: u64, input: u64, cached: u64) -> RequestRecord {
    let mut r = RequestRecord::new(RequestId(id), t(at), input);
    r.worker = Some(id % 2);
    r.first_token = Some(t(at + ttft));
    r.finished = Some(t(at + e2e));
    r.output_tokens = out;
    r.cached_tokens = cached;
    r.predicted_cached_tokens = cached;
    r
}

fn with_status(mut r: RequestRecord, s: Status) -> RequestRecord {
    r.status = s;
    r
}

#[test]
fn record_latencies() {
    let mut r = done(1, 1_000, 200, 1_100, 10, 100, 0);
    assert_eq!(r.ttft(), Some(Duration::from_millis(200)));
    assert_eq!(r.e2e(), Some(Duration::from_millis(1_100)));
    // (1100 - 200) ms over 9 gaps.
    assert!((r.tpot_secs().unwrap() - 0.1).abs() < 1e-12);
    r.output_tokens = 1;
    assert_eq!(r.tpot_secs(), None);
    r.push_gaps(0.02, 3);
    r.push_gaps(0.02, 2);
    r.push_gaps(0.03, 1);
    r.push_gaps(0.04, 0);
    assert_eq!(r.itl, vec![(0.02, 5), (0.03, 1)]);
}

/// Four completed requests, one failed, one rejected, over 10 s.
fn run() -> Vec<RequestRecord> {
    let mut a = done(0, 0, 100, 1_000, 10, 1_000, 800);
    a.itl = vec![(0.1, 9)];
    let mut b = done(1, 0, 200, 2_000, 10, 1_000, 0);
    b.itl = vec![(0.2, 9)];
    b.predicted_cached_tokens = 500;
    let c = done(2, 0, 300, 300, 1, 500, 500);
    let d = done(3, 0, 400, 1_300, 4, 500, 200);
    let e = with_status(
        done(4, 0, 50, 60, 2, 700, 700),
        Status::Failed("engine_error".into()),
    );
    let f = with_status(
        RequestRecord::new(RequestId(5), t(0), 300),
        Status::Rejected("overloaded".into()),
    );
    vec![a, b, c, d, e, f]
}

#[test]
fn summary_with_failures_and_rejections() {
    let s = Summary::from_records(&run(), Duration::from_secs(10));
    assert_eq!((s.sent, s.completed, s.failed, s.rejected), (6, 4, 1, 1));
    assert_eq!(s.failed_by_reason.get("engine_error"), Some(&1));
    assert_eq!(s.rejected_by_reason.get("overloaded"), Some(&1));
    // TTFT of completed: 100, 200, 300, 400.
    assert_eq!(s.ttft_ms.count, 4);
    assert_eq!(s.ttft_ms.mean, Some(250.0));
    assert_eq!(s.ttft_ms.p50, Some(250.0));
    // h = 3 * 0.95 = 2.85: 300 + 0.85 * 100.
    assert!((s.ttft_ms.p95.unwrap() - 385.0).abs() < 1e-9);
    // All sent: 100, 200, 300, 400, inf, inf; h(0.5) = 2.5 -> 350; h(0.95) = 4.75 -> inf.
    assert!((s.ttft_all_ms.p50.unwrap() - 350.0).abs() < 1e-9);
    assert_eq!(s.ttft_all_ms.p95, Some(f64::INFINITY));
    // TPOT: a 900/9 = 100, b 1800/9 = 200, d 900/3 = 300 (c has one token).
    assert_eq!(s.tpot_ms.count, 3);
    assert!((s.tpot_ms.p50.unwrap() - 200.0).abs() < 1e-9);
    // ITL: nine gaps of 100 and nine of 200 -> median between the two = 150.
    assert_eq!(s.itl_ms.count, 18);
    assert!((s.itl_ms.p50.unwrap() - 150.0).abs() < 1e-9);
    assert!((s.itl_ms.p95.unwrap() - 200.0).abs() < 1e-9);
    // E2E: 300, 1000, 1300, 2000.
    assert!((s.e2e_ms.p50.unwrap() - 1_150.0).abs() < 1e-9);
    // Tokens of completed requests only.
    assert_eq!(s.input_tokens, 3_000);
    assert_eq!(s.cached_tokens, 1_500);
    assert_eq!(s.hit_rate, Some(0.5));
    assert_eq!(s.predicted_cached_tokens, 2_000);
    assert!((s.prediction_ratio.unwrap() - 2_000.0 / 1_500.0).abs() < 1e-12);
    assert!((s.prediction_error.unwrap() - 500.0 / 3_000.0).abs() < 1e-12);
    assert_eq!(s.output_tokens, 25);
    assert_eq!(s.output_tokens_per_s, Some(2.5));
    assert_eq!(s.requests_per_s, Some(0.4));
    assert!(s.goodput.is_none());
}

#[test]
fn goodput_counts_requests_within_the_slo() {
    let slo = Slo {
        ttft_ms: Some(250.0),
        tpot_ms: Some(150.0),
    };
    let s = Summary::from_records_with_slo(&run(), Duration::from_secs(10), Some(&slo));
    // a: ttft 100, tpot 100 -> met; b: tpot 200 -> no; c: ttft 300 -> no; d: ttft 400 -> no;
    // e failed, f rejected -> no.
    let g = s.goodput.unwrap();
    assert_eq!(g.met, 1);
    assert_eq!(g.per_s, Some(0.1));
    assert!((g.fraction_of_sent.unwrap() - 1.0 / 6.0).abs() < 1e-12);
    let loose = Slo {
        ttft_ms: Some(1e9),
        tpot_ms: None,
    };
    let g = Summary::from_records_with_slo(&run(), Duration::from_secs(10), Some(&loose))
        .goodput
        .unwrap();
    assert_eq!(g.met, 4, "failures never meet an SLO");
}

#[test]
fn empty_run_and_zero_duration_have_no_rates() {
    let s = Summary::from_records(&[], Duration::ZERO);
    assert_eq!(s.sent, 0);
    assert_eq!(s.ttft_ms.p50, None);
    assert_eq!(s.ttft_all_ms.p95, None);
    assert_eq!(s.hit_rate, None);
    assert_eq!(s.requests_per_s, None);
    let s = Summary::from_records(&run(), Duration::ZERO);
    assert_eq!(s.output_tokens_per_s, None);
    assert_eq!(s.completed, 4);
}

#[test]
fn json_writes_infinity_as_inf_and_missing_as_null() {
    let s = Summary::from_records(&run(), Duration::from_secs(10));
    let v = serde_json::to_value(&s).unwrap();
    assert_eq!(v["ttft_all_ms"]["p95"], "inf");
    assert_eq!(v["ttft_all_ms"]["p50"].as_f64(), Some(350.0));
    assert_eq!(v["ttft_ms"]["mean"].as_f64(), Some(250.0));
    assert_eq!(v["failed_by_reason"]["engine_error"], 1);
    assert!(v["goodput"].is_null());
    let empty = serde_json::to_value(Summary::from_records(&[], Duration::ZERO)).unwrap();
    assert!(empty["ttft_all_ms"]["p95"].is_null());
    assert!(empty["ttft_ms"]["p50"].is_null());
    // Records round-trip.
    let recs = run();
    let text = serde_json::to_string(&recs).unwrap();
    let back: Vec<RequestRecord> = serde_json::from_str(&text).unwrap();
    assert_eq!(back, recs);
}

#[test]
fn markdown_table_has_one_row_per_summary() {
    let s = Summary::from_records(&run(), Duration::from_secs(10));
    let table = markdown_table(&[("kv | c=60", &s), ("rr", &s)]);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 4);
    let columns = lines[0].matches(" | ").count();
    for l in &lines {
        assert!(l.starts_with("| ") || l.starts_with("|"), "{l}");
        assert!(l.ends_with('|'), "{l}");
    }
    assert_eq!(lines[1].matches('|').count(), columns + 2);
    assert!(
        lines[2].starts_with("| kv \\| c=60 | 6 | 4 | 1 | 1 | 250.0 | "),
        "{}",
        lines[2]
    );
    assert!(lines[2].contains("| inf |"), "{}", lines[2]);
    assert!(lines[2].contains("| 0.5000 |"), "{}", lines[2]);
    assert_eq!(s.markdown_row("rr"), format!("{}\n", lines[3]));
}

#[test]
fn tsv_has_a_header_and_one_line_per_record() {
    let mut recs = run();
    recs[4].status = Status::Failed("bad\tthing\nhere".into());
    // Workers by name: the second one has none in the list, so its number shows.
    let tsv = records_tsv(&recs, &["worker-a".to_string()]);
    let lines: Vec<&str> = tsv.lines().collect();
    assert_eq!(lines.len(), 7);
    assert_eq!(lines[0].split('\t').collect::<Vec<_>>(), TSV_COLUMNS);
    for l in &lines[1..] {
        assert_eq!(l.split('\t').count(), TSV_COLUMNS.len(), "{l}");
    }
    let a: Vec<&str> = lines[1].split('\t').collect();
    assert_eq!(a[0], "0");
    assert_eq!(a[1], "worker-a");
    assert_eq!(lines[2].split('\t').nth(1), Some("1"));
    let named = records_tsv(&recs, &numbered_workers(2));
    assert_eq!(
        named.lines().nth(2).unwrap().split('\t').nth(1),
        Some("worker-2")
    );
    assert_eq!(a[6], "100.000");
    assert_eq!(a[7], "100.000");
    assert_eq!(a[13], "completed");
    assert_eq!(a[15], "9");
    assert_eq!(a[16], "100.000");
    let e: Vec<&str> = lines[5].split('\t').collect();
    assert_eq!((e[13], e[14]), ("failed", "bad thing here"));
    let f: Vec<&str> = lines[6].split('\t').collect();
    assert_eq!((f[1], f[4], f[6]), ("", "", ""));
    assert_eq!(f[13], "rejected");
}

fn arb_record() -> impl Strategy<Value = RequestRecord> {
    (
        0u64..1_000,
        0u64..5_000,
        0u64..5_000,
        0u64..50,
        0u64..4_000,
        0u8..4,
        proptest::collection::vec((0.0f64..0.5, 0u32..20), 0..4),
    )
        .prop_map(|(at, ttft, decode, out, input, kind, itl)| {
            let mut r = done(at, at, ttft, ttft + decode, out, input, input / 2);
            r.itl = itl;
            match kind {
                0 => r.status = Status::Failed(format!("f{}", at % 3)),
                1 => r.status = Status::Rejected(format!("r{}", at % 2)),
                2 => r.first_token = None,
                _ => {}
            }
            r
        })
}

proptest! {
    #[test]
    fn summary_counts_add_up(records in proptest::collection::vec(arb_record(), 0..40)) {
        let s = Summary::from_records(&records, Duration::from_secs(60));
        prop_assert_eq!(s.sent as usize, records.len());
        prop_assert_eq!(s.completed + s.failed + s.rejected, s.sent);
        prop_assert_eq!(s.failed_by_reason.values().sum::<u64>(), s.failed);
        prop_assert_eq!(s.rejected_by_reason.values().sum::<u64>(), s.rejected);
        prop_assert!(s.ttft_ms.count <= s.completed);
        if let Some(h) = s.hit_rate {
            prop_assert!((0.0..=1.0).contains(&h));
        }
        // Counting failures as infinite never makes TTFT look better.
        if let (Some(all), Some(done)) = (s.ttft_all_ms.p95, s.ttft_ms.p95) {
            prop_assert!(all >= done - 1e-9);
        }
        for d in [&s.ttft_ms, &s.tpot_ms, &s.itl_ms, &s.e2e_ms] {
            if let (Some(a), Some(b), Some(c), Some(e)) = (d.p50, d.p90, d.p95, d.p99) {
                prop_assert!(a <= b && b <= c && c <= e);
            }
        }
    }
}
