//! The Grafana board (`deploy/kubernetes/base/monitoring/kvroute-dashboard.json`) against what
//! is exported: every query filtered by the board's variables (two A/B arms scraped by one
//! Prometheus are never summed), every engine panel over vLLM's, SGLang's and kvroute's own
//! names, every vLLM name present in a real vLLM 0.32 engine's `/metrics` (a fixture), every
//! SGLang name in SGLang's source (a list), every kvroute and load generator name exported by a
//! running demo, and every query parsed by Prometheus's own parser (`promtool`).

#[path = "common/server.rs"]
mod server;

use kvroute_testkit::{eventually, get_json};
use serde_json::Value;
use server::Server;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(path: &str) -> String {
    let p = root().join(path);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn board() -> Value {
    serde_json::from_str(&read(
        "deploy/kubernetes/base/monitoring/kvroute-dashboard.json",
    ))
    .unwrap()
}

/// Every panel, those inside rows included.
fn panels(board: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    for p in board["panels"].as_array().unwrap() {
        out.push(p);
        out.extend(p["panels"].as_array().into_iter().flatten());
    }
    out
}

/// (panel title, query) of every target.
fn queries(board: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for p in panels(board) {
        for t in p["targets"].as_array().into_iter().flatten() {
            let title = p["title"].as_str().unwrap_or_default().to_string();
            out.push((title, t["expr"].as_str().unwrap().to_string()));
        }
    }
    out
}

/// The query variables' PromQL (`label_values(METRIC, LABEL)` and the like).
fn variable_queries(board: &Value) -> Vec<(String, String)> {
    board["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|v| v["type"] == "query")
        .map(|v| {
            let q = v["query"]["query"].as_str().or(v["query"].as_str());
            (v["name"].as_str().unwrap().to_string(), q.unwrap().into())
        })
        .collect()
}

/// A vector selector of a PromQL expression: the metric's name and its label matchers' text.
#[derive(Debug, PartialEq)]
struct Selector {
    name: String,
    matchers: String,
}

/// Index just past the string literal starting at `i` (a quote), escapes skipped.
fn skip_string(b: &[u8], mut i: usize) -> usize {
    let quote = b[i];
    i += 1;
    while i < b.len() && b[i] != quote {
        i += if b[i] == b'\\' { 2 } else { 1 };
    }
    i + 1
}

/// Index just past the bracket closing the one at `i` (strings inside skipped).
fn skip_group(b: &[u8], i: usize, close: u8) -> usize {
    let mut j = i + 1;
    while j < b.len() && b[j] != close {
        j = if b[j] == b'"' || b[j] == b'\'' {
            skip_string(b, j)
        } else {
            j + 1
        };
    }
    j + 1
}

/// The vector selectors of a PromQL expression: identifiers that are neither functions,
/// keywords, nor label names of a grouping, with the matchers that follow them.
fn selectors(expr: &str) -> Vec<Selector> {
    const KEYWORDS: [&str; 5] = ["and", "or", "unless", "bool", "offset"];
    const GROUPINGS: [&str; 6] = [
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
    ];
    let b = expr.as_bytes();
    let next_non_space = |mut j: usize| {
        while j < b.len() && b[j].is_ascii_whitespace() {
            j += 1;
        }
        j
    };
    let next_word = |j: usize| {
        let end = expr[j..]
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
            .map_or(expr.len(), |k| j + k);
        &expr[j..end]
    };
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == b'"' || c == b'\'' {
            i = skip_string(b, i);
        } else if c == b'[' {
            i = skip_group(b, i, b']');
        } else if c == b'{' {
            // Matchers without a name before them: `{__name__="..."}`.
            let end = skip_group(b, i, b'}').min(b.len());
            out.push(Selector {
                name: String::new(),
                matchers: expr[i + 1..end - 1].to_string(),
            });
            i = end;
        } else if c.is_ascii_digit() || c == b'.' {
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'.') {
                i += 1;
            }
        } else if c.is_ascii_alphabetic() || c == b'_' || c == b':' {
            let start = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_' || b[i] == b':') {
                i += 1;
            }
            let word = &expr[start..i];
            let j = next_non_space(i);
            if GROUPINGS.contains(&word) {
                if j < b.len() && b[j] == b'(' {
                    i = skip_group(b, j, b')');
                }
            } else if KEYWORDS.contains(&word)
                || (j < b.len() && b[j] == b'(')
                || ["by", "without"].contains(&next_word(j))
            {
                // An operator, a function's name, or an aggregation before its grouping.
            } else if j < b.len() && b[j] == b'{' {
                let end = skip_group(b, j, b'}').min(b.len());
                out.push(Selector {
                    name: word.to_string(),
                    matchers: expr[j + 1..end - 1].to_string(),
                });
                i = end;
            } else {
                out.push(Selector {
                    name: word.to_string(),
                    matchers: String::new(),
                });
            }
        } else {
            i += 1;
        }
    }
    out
}

/// Which exporter a metric name belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Family {
    Vllm,
    Sglang,
    /// kvroute's simulated workers (`kvroute_engine_*`).
    KvrouteEngine,
    /// The gateway (other `kvroute_*`).
    Gateway,
    Loadgen,
}

fn family(name: &str) -> Option<Family> {
    if name.starts_with("vllm:") {
        Some(Family::Vllm)
    } else if name.starts_with("sglang:") {
        Some(Family::Sglang)
    } else if name.starts_with("kvroute_engine_") {
        Some(Family::KvrouteEngine)
    } else if name.starts_with("kvroute_") {
        Some(Family::Gateway)
    } else if name.starts_with("loadgen_") {
        Some(Family::Loadgen)
    } else {
        None
    }
}

/// The matcher every selector of a family must carry: the load generator's series by its arm,
/// everything else by the namespace of one stack (gateway and engines).
fn required_matcher(f: Family) -> &'static str {
    match f {
        Family::Loadgen => r#"arm=~"$arm""#,
        _ => r#"namespace=~"$namespace""#,
    }
}

/// The sample names of a Prometheus text exposition.
fn sample_names(text: &str) -> BTreeSet<String> {
    kvroute_protocol::prometheus_text::samples(text)
        .map(|s| s.name.to_string())
        .collect()
}

/// The names of a list fixture: one a line, `#` comments.
fn listed_names(text: &str) -> BTreeSet<String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(str::to_string)
        .collect()
}

/// Every metric name the board queries, by family (panels and variables).
fn board_names(board: &Value) -> Vec<(Family, String)> {
    let mut out = BTreeSet::new();
    for (title, expr) in queries(board).into_iter().chain(variable_queries(board)) {
        // Grafana's label_values(METRIC, LABEL): the metric is its first argument.
        let expr = match expr.strip_prefix("label_values(") {
            Some(args) => args.rsplit_once(',').map_or(args, |(m, _)| m).to_string(),
            None => expr,
        };
        for s in selectors(&expr) {
            let f = family(&s.name);
            assert!(f.is_some(), "{title}: `{}` is no metric we know", s.name);
            out.insert((f.unwrap(), s.name));
        }
    }
    out.into_iter().collect()
}

#[test]
fn the_promql_scanner_finds_selectors_and_skips_functions_groupings_and_strings() {
    let got = selectors(
        r#"sum by (instance, pod) (rate(vllm:x_sum{namespace=~"$ns", a="}{or"}[1m])) / on (pod) group_left (le) y
        or histogram_quantile(0.95, sum without (le) (z_bucket offset 5m)) > bool 1e3 unless byte_x"#,
    );
    let names: Vec<&str> = got.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["vllm:x_sum", "y", "z_bucket", "byte_x"]);
    assert_eq!(got[0].matchers, r#"namespace=~"$ns", a="}{or""#);
    assert_eq!(got[1].matchers, "");
}

#[test]
fn every_query_is_filtered_by_the_boards_variables() {
    let board = board();
    let vars: Vec<&str> = board["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v["name"].as_str())
        .collect();
    for v in ["DS_PROMETHEUS", "namespace", "arm"] {
        assert!(vars.contains(&v), "no variable {v}: {vars:?}");
    }
    let qs = queries(&board);
    assert!(qs.len() >= 25, "{qs:?}");
    for (title, expr) in &qs {
        let sels = selectors(expr);
        assert!(!sels.is_empty(), "{title}: no metric in {expr}");
        for s in sels {
            let want = required_matcher(family(&s.name).unwrap_or(Family::Gateway));
            assert!(
                s.matchers.contains(want),
                "{title}: {} is not filtered by {want} in {expr}",
                s.name
            );
        }
    }
    // The engine panels read each engine family's own names, a target's first family kept.
    let engine_panels: Vec<&(String, String)> = qs
        .iter()
        .filter(|(_, e)| {
            selectors(e)
                .iter()
                .any(|s| family(&s.name) == Some(Family::Vllm))
        })
        .collect();
    assert!(engine_panels.len() >= 4, "{engine_panels:?}");
    for (title, expr) in engine_panels {
        let fams: BTreeSet<Family> = selectors(expr)
            .iter()
            .filter_map(|s| family(&s.name))
            .collect();
        assert_eq!(
            fams,
            BTreeSet::from([Family::Vllm, Family::Sglang, Family::KvrouteEngine]),
            "{title}: {expr}"
        );
        assert_eq!(expr.matches("\nor ").count(), 2, "{title}: {expr}");
        assert!(expr.contains("by (instance, pod)"), "{title}: {expr}");
    }
}

#[test]
fn the_per_worker_row_stacks_engine_in_flight_and_the_slo_panels_show_in_flight_on_the_right() {
    let board = board();
    let all = panels(&board);
    let stacked_engine_inflight = all.iter().any(|p| {
        p["fieldConfig"]["defaults"]["custom"]["stacking"]["mode"] == "normal"
            && p["targets"].as_array().into_iter().flatten().any(|t| {
                let e = t["expr"].as_str().unwrap_or_default();
                e.contains("vllm:num_requests_running") && e.contains("vllm:num_requests_waiting")
            })
    });
    assert!(
        stacked_engine_inflight,
        "no stacked per-engine in-flight panel"
    );
    for name in ["queue_time_seconds", "kv_cache_usage_perc"] {
        assert!(
            queries(&board).iter().any(|(_, e)| e.contains(name)),
            "no panel over vLLM's {name}"
        );
    }
    // Every panel with an objective (a threshold drawn) plots the gateway's in-flight
    // requests on a right axis, without the objective's line.
    let slo: Vec<&&Value> = all
        .iter()
        .filter(|p| {
            p["fieldConfig"]["defaults"]["custom"]["thresholdsStyle"]["mode"]
                .as_str()
                .is_some_and(|m| m.starts_with("line"))
        })
        .collect();
    assert!(slo.len() >= 2, "{} SLO panels", slo.len());
    for p in slo {
        let inflight = p["targets"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| {
                t["expr"]
                    .as_str()
                    .is_some_and(|e| e.starts_with("sum(kvroute_inflight_requests{"))
            })
            .unwrap_or_else(|| panic!("{}: no in-flight series", p["title"]));
        let legend = &inflight["legendFormat"];
        let o = p["fieldConfig"]["overrides"]
            .as_array()
            .unwrap()
            .iter()
            .find(|o| o["matcher"]["id"] == "byName" && &o["matcher"]["options"] == legend)
            .unwrap_or_else(|| panic!("{}: no override for {legend}", p["title"]));
        let prop = |id: &str| {
            o["properties"]
                .as_array()
                .unwrap()
                .iter()
                .find(|x| x["id"] == id)
                .map(|x| x["value"].clone())
        };
        assert_eq!(
            prop("custom.axisPlacement"),
            Some("right".into()),
            "{}",
            p["title"]
        );
        assert_eq!(
            prop("custom.thresholdsStyle"),
            Some(serde_json::json!({"mode": "off"})),
            "{}",
            p["title"]
        );
    }
}

#[test]
fn every_engine_name_the_board_queries_is_in_a_real_engines_metrics() {
    let vllm = sample_names(&read("crates/cli/tests/fixtures/vllm-0.32.0-metrics.txt"));
    let sglang = listed_names(&read(
        "crates/cli/tests/fixtures/sglang-0.5.23-metric-names.txt",
    ));
    // The fixtures are what they say (a real exposition, a real list).
    assert!(vllm.contains("vllm:num_requests_running"), "{vllm:?}");
    assert!(vllm.len() >= 40, "{vllm:?}");
    assert!(sglang.contains("sglang:num_running_reqs"), "{sglang:?}");
    let names = board_names(&board());
    let mut missing = Vec::new();
    for (f, n) in &names {
        let known = match f {
            Family::Vllm => &vllm,
            Family::Sglang => &sglang,
            _ => continue,
        };
        if !known.contains(n) {
            missing.push(n);
        }
    }
    assert!(
        missing.is_empty(),
        "the board queries engine metrics the engines do not export: {missing:?}"
    );
    for f in [Family::Vllm, Family::Sglang] {
        assert!(names.iter().filter(|(g, _)| *g == f).count() >= 4, "{f:?}");
    }
}

#[test]
fn promtool_parses_every_query() {
    let board = board();
    if !kvroute_testkit::runs("promtool".as_ref()) {
        assert!(
            std::env::var_os("KVROUTE_REQUIRE_PROMTOOL").is_none(),
            "promtool is not installed"
        );
        eprintln!("promtool not found: queries not parsed");
        return;
    }
    // Each query as a recording rule, the variables given values (Grafana substitutes them
    // before the query reaches Prometheus); label_values() is Grafana's, not PromQL.
    let rules: Vec<Value> = queries(&board)
        .iter()
        .enumerate()
        .map(|(i, (_, e))| {
            let expr = e
                .replace("$namespace", "kvroute-demo")
                .replace("$arm", "goodput");
            serde_json::json!({"record": format!("board:query_{i}"), "expr": expr})
        })
        .collect();
    let file = serde_json::json!({"groups": [{"name": "board", "rules": rules}]});
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("board-rules.yml");
    std::fs::write(&path, file.to_string()).unwrap();
    let out = std::process::Command::new("promtool")
        .args(["check", "rules"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn every_metric_the_grafana_board_queries_is_exported() {
    let wanted: Vec<String> = board_names(&board())
        .into_iter()
        .filter(|(f, _)| matches!(f, Family::Gateway | Family::Loadgen | Family::KvrouteEngine))
        .map(|(_, n)| n)
        .collect();
    assert!(wanted.len() >= 15, "{wanted:?}");

    // The demo with a short load, so that every labelled series exists.
    let demo = Server::start(&[
        "demo",
        "--port",
        "0",
        "--ui-port",
        "0",
        "--speedup",
        "20",
        "--slider-min",
        "4",
    ]);
    let gateway = demo.value_after("gateway ");
    let worker = demo.value_after("worker-1 at ");
    let ui = demo.value_after("dashboard ");
    let ui = ui.trim_end_matches('/');
    let client = reqwest::Client::new();
    let r = client.post(format!("{ui}/api/start")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    // Two turns completed by every arm (the status lists them; one window without arms).
    let completed = eventually(Duration::from_secs(60), async || {
        let s = get_json(&client, &format!("{ui}/api/status")).await;
        let done = |w: &Value| w["summary"]["completed"].as_u64() >= Some(2);
        match s["arms"].as_array() {
            Some(arms) if !arms.is_empty() => arms.iter().all(|a| done(&a["window"])),
            _ => done(&s["window"]),
        }
    })
    .await;
    assert!(completed, "no two turns completed in 60 s");
    let mut exported = BTreeSet::new();
    for url in [gateway.as_str(), worker.as_str(), ui] {
        let text = client
            .get(format!("{url}/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        exported.extend(sample_names(&text));
    }
    let missing: Vec<&String> = wanted.iter().filter(|m| !exported.contains(*m)).collect();
    assert!(
        missing.is_empty(),
        "the board queries metrics nobody exports: {missing:?}"
    );
    assert!(demo.interrupt(), "the demo did not stop cleanly");

    // The scrape config is valid Prometheus configuration.
    let config = root().join("deploy/prometheus/prometheus.yml");
    match std::process::Command::new("promtool")
        .args(["check", "config"])
        .arg(&config)
        .output()
    {
        Ok(out) => assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        ),
        Err(_) if std::env::var_os("KVROUTE_REQUIRE_PROMTOOL").is_none() => {
            eprintln!("promtool not found: scrape config not checked")
        }
        Err(e) => panic!("promtool: {e}"),
    }
}
