//! The Markdown report of a sweep: the reference A/B tables (TTFT p50/p95 with Δ against the
//! baseline policy, goodput, KV hit rate, throughput and RPS, ITL, E2E, TPOT), the request accounting
//! with TTFT over every sent request, the highest load meeting the SLO per policy, and the
//! arrival deciles of saturated cells.

use crate::{Cell, Load, Metrics, Sweep};
use kvroute_workload::deciles_markdown;
use std::fmt::Write as _;

/// Which way a figure improves (the sign of Δ: positive is better, as in the reference).
#[derive(Clone, Copy)]
enum Better {
    Lower,
    Higher,
}

/// Δ of `v` against `base`, positive when `v` is better; None without both or with a zero
/// or infinite base.
pub fn delta(base: Option<f64>, v: Option<f64>, lower_is_better: bool) -> Option<f64> {
    let (b, v) = (base?, v?);
    if b == 0.0 || !b.is_finite() || !v.is_finite() {
        return None;
    }
    Some(if lower_is_better {
        (b - v) / b
    } else {
        (v - b) / b
    })
}

fn fmt_ms(v: Option<f64>) -> String {
    match v {
        None => "-".into(),
        Some(x) if x.is_infinite() => "inf".into(),
        Some(x) if x >= 10_000.0 => format!("{:.1} s", x / 1e3),
        Some(x) if x >= 100.0 => format!("{x:.0} ms"),
        Some(x) => format!("{x:.1} ms"),
    }
}

fn fmt_pct(v: Option<f64>) -> String {
    v.map_or("-".into(), |x| format!("{:.1}%", x * 100.0))
}

fn fmt_rate(v: Option<f64>) -> String {
    match v {
        None => "-".into(),
        Some(x) if x >= 100.0 => format!("{x:.0}"),
        Some(x) => format!("{x:.2}"),
    }
}

fn fmt_delta(d: Option<f64>) -> String {
    match d {
        None => "-".into(),
        Some(x) if x > 0.0 => format!("**+{:.1}%**", x * 100.0),
        Some(x) => format!("{:.1}%", x * 100.0),
    }
}

struct Column {
    title: &'static str,
    get: fn(&Metrics) -> Option<f64>,
    fmt: fn(Option<f64>) -> String,
    better: Option<Better>,
}

/// A table: one row per load level, for each column one value per policy, and a Δ after
/// every policy but the baseline when the column has a direction.
fn table(s: &Sweep, workers: usize, columns: &[Column]) -> String {
    let policies = s.policies();
    let base = s.info.baseline_policy.as_str();
    let loads = s.loads(workers);
    let Some(first) = loads.first() else {
        return String::new();
    };
    let mut head = format!("| {} |", first.axis());
    let mut rule = String::from("| ---: |");
    for col in columns {
        for p in &policies {
            let _ = write!(head, " {p} {} |", col.title);
            rule.push_str(" ---: |");
            if col.better.is_some() && *p != base && policies.contains(&base) {
                head.push_str(" Δ |");
                rule.push_str(" ---: |");
            }
        }
    }
    let mut out = format!("{head}\n{rule}\n");
    for load in &loads {
        let _ = write!(out, "| {} |", load.label());
        for col in columns {
            let base_v = s
                .cell(base, workers, *load)
                .and_then(|c| (col.get)(&c.metrics));
            for p in &policies {
                let v = s
                    .cell(p, workers, *load)
                    .and_then(|c| (col.get)(&c.metrics));
                let _ = write!(out, " {} |", (col.fmt)(v));
                if let Some(b) = col.better {
                    if *p != base && policies.contains(&base) {
                        let d = delta(base_v, v, matches!(b, Better::Lower));
                        let _ = write!(out, " {} |", fmt_delta(d));
                    }
                }
            }
        }
        out.push('\n');
    }
    out
}

fn col(
    title: &'static str,
    get: fn(&Metrics) -> Option<f64>,
    fmt: fn(Option<f64>) -> String,
    better: Option<Better>,
) -> Column {
    Column {
        title,
        get,
        fmt,
        better,
    }
}

/// Whether a cell is saturated: it lost requests, or its TTFT p95 over all sent requests
/// breaks the TTFT objective.
pub fn saturated(cell: &Cell, slo_ttft_p95_ms: Option<f64>) -> bool {
    let m = &cell.metrics;
    m.failed + m.rejected > 0
        || slo_ttft_p95_ms.is_some_and(|l| m.ttft_all_p95_ms.is_none_or(|v| v > l))
}

/// The report. `plots` are image files (relative to the report) to show under their titles.
pub fn markdown(s: &Sweep, plots: &[(String, String)]) -> String {
    let i = &s.info;
    let mut out = format!("# {}\n\n", i.title);
    let _ = writeln!(out, "- setup: {}", i.setup);
    let _ = writeln!(out, "- workload: {}", i.workload);
    let _ = writeln!(
        out,
        "- runs per cell: {} (figures are their mean)",
        i.repeats
    );
    let _ = writeln!(out, "- window: {}", i.window);
    let _ = writeln!(
        out,
        "- Δ: against `{}`; positive is better (lower latency, higher throughput)",
        i.baseline_policy
    );
    let limits: Vec<String> = [("TTFT", i.slo_ttft_p95_ms), ("TPOT", i.slo_tpot_p95_ms)]
        .into_iter()
        .filter_map(|(name, v)| v.map(|v| format!("{name} p95 ≤ {v} ms")))
        .collect();
    let slo = if limits.is_empty() {
        "none".to_string()
    } else {
        limits.join(" and ")
    };
    let _ = writeln!(out, "- SLO: {slo} (TTFT over every sent request)");
    out.push_str(
        "- latencies cover completed requests; \"all sent\" counts every failed or refused \
         request as an infinite TTFT\n",
    );
    let lower = Some(Better::Lower);
    for w in s.worker_counts() {
        let _ = writeln!(out, "\n## {w} workers\n");
        out.push_str("### TTFT\n\n");
        out.push_str(&table(
            s,
            w,
            &[
                col("p50", |m| m.ttft_p50_ms, fmt_ms, lower),
                col("p95", |m| m.ttft_p95_ms, fmt_ms, lower),
            ],
        ));
        out.push_str(
            "\n### Goodput (requests per second meeting both objectives, each on its own TTFT and TPOT)\n\n",
        );
        out.push_str(&table(
            s,
            w,
            &[col(
                "goodput/s",
                |m| m.goodput_per_s,
                fmt_rate,
                Some(Better::Higher),
            )],
        ));
        out.push_str("\n### KV cache hit rate (cached / input tokens)\n\n");
        out.push_str(&table(s, w, &[col("hit", |m| m.hit_rate, fmt_pct, None)]));
        out.push_str("\n### Throughput\n\n");
        out.push_str(&table(
            s,
            w,
            &[
                col(
                    "out tok/s",
                    |m| m.output_tokens_per_s,
                    fmt_rate,
                    Some(Better::Higher),
                ),
                col("RPS", |m| m.requests_per_s, fmt_rate, None),
            ],
        ));
        out.push_str("\n### ITL\n\n");
        out.push_str(&table(
            s,
            w,
            &[
                col("p50", |m| m.itl_p50_ms, fmt_ms, lower),
                col("p95", |m| m.itl_p95_ms, fmt_ms, lower),
            ],
        ));
        out.push_str("\n### TPOT\n\n");
        out.push_str(&table(
            s,
            w,
            &[
                col("p50", |m| m.tpot_p50_ms, fmt_ms, lower),
                col("p95", |m| m.tpot_p95_ms, fmt_ms, lower),
            ],
        ));
        out.push_str("\n### End-to-end latency\n\n");
        out.push_str(&table(
            s,
            w,
            &[
                col("p50", |m| m.e2e_p50_ms, fmt_ms, lower),
                col("p95", |m| m.e2e_p95_ms, fmt_ms, lower),
            ],
        ));
        out.push_str(&requests_table(s, w));
        out.push_str(&slo_table(s, w));
        out.push_str(&over_time(s, w));
    }
    if !plots.is_empty() {
        out.push_str("\n## Plots\n");
        for (title, file) in plots {
            let _ = write!(out, "\n### {title}\n\n![{title}]({file})\n");
        }
    }
    out
}

fn requests_table(s: &Sweep, w: usize) -> String {
    let mut out = String::from(
        "\n### Requests (all runs) and TTFT over every sent request\n\n\
         | load | policy | sent | completed | failed | rejected | all-sent TTFT p50 | p95 | p99 |\n\
         | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    for load in s.loads(w) {
        for p in s.policies() {
            if let Some(c) = s.cell(p, w, load) {
                let m = &c.metrics;
                let _ = writeln!(
                    out,
                    "| {} | {p} | {} | {} | {} | {} | {} | {} | {} |",
                    load.label(),
                    m.sent,
                    m.completed,
                    m.failed,
                    m.rejected,
                    fmt_ms(m.ttft_all_p50_ms),
                    fmt_ms(m.ttft_all_p95_ms),
                    fmt_ms(m.ttft_all_p99_ms)
                );
            }
        }
    }
    out
}

/// The highest load level of each policy that meets the SLO, with every lower level
/// meeting it too (a policy that fails at 60 but passes at 80 is not credited with 80).
pub fn max_load_under_slo(s: &Sweep, w: usize, policy: &str) -> Option<Load> {
    let mut best = None;
    for load in s.loads(w) {
        let cell = s.cell(policy, w, load)?;
        if !cell
            .metrics
            .meets(s.info.slo_ttft_p95_ms, s.info.slo_tpot_p95_ms)
        {
            break;
        }
        best = Some(load);
    }
    best
}

fn slo_table(s: &Sweep, w: usize) -> String {
    if s.info.slo_ttft_p95_ms.is_none() && s.info.slo_tpot_p95_ms.is_none() {
        return String::new();
    }
    let axis = s.loads(w).first().map_or("load", |l| l.axis());
    let mut out = format!(
        "\n### Highest {axis} under the SLO\n\n| policy | highest {axis} meeting the SLO |\n| --- | ---: |\n"
    );
    for p in s.policies() {
        let best = max_load_under_slo(s, w, p).map_or("none of those run".into(), |l| l.label());
        let _ = writeln!(out, "| {p} | {best} |");
    }
    out
}

fn over_time(s: &Sweep, w: usize) -> String {
    let mut out = String::new();
    for c in s.cells.iter().filter(|c| c.workers == w) {
        if c.deciles.is_empty() || !saturated(c, s.info.slo_ttft_p95_ms) {
            continue;
        }
        if out.is_empty() {
            out.push_str(
                "\n### Cells breaking the TTFT objective or losing requests, over time (first run, requests by arrival decile)\n",
            );
        }
        let _ = write!(
            out,
            "\n#### {} at {} {}\n\n{}",
            c.policy,
            c.load.axis(),
            c.load.label(),
            deciles_markdown(&c.deciles)
        );
    }
    out
}
