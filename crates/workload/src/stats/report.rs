//! Text renderings: a Markdown table of summaries and a TSV of request records. Pure string
//! building; the caller writes the result where it wants.

use super::{RequestRecord, Status, Summary};
use std::fmt::Write as _;

/// Columns of the Markdown table.
const MD_COLUMNS: [&str; 20] = [
    "run",
    "sent",
    "completed",
    "failed",
    "rejected",
    "TTFT p50 ms",
    "TTFT p95 ms",
    "TTFT p99 ms",
    "TTFT p95 all sent ms",
    "TPOT p50 ms",
    "TPOT p95 ms",
    "ITL p50 ms",
    "ITL p95 ms",
    "E2E p50 ms",
    "E2E p95 ms",
    "hit rate",
    "predicted / cached",
    "output tok/s",
    "req/s",
    "goodput req/s",
];

/// The header and separator lines of the Markdown table (each line ends with a newline).
pub fn markdown_header() -> String {
    let mut s = format!("| {} |\n", MD_COLUMNS.join(" | "));
    s.push('|');
    for (i, _) in MD_COLUMNS.iter().enumerate() {
        s.push_str(if i == 0 { " --- |" } else { " ---: |" });
    }
    s.push('\n');
    s
}

/// A Markdown table: header, then one row per `(label, summary)`.
pub fn markdown_table(rows: &[(&str, &Summary)]) -> String {
    let mut s = markdown_header();
    for (label, summary) in rows {
        s.push_str(&markdown_row(label, summary));
    }
    s
}

/// A number with `decimals` places, `-` when absent, `inf` when infinite.
fn num(v: Option<f64>, decimals: usize) -> String {
    match v {
        None => "-".into(),
        Some(x) if x.is_infinite() => if x > 0.0 { "inf" } else { "-inf" }.into(),
        Some(x) if x.is_nan() => "-".into(),
        Some(x) => format!("{x:.decimals$}"),
    }
}

fn md_cell(text: &str) -> String {
    text.replace('|', "\\|").replace(['\n', '\r'], " ")
}

pub(super) fn markdown_row(label: &str, m: &Summary) -> String {
    let cells = [
        md_cell(label),
        m.sent.to_string(),
        m.completed.to_string(),
        m.failed.to_string(),
        m.rejected.to_string(),
        num(m.ttft_ms.p50, 1),
        num(m.ttft_ms.p95, 1),
        num(m.ttft_ms.p99, 1),
        num(m.ttft_all_ms.p95, 1),
        num(m.tpot_ms.p50, 2),
        num(m.tpot_ms.p95, 2),
        num(m.itl_ms.p50, 2),
        num(m.itl_ms.p95, 2),
        num(m.e2e_ms.p50, 1),
        num(m.e2e_ms.p95, 1),
        num(m.hit_rate, 4),
        num(m.prediction_ratio, 3),
        num(m.output_tokens_per_s, 1),
        num(m.requests_per_s, 3),
        num(m.goodput.as_ref().and_then(|g| g.per_s), 3),
    ];
    format!("| {} |\n", cells.join(" | "))
}

/// Columns of [`records_tsv`], in order.
pub const TSV_COLUMNS: [&str; 19] = [
    "id",
    "worker",
    "session",
    "arrival_ms",
    "first_token_ms",
    "finished_ms",
    "ttft_ms",
    "tpot_ms",
    "e2e_ms",
    "input_tokens",
    "cached_tokens",
    "predicted_cached_tokens",
    "output_tokens",
    "status",
    "reason",
    "itl_gaps",
    "itl_mean_ms",
    "itl_max_ms",
    "prefill_worker",
];

fn opt<T: ToString>(v: Option<T>) -> String {
    v.map(|x| x.to_string()).unwrap_or_default()
}

fn ms3(v: Option<f64>) -> String {
    v.map(|x| format!("{x:.3}")).unwrap_or_default()
}

fn tsv_cell(text: &str) -> String {
    text.replace(['\t', '\n', '\r'], " ")
}

/// Workers named as the demo and the simulator name them, `worker-1` to `worker-N`, by
/// the number records use (0 to N - 1).
pub fn numbered_workers(n: usize) -> Vec<String> {
    (1..=n).map(|i| format!("worker-{i}")).collect()
}

/// Records as TSV: a header line of [`TSV_COLUMNS`], then one line per record, times in
/// milliseconds since the run's origin (three decimals), absent values empty; the worker
/// (and the prefill worker of a split request) by its name in `workers` (indexed by the
/// record's number; the number itself when the list has no name for it).
pub fn records_tsv(records: &[RequestRecord], workers: &[String]) -> String {
    let mut s = TSV_COLUMNS.join("\t");
    s.push('\n');
    for r in records {
        let (status, reason) = match &r.status {
            Status::Completed => ("completed", ""),
            Status::Failed(why) => ("failed", why.as_str()),
            Status::Rejected(why) => ("rejected", why.as_str()),
        };
        let gaps: u64 = r.itl.iter().map(|&(_, c)| u64::from(c)).sum();
        let total: f64 = r.itl.iter().map(|&(g, c)| g * f64::from(c)).sum();
        let max = r
            .itl
            .iter()
            .filter(|&&(_, c)| c > 0)
            .map(|&(g, _)| g)
            .fold(None, |m: Option<f64>, g| Some(m.map_or(g, |m| m.max(g))));
        let at = |t: Option<kvroute_core::Time>| ms3(t.map(|t| t.as_secs_f64() * 1e3));
        let name = |w: Option<u64>| {
            w.map_or_else(String::new, |w| {
                usize::try_from(w)
                    .ok()
                    .and_then(|i| workers.get(i))
                    .map_or_else(|| w.to_string(), |name| tsv_cell(name))
            })
        };
        let fields = [
            r.id.to_string(),
            name(r.worker),
            opt(r.session),
            at(Some(r.arrival)),
            at(r.first_token),
            at(r.finished),
            ms3(r.ttft().map(|d| d.as_secs_f64() * 1e3)),
            ms3(r.tpot_secs().map(|x| x * 1e3)),
            ms3(r.e2e().map(|d| d.as_secs_f64() * 1e3)),
            r.input_tokens.to_string(),
            r.cached_tokens.to_string(),
            r.predicted_cached_tokens.to_string(),
            r.output_tokens.to_string(),
            status.to_string(),
            tsv_cell(reason),
            gaps.to_string(),
            ms3((gaps > 0).then(|| total / gaps as f64 * 1e3)),
            ms3(max.map(|g| g * 1e3)),
            name(r.prefill_worker),
        ];
        let _ = writeln!(s, "{}", fields.join("\t"));
    }
    s
}
