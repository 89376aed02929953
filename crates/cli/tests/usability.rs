//! What a user reads and types, run as processes on 127.0.0.1: one spelling per setting
//! across commands (old spellings still accepted), `serve --max-batch` as the batch limit of
//! workers that give none, workers named alike in every output, `bench`'s progress per
//! cell off a terminal, and `loadgen` failing loudly when no request succeeded.

mod common;
#[path = "common/server.rs"]
mod server;

use common::{kvroute, kvroute_ok};
use kvroute_testkit::get_json;
use server::Server;
use std::path::{Path, PathBuf};

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kvroute-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A loopback URL where nothing listens (a port just bound and released).
fn nothing_listens() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    drop(l);
    format!("http://127.0.0.1:{port}")
}

/// The `worker` column of a records TSV file.
fn worker_column(file: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(file).unwrap();
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap().split('\t').collect();
    let col = header.iter().position(|c| *c == "worker").unwrap();
    lines
        .map(|l| l.split('\t').nth(col).unwrap_or_default().to_string())
        .collect()
}

#[test]
fn every_command_spells_a_setting_one_way_and_lists_the_old_spelling_as_an_alias() {
    for (command, flag, alias) in [
        ("serve", "--max-batch", "--max-num-seqs"),
        ("epp", "--max-batch", "--max-num-seqs"),
        ("worker", "--max-batch", "--max-num-seqs"),
        ("worker", "--max-batched-tokens", "--max-num-batched-tokens"),
        ("simulate", "--max-batch", "--max-num-seqs"),
        ("bench", "--max-batch", "--max-num-seqs"),
        ("loadgen", "--slo-ttft-ms", "--slo-ttft-p95-ms"),
        ("loadgen", "--slo-tpot-ms", "--slo-tpot-p95-ms"),
        ("demo", "--slo-ttft-ms", "--slo-ttft-p95-ms"),
        ("simulate", "--slo-ttft-ms", "--slo-tpot-ms"),
        ("bench", "--slo-ttft-ms", "--slo-tpot-ms"),
    ] {
        let out = kvroute_ok(&[command, "--help"]);
        let help = String::from_utf8_lossy(&out.stdout);
        assert!(
            help.contains(&format!("  {flag} ")),
            "{command}: {flag} missing:\n{help}"
        );
        assert!(help.contains(alias), "{command}: {alias} missing:\n{help}");
    }
    // The old spellings still work.
    kvroute_ok(&[
        "simulate",
        "--profile",
        "tiny",
        "--workload",
        "synthetic",
        "--workers",
        "1",
        "--policy",
        "kv",
        "--concurrency",
        "2",
        "--limit",
        "4",
        "--max-num-seqs",
        "2",
        "--max-num-batched-tokens",
        "256",
    ]);
    let out = kvroute(&[
        "loadgen",
        "--target",
        &nothing_listens(),
        "--conversations",
        "1",
        "--slo-ttft-p95-ms",
        "500",
        "--slo-tpot-p95-ms",
        "50",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no request succeeded"), "{err}");
}

#[tokio::test]
async fn serve_max_batch_is_the_batch_limit_of_workers_that_give_none() {
    let dir = temp_dir("serve-max-batch");
    let config = dir.join("gateway.toml");
    // The first worker gives its own (in vLLM's spelling, an alias); the second none.
    std::fs::write(
        &config,
        format!(
            "[[workers]]\nurl = \"{}\"\nname = \"own\"\nmax_num_seqs = 3\n\n\
             [[workers]]\nurl = \"{}\"\nname = \"default\"\n",
            nothing_listens(),
            nothing_listens()
        ),
    )
    .unwrap();
    let client = reqwest::Client::new();
    for (flag, expected) in [
        (Some("--max-batch"), Some(7)),
        (Some("--max-num-seqs"), Some(7)),
        (None, None),
    ] {
        let mut args = vec!["serve", "--port", "0", "--config", config.to_str().unwrap()];
        if let Some(f) = flag {
            args.extend([f, "7"]);
        }
        let gw = Server::start(&args);
        let url = gw.value_after("kvroute gateway on ");
        let workers = get_json(&client, &format!("{url}/debug/workers")).await;
        let batch = |name: &str| {
            workers["workers"]
                .as_array()
                .unwrap()
                .iter()
                .find(|w| w["worker"]["name"] == name)
                .map(|w| w["capacity"]["max_batch"].as_u64())
                .unwrap_or_else(|| panic!("no worker {name}: {workers}"))
        };
        assert_eq!(batch("own"), Some(3), "{flag:?}: {workers}");
        assert_eq!(batch("default"), expected, "{flag:?}: {workers}");
        // (A clean stop is servers.rs's to test: dropping kills the process.)
        drop(gw);
    }
    let out = kvroute(&[
        "serve",
        "--config",
        config.to_str().unwrap(),
        "--max-batch",
        "0",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--max-batch"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

#[tokio::test]
async fn workers_are_named_alike_in_explanations_and_records() {
    let mut workers = Vec::new();
    let mut specs = Vec::new();
    for name in ["w-a", "w-b"] {
        let (w, spec) = server::zmq_worker(name);
        specs.push(spec);
        workers.push(w);
    }
    let mut args = vec!["serve", "--port", "0", "--tokenizer", "builtin"];
    for s in &specs {
        args.extend(["--worker", s.as_str()]);
    }
    let gw = Server::start(&args);
    let url = gw.value_after("kvroute gateway on ");
    // The gateway's names of its workers (`--worker` gives none: their host and port).
    let listing = get_json(&reqwest::Client::new(), &format!("{url}/debug/workers")).await;
    let names: Vec<String> = listing["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["worker"]["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names.len(), 2, "{listing}");
    assert!(
        names.iter().all(|n| n.starts_with("127.0.0.1:")),
        "{names:?}"
    );

    // `/debug/explain`: workers and the winner by name, their numbers as `id`.
    let ex: serde_json::Value = reqwest::Client::new()
        .post(format!("{url}/debug/explain"))
        .json(&serde_json::json!({"model": "kvroute-sim", "messages": [{"role": "user", "content": "Hello!"}]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let listed: Vec<&str> = ex["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["worker"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(listed, names, "{ex}");
    assert_eq!(ex["workers"][1]["id"], 2, "{ex}");
    assert!(names.iter().any(|n| ex["winner"] == n.as_str()), "{ex}");

    // `loadgen --out`: the records name the workers as the gateway does.
    let dir = temp_dir("records-names");
    let out = tokio::task::spawn_blocking({
        let (url, dir) = (url.clone(), dir.clone());
        move || {
            kvroute(&[
                "loadgen",
                "--target",
                &url,
                "--conversations",
                "4",
                "--concurrency",
                "2",
                "--max-tokens",
                "4",
                "--out",
                dir.to_str().unwrap(),
            ])
        }
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let column = worker_column(&dir.join("records.tsv"));
    assert!(!column.is_empty());
    for w in &column {
        assert!(names.contains(w), "{names:?}: {column:?}");
    }
    drop((gw, workers));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn bench_off_a_terminal_prints_each_finished_cell_with_the_time_left() {
    let dir = temp_dir("bench-progress");
    let out = kvroute_ok(&[
        "bench",
        "--sim",
        "--profile",
        "tiny",
        "--workload",
        "synthetic",
        "--workers",
        "2",
        "--policy",
        "round_robin,kv",
        "--concurrency",
        "2,4",
        "--duration-secs",
        "10",
        "--warmup-secs",
        "2",
        "--snapshots",
        "1",
        "--out",
        dir.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("bench: 4 cells x 1 run(s) = 4 runs, on the fleet simulator"),
        "{err}"
    );
    let cells: Vec<&str> = err.lines().filter(|l| l.contains(" done in ")).collect();
    assert_eq!(cells.len(), 4, "{err}");
    for (i, cell) in [
        "round_robin-w2-c2",
        "kv-w2-c2",
        "round_robin-w2-c4",
        "kv-w2-c4",
    ]
    .iter()
    .enumerate()
    {
        let line = cells[i];
        assert!(
            line.starts_with(&format!("bench: cell {}/4 {cell} done in ", i + 1)),
            "{line}"
        );
        assert!(
            line.contains(" elapsed, ~") && line.ends_with(" left"),
            "{line}"
        );
    }
    assert!(cells[3].ends_with("~0s left"), "{}", cells[3]);
    // The simulator's records name workers as the demo does.
    let column = worker_column(&dir.join("records").join("kv-w2-c4-run1.tsv"));
    assert!(column.iter().any(|w| w == "worker-1"), "{column:?}");
    assert!(
        column.iter().all(|w| w == "worker-1" || w == "worker-2"),
        "{column:?}"
    );
    std::fs::remove_dir_all(&dir).ok();

    // Live: the runs' duration tells the time left before any has finished.
    let dir = temp_dir("bench-progress-live");
    let out = kvroute_ok(&[
        "bench",
        "--profile",
        "tiny-fast",
        "--worker-speedup",
        "4",
        "--workers",
        "2",
        "--policy",
        "kv",
        "--concurrency",
        "2",
        "--max-tokens",
        "8",
        "--duration-secs",
        "2",
        "--warmup-secs",
        "0",
        "--snapshots",
        "1",
        "--out",
        dir.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("bench: 1 cells x 1 run(s) = 1 runs, live, 2 s each: about 2s"),
        "{err}"
    );
    assert!(
        err.lines()
            .any(|l| l.starts_with("bench: cell 1/1 kv-w2-c2 done in ")),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn loadgen_exits_non_zero_and_says_why_when_no_request_succeeded() {
    let target = nothing_listens();
    let dir = temp_dir("loadgen-nothing");
    let out = kvroute(&[
        "loadgen",
        "--target",
        &target,
        "--conversations",
        "3",
        "--max-tokens",
        "4",
        "--out",
        dir.to_str().unwrap(),
    ]);
    assert!(!out.status.success(), "it exited 0");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "no request succeeded: 3 sent to {target}, 3 failed (3 connect): nothing answers at {target}"
        )),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    // The table and the records are still there to read.
    assert!(String::from_utf8_lossy(&out.stdout).contains("| c8 |"));
    assert_eq!(worker_column(&dir.join("records.tsv")).len(), 3);
    // With --json the summary still goes to stdout, the reason to stderr.
    let out = kvroute(&[
        "loadgen",
        "--target",
        &target,
        "--conversations",
        "1",
        "--json",
    ]);
    assert!(!out.status.success());
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["failed"], 1);
    assert!(String::from_utf8_lossy(&out.stderr).contains("nothing answers"));
    std::fs::remove_dir_all(&dir).ok();
}
