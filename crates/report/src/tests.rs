//! Report tests on fixed cells: the Markdown against a golden file, TSV and JSON shape,
//! plots, the SLO search and the baseline file.

use super::*;
use kvroute_workload::Decile;

fn metrics(ttft_p50: f64, ttft_p95: f64, tok_s: f64, hit: f64, rejected: u64) -> Metrics {
    Metrics {
        sent: 100,
        completed: 100 - rejected,
        failed: 0,
        rejected,
        ttft_p50_ms: Some(ttft_p50),
        ttft_p95_ms: Some(ttft_p95),
        ttft_p99_ms: Some(ttft_p95 * 1.2),
        ttft_all_p50_ms: Some(ttft_p50),
        ttft_all_p95_ms: Some(if rejected > 5 {
            f64::INFINITY
        } else {
            ttft_p95
        }),
        ttft_all_p99_ms: Some(if rejected > 0 {
            f64::INFINITY
        } else {
            ttft_p95 * 1.2
        }),
        tpot_p50_ms: Some(30.0),
        tpot_p95_ms: Some(40.0),
        itl_p50_ms: Some(29.0),
        itl_p95_ms: Some(45.0),
        e2e_p50_ms: Some(24_000.0),
        e2e_p95_ms: Some(30_000.0),
        hit_rate: Some(hit),
        output_tokens_per_s: Some(tok_s),
        requests_per_s: Some(tok_s / 830.0),
        goodput_per_s: Some((100 - rejected) as f64 / 100.0 * tok_s / 830.0),
    }
}

fn decile(i: usize, ttft: f64, rejected: usize) -> Decile {
    Decile {
        decile: i,
        from_secs: (i - 1) as f64 * 10.0,
        sent: 10,
        completed: 10 - rejected,
        failed: 0,
        rejected,
        ttft_p50_ms: Some(ttft),
        ttft_p95_ms: Some(ttft * 2.0),
    }
}

pub(crate) fn sweep() -> Sweep {
    let rr = [
        (60, 274.0, 655.0, 2146.9, 0.909),
        (120, 375.0, 643.0, 2642.6, 0.872),
    ];
    let kv = [
        (60, 249.0, 446.0, 2262.8, 0.916),
        (120, 382.0, 530.0, 2805.7, 0.959),
    ];
    let mut cells = Vec::new();
    for ((c, p50, p95, tok, hit), (_, kp50, kp95, ktok, khit)) in rr.into_iter().zip(kv) {
        let rr_runs = vec![
            metrics(p50 - 10.0, p95, tok, hit, 0),
            metrics(p50 + 10.0, p95, tok, hit, 0),
        ];
        cells.push(Cell::new(
            "round_robin",
            3,
            Load::Concurrency(c),
            rr_runs,
            vec![],
        ));
        let rejected: usize = if c == 120 { 10 } else { 0 };
        let deciles = (1..=10)
            .map(|i| decile(i, 100.0 * i as f64, rejected / 10))
            .collect();
        cells.push(Cell::new(
            "kv",
            3,
            Load::Concurrency(c),
            vec![metrics(kp50, kp95, ktok, khit, rejected as u64); 2],
            deciles,
        ));
    }
    Sweep {
        info: SweepInfo {
            title: "kvroute bench --sim".into(),
            setup: "fleet simulator, profile `h200-llama3-70b-fp8`".into(),
            workload: "multiturn".into(),
            repeats: 2,
            window: "warm-up 60 s, then 300 s in 3 snapshots".into(),
            baseline_policy: "round_robin".into(),
            slo_ttft_p95_ms: Some(600.0),
            slo_tpot_p95_ms: Some(60.0),
        },
        cells,
    }
}

#[test]
fn report_matches_the_golden_file() {
    let s = sweep();
    let text = markdown(
        &s,
        &[("TTFT p95 - 3 workers".into(), "ttft_p95-w3.svg".into())],
    );
    let golden = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/report.md");
    if std::env::var_os("KVROUTE_UPDATE_GOLDEN").is_some() {
        std::fs::write(golden, &text).unwrap();
    }
    let want = std::fs::read_to_string(golden).expect("golden file (KVROUTE_UPDATE_GOLDEN=1)");
    assert_eq!(text, want);
}

#[test]
fn report_states_deltas_failures_and_saturation() {
    let text = markdown(&sweep(), &[]);
    // TTFT p95 at 60: 655 -> 446 ms is 31.9% better.
    assert!(text.contains("| 655 ms | 446 ms | **+31.9%** |"), "{text}");
    // Throughput: higher is better.
    assert!(text.contains("**+5.4%**"), "{text}");
    // Goodput per policy and load, with its Δ: 2.59 -> 2.73 req/s at 60.
    assert!(text.contains("### Goodput"), "{text}");
    assert!(text.contains("| 60 | 2.59 | 2.73 | **+5.4%** |"), "{text}");
    // Rejections are counted and make the all-sent p95 infinite.
    assert!(text.contains("| 120 | kv | 200 | 180 | 0 | 20 |"), "{text}");
    assert!(text.contains("| inf | inf |"), "{text}");
    // kv at 120 refused requests: saturated, shown over time; round-robin is not.
    assert!(text.contains("#### kv at concurrency 120"), "{text}");
    assert!(!text.contains("#### round_robin"), "{text}");
}

#[test]
fn highest_load_under_the_slo_needs_every_lower_level() {
    let mut s = sweep();
    assert_eq!(max_load_under_slo(&s, 3, "round_robin"), None);
    assert_eq!(max_load_under_slo(&s, 3, "kv"), Some(Load::Concurrency(60)));
    s.info.slo_ttft_p95_ms = Some(700.0);
    assert_eq!(
        max_load_under_slo(&s, 3, "round_robin"),
        Some(Load::Concurrency(120))
    );
    assert!(saturated(
        s.cell("kv", 3, Load::Concurrency(120)).unwrap(),
        None
    ));
    assert!(!saturated(
        s.cell("round_robin", 3, Load::Concurrency(60)).unwrap(),
        Some(700.0)
    ));
}

#[test]
fn deltas_point_the_right_way() {
    assert_eq!(delta(Some(200.0), Some(150.0), true), Some(0.25));
    assert_eq!(delta(Some(200.0), Some(250.0), false), Some(0.25));
    assert_eq!(delta(Some(0.0), Some(1.0), true), None);
    assert_eq!(delta(Some(1.0), Some(f64::INFINITY), true), None);
    assert_eq!(delta(None, Some(1.0), true), None);
}

#[test]
fn tsv_and_json_hold_every_cell() {
    let s = sweep();
    let tsv = s.tsv();
    let lines: Vec<&str> = tsv.lines().collect();
    assert_eq!(lines.len(), 1 + s.cells.len());
    assert_eq!(lines[0].split('\t').count(), CELL_COLUMNS.len());
    assert!(lines
        .iter()
        .all(|l| l.split('\t').count() == CELL_COLUMNS.len()));
    // The mean of two runs, 264 and 284.
    assert!(lines[1].contains("\t274.0000\t"), "{}", lines[1]);
    let json: serde_json::Value = serde_json::from_str(&s.json()).unwrap();
    assert_eq!(json["cells"].as_array().unwrap().len(), 4);
    assert_eq!(json["cells"][3]["metrics"]["ttft_all_p95_ms"], "inf");
    assert_eq!(json["cells"][0]["runs"].as_array().unwrap().len(), 2);
}

#[test]
fn plots_are_written_as_svg_and_png() {
    let dir = std::env::temp_dir().join(format!("kvroute-report-plots-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let files = write_plots(&sweep(), &dir).unwrap();
    assert_eq!(files.len(), 3);
    for (_, svg) in &files {
        let text = std::fs::read_to_string(dir.join(svg)).unwrap();
        assert!(text.starts_with("<svg"), "{svg}");
        assert!(
            text.contains("\nround_robin\n") && text.contains("\nkv\n"),
            "{svg}: {text}"
        );
        let png = std::fs::read(dir.join(svg.replace(".svg", ".png"))).unwrap();
        assert_eq!(&png[..4], b"\x89PNG", "{svg}");
        assert!(png.len() > 5_000, "{svg}: {} bytes", png.len());
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn baseline_round_trips_and_rejects_bad_files() {
    let s = sweep();
    let b = Baseline::from_sweep(&s, "round_robin", 3, "multiturn", "test").unwrap();
    assert_eq!(b.points.len(), 2);
    assert_eq!(b.points[0].ttft_ms.p50, Some(274.0));
    let back = Baseline::parse(&b.to_json()).unwrap();
    assert_eq!(back, b);
    assert_eq!(b.at(60).unwrap().concurrency, 60);
    assert_eq!(b.at(85).unwrap().concurrency, 60);
    assert_eq!(b.at(95).unwrap().concurrency, 120);
    assert_eq!(b.at(1000).unwrap().concurrency, 120);
    assert!(matches!(
        Baseline::from_sweep(&s, "predictive", 3, "m", "t"),
        Err(BaselineError::Empty(_))
    ));
    let text = b.to_json();
    for (from, to) in [
        ("\"version\": 1", "\"version\": 2"),
        ("\"concurrency\": 120", "\"concurrency\": 60"),
        ("\"hit_rate\": 0.909", "\"hit_rate\": 1.5"),
        ("\"workers\": 3", "\"workers\": 0"),
    ] {
        assert!(text.contains(from), "{from}");
        let bad = text.replacen(from, to, 1);
        assert!(Baseline::parse(&bad).is_err(), "{to} accepted");
    }
    assert!(Baseline::parse("[1,2]").is_err());
    assert!(Baseline::parse("{\"format\":\"kvroute-baseline\"}").is_err());
}
