//! `kvroute bench` as a user runs it: a simulated sweep and a short live one, with every
//! output file checked, and its refusals of options that do not go together.

mod common;

use common::{kvroute, kvroute_ok};
use std::path::Path;

fn temp_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("kvroute-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// The `sweep.json` a bench wrote into `dir`.
fn read_sweep(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("sweep.json")).unwrap()).unwrap()
}

/// The files every bench writes, checked for 2 policies x 2 concurrency levels x `runs`.
fn check_outputs(dir: &Path, runs: usize) -> serde_json::Value {
    let report = std::fs::read_to_string(dir.join("report.md")).unwrap();
    for needle in [
        "| concurrency | round_robin p50 | kv p50 | Δ |",
        "### KV cache hit rate",
        "### Requests (all runs)",
        "![TTFT p95 - 2 workers](ttft_p95-w2.svg)",
    ] {
        assert!(report.contains(needle), "{needle} missing:\n{report}");
    }
    let tsv = std::fs::read_to_string(dir.join("cells.tsv")).unwrap();
    assert_eq!(tsv.lines().count(), 5, "{tsv}");
    let sweep = read_sweep(dir);
    let cells = sweep["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 4);
    for c in cells {
        assert_eq!(c["runs"].as_array().unwrap().len(), runs, "{c}");
        assert!(c["metrics"]["sent"].as_u64().unwrap() > 0, "{c}");
    }
    for stem in ["ttft_p95-w2", "throughput-w2", "hit_rate-w2"] {
        assert!(dir.join(format!("{stem}.svg")).is_file(), "{stem}");
        let png = std::fs::read(dir.join(format!("{stem}.png"))).unwrap();
        assert_eq!(&png[..4], b"\x89PNG");
    }
    let records = std::fs::read_dir(dir.join("records")).unwrap().count();
    assert_eq!(records, 4 * runs);
    let baseline: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("baseline-round_robin-w2.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(baseline["format"], "kvroute-baseline");
    assert_eq!(baseline["points"].as_array().unwrap().len(), 2);
    sweep
}

#[test]
fn simulated_sweep_writes_the_report_plots_and_baseline() {
    let dir = temp_dir("bench-sim");
    let out = kvroute_ok(&[
        "bench",
        "--sim",
        "--profile",
        "mocker-poly",
        "--workload",
        "synthetic",
        "--workers",
        "2",
        "--policy",
        "round_robin,kv",
        "--concurrency",
        "2,4",
        "--duration-secs",
        "20",
        "--warmup-secs",
        "5",
        "--snapshots",
        "3",
        "--repeats",
        "2",
        "--slo-ttft-ms",
        "1000",
        "--out",
        dir.to_str().unwrap(),
    ]);
    let sweep = check_outputs(&dir, 2);
    // Runs differ by seed, so a cell's two runs are not copies of each other.
    let runs = sweep["cells"][1]["runs"].as_array().unwrap();
    assert_ne!(runs[0], runs[1]);
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        report.contains("### Highest concurrency under the SLO"),
        "{report}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn live_sweep_runs_fresh_fleets_and_kv_reuses_the_cache() {
    let dir = temp_dir("bench-live");
    kvroute_ok(&[
        "bench",
        "--profile",
        "tiny-fast",
        "--worker-speedup",
        "4",
        "--workers",
        "2",
        "--policy",
        "round_robin,kv",
        "--concurrency",
        "2,3",
        "--max-tokens",
        "16",
        "--duration-secs",
        "4",
        "--warmup-secs",
        "1",
        "--out",
        dir.to_str().unwrap(),
    ]);
    let sweep = check_outputs(&dir, 1);
    for c in sweep["cells"].as_array().unwrap() {
        let m = &c["metrics"];
        assert_eq!(m["failed"], 0, "{c}");
        assert!(m["completed"].as_u64().unwrap() >= 2, "{c}");
        if c["policy"] == "kv" {
            // Follow-up turns land where their history is cached.
            assert!(m["hit_rate"].as_f64().unwrap() > 0.3, "{c}");
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// A tenants spec for the tests: a chat tenant in a high band and one flooding at four
/// times its token quota.
const TWO_TENANTS: &str = r#"
[[flow.classes]]
name = "interactive"
band = 1

[[loads]]
tenant = "chat"
class = "interactive"
kind = "chat"
concurrency_per_worker = 1.0
multiturn = { starter_min_tokens = 200, starter_max_tokens = 300, max_tokens = 16 }

[[loads]]
tenant = "flood"
kind = "open"
quota_of_capacity = 0.1
rate_of_quota = 4.0
synthetic = { prefixes = 2, prefix_tokens = 64, suffix_tokens = 64, max_tokens = 16 }
"#;

#[test]
fn a_tenants_load_is_reported_by_tenant_simulated_and_live() {
    let dir = temp_dir("bench-tenants");
    std::fs::create_dir_all(&dir).unwrap();
    let spec = dir.join("tenants.toml");
    std::fs::write(&spec, TWO_TENANTS).unwrap();
    let workload = format!("tenants:{}", spec.display());
    for live in [false, true] {
        let out = dir.join(if live { "live" } else { "sim" });
        let mut args = vec![
            "bench",
            "--profile",
            "tiny-fast",
            "--workload",
            &workload,
            "--workers",
            "2",
            "--policy",
            "goodput",
            "--duration-secs",
            "6",
            "--warmup-secs",
            "1",
            "--out",
            out.to_str().unwrap(),
        ];
        if live {
            args.extend(["--worker-speedup", "4"]);
        } else {
            args.push("--sim");
        }
        kvroute_ok(&args);
        let report = std::fs::read_to_string(out.join("report.md")).unwrap();
        assert!(report.contains("## By tenant"), "{report}");
        assert!(report.contains("| chat | interactive |"), "{report}");
        assert!(report.contains("| flood | default |"), "{report}");
        let tenants: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("tenants.json")).unwrap())
                .unwrap();
        let run = &tenants["goodput-w2-run1"];
        assert!(run["chat"]["completed"].as_u64().unwrap() > 0, "{tenants}");
        // Only the flooding tenant is held to its quota: 429 `tenant_limit`, live as in the
        // simulator.
        let refused = if live {
            &run["flood"]["rejected_by_reason"]
        } else {
            &run["flood"]["refused"]
        };
        assert!(refused["tenant_limit"].as_u64().unwrap() > 0, "{tenants}");
        assert!(run["chat"].to_string().contains("interactive"), "{tenants}");
        if live {
            let config = std::fs::read_to_string(out.join("gateway-tenants.toml")).unwrap();
            assert!(config.contains("x-kvroute-tenant"), "{config}");
        } else {
            assert!(run["chat"]["isolation"].as_f64().is_some(), "{tenants}");
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// The demo's fleet, in the simulator on the demo's engine profile: at the slider's low end
/// both policies meet the objectives, round-robin leaves them first, and the default policy
/// holds to the slider's top (the claim the dashboard shows live; docs/dashboard.md).
#[test]
fn the_demo_fleet_shows_round_robin_leaving_the_objectives_first() {
    let dir = temp_dir("bench-demo-fleet");
    kvroute_ok(&[
        "bench",
        "--sim",
        "--profile",
        "demo",
        "--workers",
        "3",
        "--policy",
        "round_robin,goodput",
        "--concurrency",
        "60,120,160,180",
        "--ramp-secs",
        "30",
        "--warmup-secs",
        "60",
        "--duration-secs",
        "300",
        "--repeats",
        "2",
        "--out",
        dir.to_str().unwrap(),
    ]);
    let sweep = read_sweep(&dir);
    let meets = |policy: &str, level: u64| {
        let c = sweep["cells"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["policy"] == policy && c["load"]["concurrency"] == level)
            .unwrap_or_else(|| panic!("no cell {policy} at {level}"));
        let m = &c["metrics"];
        let (ttft, tpot) = (
            m["ttft_all_p95_ms"].as_f64().unwrap_or(f64::INFINITY),
            m["tpot_p95_ms"].as_f64().unwrap(),
        );
        (
            ttft <= 600.0 && tpot <= 60.0,
            format!("{policy} at {level}: TTFT p95 {ttft:.0} ms, TPOT p95 {tpot:.1} ms"),
        )
    };
    for (policy, level, expected) in [
        ("round_robin", 60, true),
        ("goodput", 60, true),
        ("round_robin", 160, false),
        ("round_robin", 180, false),
        ("goodput", 160, true),
        ("goodput", 180, true),
    ] {
        let (ok, figures) = meets(policy, level);
        assert_eq!(ok, expected, "{figures}");
    }
    let report = std::fs::read_to_string(dir.join("report.md")).unwrap();
    assert!(report.contains("| goodput | 180 |"), "{report}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn rate_sweeps_run_open_loops_in_the_simulator_and_live() {
    let dir = temp_dir("bench-rate");
    kvroute_ok(&[
        "bench",
        "--sim",
        "--workload",
        "synthetic",
        "--profile",
        "mocker-poly",
        "--workers",
        "2",
        "--policy",
        "kv",
        "--rate",
        "2,8",
        "--duration-secs",
        "30",
        "--warmup-secs",
        "0",
        "--json",
        "--out",
        dir.to_str().unwrap(),
    ]);
    let sweep = read_sweep(&dir);
    let cells = sweep["cells"].as_array().unwrap();
    let sent: Vec<u64> = cells
        .iter()
        .map(|c| c["metrics"]["sent"].as_u64().unwrap())
        .collect();
    assert_eq!(cells.len(), 2);
    assert_eq!(cells[1]["load"]["rate"], 8.0, "{}", cells[1]);
    // About rate x 30 s requests each: 60 and 240.
    assert!(
        (35..90).contains(&sent[0]) && (180..300).contains(&sent[1]),
        "{sent:?}"
    );
    std::fs::remove_dir_all(&dir).ok();

    let dir = temp_dir("bench-rate-live");
    kvroute_ok(&[
        "bench",
        "--profile",
        "tiny-fast",
        "--worker-speedup",
        "4",
        "--workers",
        "2",
        "--policy",
        "kv",
        "--rate",
        "4",
        "--max-tokens",
        "16",
        "--duration-secs",
        "3",
        "--out",
        dir.to_str().unwrap(),
    ]);
    let sweep = read_sweep(&dir);
    let cell = &sweep["cells"][0];
    assert_eq!(cell["load"]["rate"], 4.0, "{cell}");
    assert!(cell["metrics"]["completed"].as_u64() >= Some(3), "{cell}");
    assert_eq!(cell["metrics"]["failed"], 0, "{cell}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn options_that_do_not_go_together_are_refused() {
    for (args, says) in [
        (
            vec!["bench", "--sim", "--target", "http://127.0.0.1:1"],
            "cannot go with --sim",
        ),
        (vec!["bench", "--limit", "5"], "--limit is for --sim"),
        (
            vec!["bench", "--host-blocks", "64", "--duration-secs", "1"],
            "--host-blocks shapes the simulated fleet: use it with --sim",
        ),
        (
            vec!["bench", "--block-size", "32", "--duration-secs", "1"],
            "--block-size shapes the simulated fleet",
        ),
        (
            vec!["bench", "--sim", "--rate", "2", "--duration-secs", "5"],
            "runs multi-turn chat as a closed loop",
        ),
        (
            vec![
                "bench",
                "--sim",
                "--workload",
                "mooncake:x.jsonl",
                "--rate",
                "2",
            ],
            "use --speedup, not --rate",
        ),
        (
            vec!["bench", "--sim", "--repeats", "0"],
            "--repeats and --snapshots",
        ),
        (
            vec!["bench", "--sim", "--slo-ttft-ms", "0"],
            "--slo-ttft-ms must be > 0",
        ),
        (
            vec![
                "bench",
                "--target",
                "http://127.0.0.1:1",
                "--duration-secs",
                "1",
            ],
            "exactly one --policy",
        ),
    ] {
        let out = kvroute(&args);
        assert!(!out.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}
