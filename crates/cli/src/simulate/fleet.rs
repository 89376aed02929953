//! The fleets a sweep runs: aggregated (every engine does both), or split into prefill and
//! decode pools (`--prefill-workers` / `--decode-workers`, once per `--disaggregation` mode),
//! or every split of N engines and the aggregated fleet of N (`--plan-pd N`), with the
//! planner's table of which serves the most goodput at each load.

use super::SimulateArgs;
use anyhow::{bail, Result};
use kvroute_core::policy::DisaggregationMode;
use kvroute_engine::Profile;
use std::fmt::Write as _;

/// Most engines `--plan-pd` splits (a split per prefill count).
pub(crate) const MAX_PLAN_ENGINES: usize = 64;

/// One fleet of a sweep.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Fleet {
    /// Engines in all.
    pub workers: usize,
    /// Of them, prefill-only engines (0: an aggregated fleet).
    pub prefill: usize,
    /// Of them, decode-only engines.
    pub decode: usize,
    /// How requests use the prefill pool (meaningless for an aggregated fleet).
    pub mode: DisaggregationMode,
}

impl Fleet {
    /// `n` engines that each do both.
    pub fn aggregated(n: usize) -> Self {
        Self {
            workers: n,
            prefill: 0,
            decode: 0,
            mode: DisaggregationMode::Auto,
        }
    }

    /// Whether it has a prefill pool.
    pub fn is_split(&self) -> bool {
        self.prefill > 0
    }

    /// Its name in labels: `w4`, or `w4 1p3d-auto` for a split.
    pub fn label(&self, sep: char) -> String {
        if self.is_split() {
            format!("w{}{sep}{}", self.workers, self.split_name())
        } else {
            format!("w{}", self.workers)
        }
    }

    /// A split's pools and mode: `1p3d-auto`.
    fn split_name(&self) -> String {
        format!("{}p{}d-{}", self.prefill, self.decode, self.mode.as_str())
    }

    /// A bench cell's policy name: the policy's, with the split after it (`goodput
    /// 1p3d-auto`), so a report's rows keep each fleet apart.
    pub fn policy_label(&self, policy: kvroute_core::PolicyKind) -> String {
        if self.is_split() {
            format!("{} {}", policy.as_str(), self.split_name())
        } else {
            policy.as_str().to_string()
        }
    }

    /// The shape alone, for the planner's columns: `aggregated` or `1P:3D auto`.
    fn shape(&self) -> String {
        if self.is_split() {
            format!("{}P:{}D {}", self.prefill, self.decode, self.mode.as_str())
        } else {
            "aggregated".to_string()
        }
    }
}

/// The fleets `a` asks for, checked.
pub(crate) fn fleets(a: &SimulateArgs) -> Result<Vec<Fleet>> {
    let mut modes = a.disaggregation.clone();
    modes.dedup();
    if modes.is_empty() {
        modes.push(DisaggregationMode::Auto);
    }
    let split = |prefill: usize, decode: usize| {
        modes.iter().map(move |&mode| Fleet {
            workers: prefill + decode,
            prefill,
            decode,
            mode,
        })
    };
    if let Some(n) = a.plan_pd {
        if !(2..=MAX_PLAN_ENGINES).contains(&n) {
            bail!("--plan-pd takes 2 to {MAX_PLAN_ENGINES} engines, got {n}");
        }
        let mut all = vec![Fleet::aggregated(n)];
        all.extend((1..n).flat_map(|p| split(p, n - p)));
        return Ok(all);
    }
    match (a.prefill_workers, a.decode_workers) {
        (None, None) => Ok(a.workers.iter().map(|&n| Fleet::aggregated(n)).collect()),
        (Some(p), Some(d)) if p >= 1 && d >= 1 && p + d <= 4096 => Ok(split(p, d).collect()),
        (Some(p), Some(d)) => {
            bail!("--prefill-workers and --decode-workers must each be >= 1 (4096 in all), got {p} and {d}")
        }
        _ => bail!("--prefill-workers and --decode-workers go together"),
    }
}

/// The bytes of KV per token the simulated link moves: `--kv-bytes-per-token`, else the
/// profile's model's (a profile derived from spec sheets), else the router's default.
pub(crate) fn kv_bytes_per_token(a: &SimulateArgs, p: &Profile) -> Option<f64> {
    a.kv_bytes_per_token
        .or_else(|| p.roofline.as_ref().map(|r| r.kv_bytes_per_token()))
}

/// The planner's table: per policy and load, each fleet's goodput (requests per second
/// meeting both objectives) and the one that serves the most.
pub(crate) fn plan_table(cells: &[(Fleet, String, String, Option<f64>)]) -> String {
    let mut shapes: Vec<Fleet> = Vec::new();
    for (f, ..) in cells {
        if !shapes.contains(f) {
            shapes.push(*f);
        }
    }
    let mut rows: Vec<(&str, &str)> = Vec::new();
    for (_, policy, level, _) in cells {
        if !rows.contains(&(policy.as_str(), level.as_str())) {
            rows.push((policy, level));
        }
    }
    let mut out = String::from(
        "\n## P:D plan (goodput: requests/s meeting both objectives)\n\n| policy | load |",
    );
    for f in &shapes {
        let _ = write!(out, " {} |", f.shape());
    }
    out.push_str(" best |\n|---|---|");
    out.push_str(&"---:|".repeat(shapes.len()));
    out.push_str("---|\n");
    for (policy, level) in rows {
        let _ = write!(out, "| {policy} | {level} |");
        let mut best: Option<(f64, &Fleet)> = None;
        for f in &shapes {
            let g = cells
                .iter()
                .find(|(cf, p, l, _)| cf == f && p == policy && l == level)
                .and_then(|(.., g)| *g);
            match g {
                Some(g) => {
                    let _ = write!(out, " {g:.3} |");
                    if best.is_none_or(|(b, _)| g > b) {
                        best = Some((g, f));
                    }
                }
                None => out.push_str(" - |"),
            }
        }
        let best = best.map_or_else(|| "-".to_string(), |(_, f)| f.shape());
        let _ = writeln!(out, " {best} |");
    }
    out
}
