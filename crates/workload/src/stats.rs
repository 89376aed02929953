//! Per-request records and the summary of a run.
//!
//! A driver (simulator, load generator) fills one [`RequestRecord`] per request sent;
//! [`Summary::from_records`] turns them into the numbers every report states: counts by
//! outcome and reason, latency distributions (exact percentiles, see [`mod@percentile`]), KV hit
//! rate, prediction accuracy, throughput and goodput.
//!
//! Definitions:
//! - TTFT = first token - arrival; E2E = finished - arrival; TPOT = (E2E - TTFT) /
//!   (output_tokens - 1), for requests with at least two output tokens; ITL = the gaps between
//!   consecutive tokens, run-length encoded per request.
//! - Latency distributions, token sums, the hit rate and throughput cover *completed*
//!   requests. `ttft_all_ms` covers *every sent* request, a request that was rejected, failed
//!   or has no first-token time counting as an infinite TTFT: shedding load cannot pass for
//!   speed. In JSON an infinite value is the string `"inf"`, a missing one `null`.

mod deciles;
pub mod percentile;
mod report;

pub use deciles::{deciles, deciles_markdown, Decile};
pub use percentile::{percentile, weighted_percentile, Distribution};
pub use report::{markdown_header, markdown_table, numbered_workers, records_tsv, TSV_COLUMNS};

use kvroute_core::{RequestId, Time};
use serde::{Deserialize, Serialize, Serializer};
use std::collections::BTreeMap;
use std::time::Duration;

/// How a request ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// All its tokens arrived.
    Completed,
    /// It was dispatched but failed (engine error, timeout, dropped stream), with the reason.
    Failed(String),
    /// It was refused before dispatch (shed, queue full), with the reason code.
    Rejected(String),
}

/// What happened to one request.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RequestRecord {
    /// The request.
    pub id: RequestId,
    /// The worker that served it (decoded it, when another prefilled it), if dispatched.
    pub worker: Option<u64>,
    /// The worker that computed its prompt, when it was not `worker` (disaggregated
    /// prefill).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefill_worker: Option<u64>,
    /// Its session (conversation), if any.
    pub session: Option<u64>,
    /// When it was sent.
    pub arrival: Time,
    /// When its first token arrived.
    pub first_token: Option<Time>,
    /// When its last token arrived (or it failed).
    pub finished: Option<Time>,
    /// Prompt tokens.
    pub input_tokens: u64,
    /// Prompt tokens the engine found in its KV cache (its `usage`).
    pub cached_tokens: u64,
    /// Prompt tokens the router predicted to be cached on the chosen worker.
    pub predicted_cached_tokens: u64,
    /// Tokens generated.
    pub output_tokens: u64,
    /// How it ended.
    pub status: Status,
    /// Inter-token gaps as `(gap in seconds, how many consecutive gaps of that length)`.
    pub itl: Vec<(f64, u32)>,
}

impl RequestRecord {
    /// A record of a request sent at `arrival`, with nothing known yet beyond its prompt
    /// length (status `Completed`, to be set by the driver).
    pub fn new(id: RequestId, arrival: Time, input_tokens: u64) -> Self {
        Self {
            id,
            worker: None,
            prefill_worker: None,
            session: None,
            arrival,
            first_token: None,
            finished: None,
            input_tokens,
            cached_tokens: 0,
            predicted_cached_tokens: 0,
            output_tokens: 0,
            status: Status::Completed,
            itl: Vec::new(),
        }
    }

    /// Whether it completed.
    pub fn is_completed(&self) -> bool {
        self.status == Status::Completed
    }

    /// Time to first token.
    pub fn ttft(&self) -> Option<Duration> {
        self.first_token.map(|t| t.since(self.arrival))
    }

    /// End-to-end latency.
    pub fn e2e(&self) -> Option<Duration> {
        self.finished.map(|t| t.since(self.arrival))
    }

    /// Time per output token after the first, in seconds; `None` below two output tokens.
    pub fn tpot_secs(&self) -> Option<f64> {
        if self.output_tokens < 2 {
            return None;
        }
        let (first, end) = (self.first_token?, self.finished?);
        Some(end.since(first).as_secs_f64() / (self.output_tokens - 1) as f64)
    }

    /// Records `count` gaps of `gap_secs`, merging with the previous run when equal.
    pub fn push_gaps(&mut self, gap_secs: f64, count: u32) {
        if count == 0 {
            return;
        }
        match self.itl.last_mut() {
            Some((g, c)) if *g == gap_secs => *c = c.saturating_add(count),
            _ => self.itl.push((gap_secs, count)),
        }
    }
}

/// A service level objective for goodput; an unset limit always holds.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS))]
#[serde(default, deny_unknown_fields)]
pub struct Slo {
    /// Largest TTFT, in milliseconds.
    pub ttft_ms: Option<f64>,
    /// Largest TPOT, in milliseconds (requests with one output token pass it).
    pub tpot_ms: Option<f64>,
}

impl Slo {
    /// A class's objectives (seconds, each where it sets one) over this run-wide one.
    pub fn with_class(&self, ttft_secs: Option<f64>, tpot_secs: Option<f64>) -> Slo {
        Slo {
            ttft_ms: ttft_secs.map(|v| v * 1e3).or(self.ttft_ms),
            tpot_ms: tpot_secs.map(|v| v * 1e3).or(self.tpot_ms),
        }
    }

    /// Whether a record meets the objective (it must have completed with a first token).
    pub fn met_by(&self, r: &RequestRecord) -> bool {
        let Some(ttft) = r.ttft() else {
            return false;
        };
        let ttft_ok = self
            .ttft_ms
            .is_none_or(|max| ttft.as_secs_f64() * 1e3 <= max);
        let tpot_ok = match (self.tpot_ms, r.tpot_secs()) {
            (Some(max), Some(t)) => t * 1e3 <= max,
            _ => true,
        };
        r.is_completed() && ttft_ok && tpot_ok
    }
}

/// Requests meeting the SLO.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS))]
pub struct Goodput {
    /// The objective.
    pub slo: Slo,
    /// Requests that met it.
    pub met: u64,
    /// Of the requests sent, the fraction that met it.
    pub fraction_of_sent: Option<f64>,
    /// Requests meeting it per second of the run.
    pub per_s: Option<f64>,
}

/// TTFT percentiles over every sent request, failures and rejections counting as infinite.
/// Serialized with `"inf"` for infinite values and `null` without requests.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS))]
pub struct AllSentTtft {
    /// Median, in milliseconds.
    #[serde(serialize_with = "inf_as_string")]
    #[cfg_attr(feature = "ts", ts(type = r#"number | "inf" | null"#))]
    pub p50: Option<f64>,
    /// 95th percentile, in milliseconds.
    #[serde(serialize_with = "inf_as_string")]
    #[cfg_attr(feature = "ts", ts(type = r#"number | "inf" | null"#))]
    pub p95: Option<f64>,
    /// 99th percentile, in milliseconds.
    #[serde(serialize_with = "inf_as_string")]
    #[cfg_attr(feature = "ts", ts(type = r#"number | "inf" | null"#))]
    pub p99: Option<f64>,
}

fn inf_as_string<S: Serializer>(v: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
    match v {
        None => s.serialize_none(),
        Some(x) if x.is_infinite() && *x > 0.0 => s.serialize_str("inf"),
        Some(x) if x.is_finite() => s.serialize_f64(*x),
        Some(_) => s.serialize_none(),
    }
}

/// The summary of a run.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS))]
pub struct Summary {
    /// Requests sent (records given).
    pub sent: u64,
    /// Requests completed.
    pub completed: u64,
    /// Requests that failed after dispatch.
    pub failed: u64,
    /// Requests rejected before dispatch.
    pub rejected: u64,
    /// Failures by reason.
    pub failed_by_reason: BTreeMap<String, u64>,
    /// Rejections by reason.
    pub rejected_by_reason: BTreeMap<String, u64>,
    /// Length of the run, in seconds.
    pub duration_secs: f64,
    /// TTFT of completed requests, in milliseconds.
    pub ttft_ms: Distribution,
    /// TTFT over all sent requests, failures and rejections infinite, in milliseconds.
    pub ttft_all_ms: AllSentTtft,
    /// TPOT of completed requests with two or more output tokens, in milliseconds.
    pub tpot_ms: Distribution,
    /// Inter-token gaps of completed requests, each gap weighted once, in milliseconds.
    pub itl_ms: Distribution,
    /// End-to-end latency of completed requests, in milliseconds.
    pub e2e_ms: Distribution,
    /// Prompt tokens of completed requests.
    pub input_tokens: u64,
    /// Cached prompt tokens of completed requests, as the engines reported.
    pub cached_tokens: u64,
    /// Cached prompt tokens of completed requests, as the router predicted.
    pub predicted_cached_tokens: u64,
    /// Output tokens of completed requests.
    pub output_tokens: u64,
    /// KV hit rate: cached / input tokens of completed requests.
    pub hit_rate: Option<f64>,
    /// Predicted / actual cached tokens (1 = the router's view matched the engines' on
    /// aggregate).
    pub prediction_ratio: Option<f64>,
    /// Sum over completed requests of |predicted - cached|, over the sum of input tokens (0 =
    /// every prediction exact).
    pub prediction_error: Option<f64>,
    /// Output tokens of completed requests per second.
    pub output_tokens_per_s: Option<f64>,
    /// Completed requests per second.
    pub requests_per_s: Option<f64>,
    /// Requests meeting the SLO, when one was given.
    pub goodput: Option<Goodput>,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn ratio(a: f64, b: f64) -> Option<f64> {
    (b > 0.0).then(|| a / b)
}

impl Summary {
    /// Summarizes records of a run that lasted `duration` (for the rates; `None` rates when
    /// it is zero), without an SLO.
    pub fn from_records(records: &[RequestRecord], duration: Duration) -> Self {
        Self::from_records_with_slo(records, duration, None)
    }

    /// Summarizes records, with goodput against `slo` when given.
    pub fn from_records_with_slo<'a>(
        records: impl IntoIterator<Item = &'a RequestRecord>,
        duration: Duration,
        slo: Option<&Slo>,
    ) -> Self {
        let secs = duration.as_secs_f64();
        let mut failed_by_reason = BTreeMap::new();
        let mut rejected_by_reason = BTreeMap::new();
        let (mut ttft, mut ttft_all, mut tpot, mut e2e) = (vec![], vec![], vec![], vec![]);
        let mut itl: Vec<(f64, u64)> = Vec::new();
        let (mut input, mut cached, mut predicted, mut output, mut abs_err) =
            (0u64, 0u64, 0u64, 0u64, 0u64);
        let (mut completed, mut sent, mut met) = (0u64, 0u64, 0u64);
        for r in records {
            sent += 1;
            met += u64::from(slo.is_some_and(|slo| slo.met_by(r)));
            match &r.status {
                Status::Failed(reason) => *failed_by_reason.entry(reason.clone()).or_insert(0) += 1,
                Status::Rejected(reason) => {
                    *rejected_by_reason.entry(reason.clone()).or_insert(0) += 1
                }
                Status::Completed => {}
            }
            let done = r.is_completed();
            ttft_all.push(match (done, r.ttft()) {
                (true, Some(t)) => ms(t),
                _ => f64::INFINITY,
            });
            if !done {
                continue;
            }
            completed += 1;
            ttft.extend(r.ttft().map(ms));
            e2e.extend(r.e2e().map(ms));
            tpot.extend(r.tpot_secs().map(|s| s * 1e3));
            itl.extend(r.itl.iter().map(|&(g, c)| (g * 1e3, u64::from(c))));
            input += r.input_tokens;
            cached += r.cached_tokens;
            predicted += r.predicted_cached_tokens;
            output += r.output_tokens;
            abs_err += r.predicted_cached_tokens.abs_diff(r.cached_tokens);
        }
        percentile::sort(&mut ttft_all);
        let goodput = slo.map(|slo| Goodput {
            slo: slo.clone(),
            met,
            fraction_of_sent: ratio(met as f64, sent as f64),
            per_s: ratio(met as f64, secs),
        });
        Self {
            sent,
            completed,
            failed: failed_by_reason.values().sum(),
            rejected: rejected_by_reason.values().sum(),
            failed_by_reason,
            rejected_by_reason,
            duration_secs: secs,
            ttft_ms: Distribution::of(&mut ttft),
            ttft_all_ms: AllSentTtft {
                p50: percentile(&ttft_all, 0.50),
                p95: percentile(&ttft_all, 0.95),
                p99: percentile(&ttft_all, 0.99),
            },
            tpot_ms: Distribution::of(&mut tpot),
            itl_ms: Distribution::of_weighted(&mut itl),
            e2e_ms: Distribution::of(&mut e2e),
            input_tokens: input,
            cached_tokens: cached,
            predicted_cached_tokens: predicted,
            output_tokens: output,
            hit_rate: ratio(cached as f64, input as f64),
            prediction_ratio: ratio(predicted as f64, cached as f64),
            prediction_error: ratio(abs_err as f64, input as f64),
            output_tokens_per_s: ratio(output as f64, secs),
            requests_per_s: ratio(completed as f64, secs),
            goodput,
        }
    }

    /// This summary as one Markdown table row (see [`markdown_header`]).
    pub fn markdown_row(&self, label: &str) -> String {
        report::markdown_row(label, self)
    }
}

#[cfg(test)]
mod tests;
