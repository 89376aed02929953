//! The `kvroute` binary as a user runs it.

mod common;

use common::{kvroute, kvroute_ok};

#[test]
fn hash_prints_full_blocks_only() {
    let out = kvroute_ok(&["hash", "--tokens", "1,2,3,4,5,6,7,8,9", "--block-size", "4"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["tokens"], 9);
    assert_eq!(v["local"].as_array().unwrap().len(), 2);
    assert_eq!(
        v["sequence"][0], v["local"][0],
        "the first sequence hash is the local one"
    );
    assert_ne!(v["sequence"][1], v["local"][1]);
}

#[test]
fn bad_input_is_a_clear_error() {
    let out = kvroute(&["hash", "--tokens", "1,2", "--block-size", "0"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("block size must be between 1"), "{err}");
    assert!(!err.contains("panicked"));
    let out = kvroute(&["hash", "--tokens", "1,x"]);
    assert_eq!(out.status.code(), Some(2), "clap usage error");
    // A tenants spec that is not one: the file and the field named.
    let out = kvroute(&["simulate", "--workload", "tenants:/nonexistent/t.toml"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("reading tenants spec /nonexistent/t.toml"),
        "{err}"
    );
    let out = kvroute(&["loadgen", "--tenants", "/nonexistent/t.toml"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("/nonexistent/t.toml"),
        "{err}"
    );
}

#[test]
fn simulate_prints_one_json_object_per_cell() {
    let out = kvroute_ok(&[
        "simulate",
        "--profile",
        "tiny",
        "--workload",
        "synthetic",
        "--workers",
        "1,2",
        "--policy",
        "round_robin,kv",
        "--concurrency",
        "2",
        "--limit",
        "10",
        "--slo-ttft-ms",
        "1000",
        "--json",
    ]);
    let cells: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(cells.len(), 4);
    for c in &cells {
        for key in [
            "policy",
            "workers",
            "concurrency",
            "sent",
            "completed",
            "failed",
            "rejected",
            "ttft_ms",
            "tpot_ms",
            "itl_ms",
            "e2e_ms",
            "hit_rate",
            "output_tokens_per_s",
            "requests_per_s",
            "sim_seconds",
            "wall_seconds",
        ] {
            assert!(c.get(key).is_some(), "{key} missing from {c}");
        }
        assert_eq!(c["sent"], 10);
        assert!(c["goodput"]["met"].as_u64().unwrap() <= 10, "{c}");
    }
    assert_eq!(cells[3]["workers"], 2);
    assert_eq!(cells[3]["policy"], "kv");
}

#[test]
fn simulate_gives_engines_a_host_tier_the_router_tracks() {
    let run = |extra: &[&str]| {
        let mut args = vec![
            "simulate",
            "--profile",
            "mocker-poly",
            "--workload",
            "multiturn",
            "--workers",
            "2",
            "--policy",
            "kv",
            "--concurrency",
            "4",
            "--limit",
            "40",
            "--num-gpu-blocks",
            "200",
            "--json",
        ];
        args.extend_from_slice(extra);
        kvroute(&args)
    };
    let cell = |out: std::process::Output| -> serde_json::Value {
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let device = cell(run(&[]));
    let tiered = cell(run(&["--host-blocks", "4096", "--host-load-ratio", "0.2"]));
    assert_eq!(device["host_blocks_held"], 0);
    assert!(tiered["host_blocks_held"].as_u64().unwrap() > 0, "{tiered}");
    assert_eq!(tiered["kv_events_rejected"], 0, "{tiered}");
    assert!(
        tiered["hit_rate"].as_f64().unwrap() > device["hit_rate"].as_f64().unwrap(),
        "{tiered} {device}"
    );
    let bad = run(&["--host-blocks", "8", "--host-load-ratio", "2"]);
    assert!(!bad.status.success());
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("host_load_ratio"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );
    let bad = run(&["--host-blocks", "8", "--host-load-secs-per-token=-1"]);
    assert!(String::from_utf8_lossy(&bad.stderr).contains("host_load_secs_per_token"));
}

#[test]
fn simulate_reports_a_bad_trace_line_by_number() {
    let dir = std::env::temp_dir().join(format!("kvroute-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let trace = dir.join("bad.jsonl");
    std::fs::write(
        &trace,
        "{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 2, \"hash_ids\": [0]}\nnot json\n",
    )
    .unwrap();
    let arg = format!("mooncake:{}", trace.display());
    let out = kvroute(&["simulate", "--profile", "tiny", "--workload", &arg]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("line 2"), "{err}");
    let out = kvroute(&[
        "simulate",
        "--workload",
        "mooncake:/nonexistent/trace.jsonl",
    ]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("opening trace"));
    let out = kvroute(&["simulate", "--profile", "b200"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown profile"));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn simulate_writes_records_and_a_report() {
    let dir = std::env::temp_dir().join(format!("kvroute-out-{}", std::process::id()));
    let out = kvroute_ok(&[
        "simulate",
        "--profile",
        "tiny",
        "--workload",
        "synthetic",
        "--workers",
        "2",
        "--policy",
        "kv",
        "--concurrency",
        "3",
        "--limit",
        "12",
        "--out",
        dir.to_str().unwrap(),
    ]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("| kv w2 c3 |"), "{table}");
    let report = std::fs::read_to_string(dir.join("report.md")).unwrap();
    assert!(report.contains("| kv w2 c3 |"));
    assert!(report.contains("### kv w2 c3"), "{report}");
    assert!(report.contains("| decile |"));
    let tsv = std::fs::read_to_string(dir.join("kv-w2-c3.tsv")).unwrap();
    assert_eq!(tsv.lines().count(), 13, "a header and one line per request");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn simulate_reads_conversation_starters_from_a_directory() {
    let dir = std::env::temp_dir().join(format!("kvroute-starters-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for i in 0..3 {
        let text = format!("Document {i}. ") + &"Some words about a topic. ".repeat(40);
        std::fs::write(dir.join(format!("{i}.txt")), text).unwrap();
    }
    let args = [
        "simulate",
        "--profile",
        "mocker-poly",
        "--workload",
        "multiturn",
        "--workers",
        "2",
        "--policy",
        "kv",
        "--concurrency",
        "2",
        "--limit",
        "6",
        "--json",
        "--starters",
    ];
    let mut args: Vec<&str> = args.to_vec();
    args.push(dir.to_str().unwrap());
    let out = kvroute_ok(&args);
    let cell: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(cell["completed"], 6);
    assert!(
        cell["hit_rate"].as_f64().unwrap() > 0.5,
        "follow-up turns reuse their history"
    );
    std::fs::write(dir.join("bad.txt"), [0xff, 0xfe]).unwrap();
    let out = kvroute(&args);
    assert!(String::from_utf8_lossy(&out.stderr).contains("UTF-8"));
    std::fs::remove_dir_all(&dir).ok();
    let out = kvroute(&["simulate", "--starters", "/nonexistent/dir"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("starters directory"));
}
