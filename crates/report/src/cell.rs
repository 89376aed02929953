//! Sweep cells: one policy at one fleet size and one load level, with its runs, and the
//! sweep that holds them (what was run, how, and the cells).

use crate::Metrics;
use kvroute_workload::Decile;
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;

/// The load level of a cell.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Load {
    /// A closed loop of this many clients (conversations) in flight.
    Concurrency(usize),
    /// An open loop at this many requests per second.
    Rate(f64),
    /// A trace replayed at this speed-up.
    Speedup(f64),
}

impl Load {
    /// The level as a number (the x axis of the plots).
    pub fn value(&self) -> f64 {
        match *self {
            Load::Concurrency(c) => c as f64,
            Load::Rate(r) | Load::Speedup(r) => r,
        }
    }

    /// What the level is, for a column header.
    pub fn axis(&self) -> &'static str {
        match self {
            Load::Concurrency(_) => "concurrency",
            Load::Rate(_) => "rate (req/s)",
            Load::Speedup(_) => "speed-up",
        }
    }

    /// The level as written in a table.
    pub fn label(&self) -> String {
        match *self {
            Load::Concurrency(c) => c.to_string(),
            Load::Rate(r) => format!("{r} req/s"),
            Load::Speedup(x) => format!("{x}x"),
        }
    }
}

/// One cell of a sweep.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Cell {
    /// Routing policy.
    pub policy: String,
    /// Workers (engine replicas).
    pub workers: usize,
    /// Load level.
    pub load: Load,
    /// The mean over the runs.
    pub metrics: Metrics,
    /// Each run (each the mean of its snapshots, when it took several).
    pub runs: Vec<Metrics>,
    /// The first run's requests by arrival decile (saturation over time).
    pub deciles: Vec<Decile>,
}

impl Cell {
    /// A cell from its runs.
    pub fn new(
        policy: &str,
        workers: usize,
        load: Load,
        runs: Vec<Metrics>,
        deciles: Vec<Decile>,
    ) -> Self {
        Self {
            policy: policy.to_string(),
            workers,
            load,
            metrics: Metrics::mean(&runs),
            runs,
            deciles,
        }
    }
}

/// What a sweep ran, for the report's header.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct SweepInfo {
    /// Title, e.g. `kvroute bench --sim`.
    pub title: String,
    /// Back end and what it ran on (profile, target), one line.
    pub setup: String,
    /// Workload, one line.
    pub workload: String,
    /// Runs per cell.
    pub repeats: usize,
    /// Warm-up and measurement window, one line.
    pub window: String,
    /// The policy others are compared with (Δ columns).
    pub baseline_policy: String,
    /// Service objective: TTFT p95, ms.
    pub slo_ttft_p95_ms: Option<f64>,
    /// Service objective: TPOT p95, ms.
    pub slo_tpot_p95_ms: Option<f64>,
}

/// A whole sweep.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Sweep {
    /// What was run.
    pub info: SweepInfo,
    /// The cells, in the order they ran.
    pub cells: Vec<Cell>,
}

/// Columns of [`Sweep::tsv`].
pub const CELL_COLUMNS: &[&str] = &[
    "policy",
    "workers",
    "load_kind",
    "load",
    "runs",
    "sent",
    "completed",
    "failed",
    "rejected",
    "ttft_p50_ms",
    "ttft_p95_ms",
    "ttft_p99_ms",
    "ttft_all_p50_ms",
    "ttft_all_p95_ms",
    "ttft_all_p99_ms",
    "tpot_p50_ms",
    "tpot_p95_ms",
    "itl_p50_ms",
    "itl_p95_ms",
    "e2e_p50_ms",
    "e2e_p95_ms",
    "hit_rate",
    "output_tokens_per_s",
    "requests_per_s",
    "goodput_per_s",
];

fn num(v: Option<f64>) -> String {
    match v {
        Some(x) if x.is_infinite() => "inf".into(),
        Some(x) => format!("{x:.4}"),
        None => String::new(),
    }
}

impl Sweep {
    /// The policies, in order of first appearance.
    pub fn policies(&self) -> Vec<&str> {
        let mut out: Vec<&str> = Vec::new();
        for c in &self.cells {
            if !out.contains(&c.policy.as_str()) {
                out.push(&c.policy);
            }
        }
        out
    }

    /// The fleet sizes, ascending.
    pub fn worker_counts(&self) -> Vec<usize> {
        let mut w: Vec<usize> = self.cells.iter().map(|c| c.workers).collect();
        w.sort_unstable();
        w.dedup();
        w
    }

    /// The load levels run at `workers`, ascending.
    pub fn loads(&self, workers: usize) -> Vec<Load> {
        let mut out: Vec<Load> = Vec::new();
        for c in self.cells.iter().filter(|c| c.workers == workers) {
            if !out.contains(&c.load) {
                out.push(c.load);
            }
        }
        out.sort_by(|a, b| a.value().total_cmp(&b.value()));
        out
    }

    /// The cell of `policy` at `workers` and `load`.
    pub fn cell(&self, policy: &str, workers: usize, load: Load) -> Option<&Cell> {
        self.cells
            .iter()
            .find(|c| c.policy == policy && c.workers == workers && c.load == load)
    }

    /// One line per cell (the mean over its runs), tab-separated, with a header line.
    pub fn tsv(&self) -> String {
        let mut out = CELL_COLUMNS.join("\t");
        out.push('\n');
        for c in &self.cells {
            let m = &c.metrics;
            let kind = match c.load {
                Load::Concurrency(_) => "concurrency",
                Load::Rate(_) => "rate",
                Load::Speedup(_) => "speedup",
            };
            let fields = [
                c.policy.clone(),
                c.workers.to_string(),
                kind.into(),
                c.load.value().to_string(),
                c.runs.len().to_string(),
                m.sent.to_string(),
                m.completed.to_string(),
                m.failed.to_string(),
                m.rejected.to_string(),
                num(m.ttft_p50_ms),
                num(m.ttft_p95_ms),
                num(m.ttft_p99_ms),
                num(m.ttft_all_p50_ms),
                num(m.ttft_all_p95_ms),
                num(m.ttft_all_p99_ms),
                num(m.tpot_p50_ms),
                num(m.tpot_p95_ms),
                num(m.itl_p50_ms),
                num(m.itl_p95_ms),
                num(m.e2e_p50_ms),
                num(m.e2e_p95_ms),
                num(m.hit_rate),
                num(m.output_tokens_per_s),
                num(m.requests_per_s),
                num(m.goodput_per_s),
            ];
            let _ = writeln!(out, "{}", fields.join("\t"));
        }
        out
    }

    /// The whole sweep as pretty JSON.
    pub fn json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }
}
