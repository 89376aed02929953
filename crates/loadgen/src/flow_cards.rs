//! What the dashboard shows of a kvroute gateway's flow control (docs/flow-control.md), read
//! from the gateway's own `/metrics` on every fleet read: each class's time to first token
//! over the last minute (`kvroute_class_time_to_first_token_seconds`, quantiles of the
//! histogram's growth in the window, interpolated within buckets as Prometheus'
//! `histogram_quantile` does) and its requests, and the refusals by tenant, class and reason
//! (`kvroute_flow_refused_total`), in all and in the last minute. It sees every client of the
//! gateway, not only the load generator's.

use kvroute_protocol::prometheus_text::samples;
use serde::Serialize;
use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

/// The window the figures cover.
pub const WINDOW: Duration = Duration::from_secs(60);
/// Most readings kept (one a second at most, over a bit more than the window).
const MAX_READINGS: usize = 128;
/// Most classes and refusal rows read from one metrics text (the gateway has at most 256
/// classes and 256 tenants).
const MAX_SERIES: usize = 512;
/// Longest label value kept.
const MAX_LABEL: usize = 64;

/// One class's time to first token over the window.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS))]
pub struct ClassCard {
    /// The class.
    pub class: String,
    /// Requests of it that got a first token in the window.
    pub requests: f64,
    /// Their median time to first token, in milliseconds (none without requests).
    pub ttft_p50_ms: Option<f64>,
    /// Their 95th percentile.
    pub ttft_p95_ms: Option<f64>,
}

/// Refusals of one tenant's requests of one class for one reason.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS))]
pub struct RefusalCard {
    /// The tenant.
    pub tenant: String,
    /// The class.
    pub class: String,
    /// Why (`tenant_limit`, `queue_full`, `deadline`, ...).
    pub reason: String,
    /// Since the gateway started.
    pub total: f64,
    /// In the window.
    pub window: f64,
}

/// One reading of the gateway's metrics.
#[derive(Clone, Debug, Default, PartialEq)]
struct Reading {
    /// Per class: the TTFT histogram's cumulative buckets `(le seconds, count)`, by `le`.
    ttft: BTreeMap<String, Vec<(f64, f64)>>,
    /// Per (tenant, class, reason): the refusals counted.
    refused: BTreeMap<(String, String, String), f64>,
}

impl Reading {
    /// The series of `text`; with `pool`, only that pool's of a gateway serving several
    /// models (series without a `model` label are every pool's).
    fn parse(text: &str, pool: Option<&str>) -> Self {
        let mut r = Reading::default();
        let label = |s: &kvroute_protocol::prometheus_text::Sample, name: &str| {
            s.label(name)
                .map(|v| v.chars().take(MAX_LABEL).collect::<String>())
        };
        for s in samples(text) {
            if let (Some(pool), Some(model)) = (pool, s.label("model")) {
                if model != pool {
                    continue;
                }
            }
            match s.name {
                "kvroute_class_time_to_first_token_seconds_bucket" => {
                    let (Some(class), Some(le)) = (label(&s, "class"), s.label("le")) else {
                        continue;
                    };
                    let le = match le.as_ref() {
                        "+Inf" => f64::INFINITY,
                        v => match v.parse::<f64>() {
                            Ok(v) => v,
                            Err(_) => continue,
                        },
                    };
                    if r.ttft.len() >= MAX_SERIES && !r.ttft.contains_key(&class) {
                        continue;
                    }
                    // A gateway serving several models has a series per pool: summed.
                    let buckets = r.ttft.entry(class).or_default();
                    match buckets.iter_mut().find(|b| b.0 == le) {
                        Some(b) => b.1 += s.value,
                        None => buckets.push((le, s.value)),
                    }
                }
                "kvroute_flow_refused_total" => {
                    let (Some(t), Some(c), Some(why)) =
                        (label(&s, "tenant"), label(&s, "class"), label(&s, "reason"))
                    else {
                        continue;
                    };
                    let key = (t, c, why);
                    if r.refused.len() < MAX_SERIES || r.refused.contains_key(&key) {
                        *r.refused.entry(key).or_default() += s.value;
                    }
                }
                _ => {}
            }
        }
        for buckets in r.ttft.values_mut() {
            buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        }
        r
    }
}

/// The gateway's flow figures as the dashboard shows them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FlowFigures {
    /// Every class the gateway has a TTFT histogram of, by name.
    pub classes: Vec<ClassCard>,
    /// Every refusal row, by tenant, class and reason.
    pub refusals: Vec<RefusalCard>,
}

/// The readings of the last window.
#[derive(Debug, Default)]
pub struct FlowHistory {
    readings: VecDeque<(Instant, Reading)>,
    /// The pool the readings are of (None: every pool's series summed).
    pool: Option<String>,
}

impl FlowHistory {
    /// Records the metrics `text` read at `now` and gives the figures over the window
    /// (against the oldest reading in it; none of a window before the second reading), of
    /// pool `pool` of a gateway serving several models (None: every pool's summed; another
    /// pool than the last reading's starts the window again).
    pub fn read(&mut self, now: Instant, text: &str, pool: Option<&str>) -> FlowFigures {
        if self.pool.as_deref() != pool {
            self.readings.clear();
            self.pool = pool.map(str::to_string);
        }
        let reading = Reading::parse(text, pool);
        // Keep the newest reading at least a window old as the base, drop older ones.
        while self.readings.len() > 1 && now.saturating_duration_since(self.readings[1].0) >= WINDOW
        {
            self.readings.pop_front();
        }
        while self.readings.len() >= MAX_READINGS {
            self.readings.pop_front();
        }
        // A baseline much older than the window (nobody read the fleet meanwhile) would
        // stretch "the last minute": none then, until the next reading.
        let stale = |at: Instant| now.saturating_duration_since(at) > WINDOW + WINDOW / 2;
        if self.readings.front().is_some_and(|(at, _)| stale(*at)) {
            self.readings.clear();
        }
        let base = self.readings.front().map(|(_, r)| r.clone());
        self.readings.push_back((now, reading.clone()));
        figures(base.as_ref(), &reading)
    }
}

/// The figures of `now` against `base` (a counter that went down restarted: counted from 0).
fn figures(base: Option<&Reading>, now: &Reading) -> FlowFigures {
    let grown = |was: Option<f64>, is: f64| match was {
        Some(w) if w <= is => is - w,
        Some(_) => is,
        None => 0.0,
    };
    let classes = (now.ttft.iter())
        .map(|(class, buckets)| {
            let before = base.and_then(|b| b.ttft.get(class));
            let delta: Vec<(f64, f64)> = (buckets.iter())
                .map(|&(le, n)| {
                    let was = match (base, before) {
                        (None, _) => None,
                        (Some(_), None) => Some(0.0),
                        (Some(_), Some(b)) => {
                            Some(b.iter().find(|(l, _)| *l == le).map_or(0.0, |&(_, n)| n))
                        }
                    };
                    (le, grown(was, n))
                })
                .collect();
            let requests = delta.last().map_or(0.0, |&(_, n)| n);
            ClassCard {
                class: class.clone(),
                requests,
                ttft_p50_ms: quantile(0.5, &delta).map(|s| s * 1e3),
                ttft_p95_ms: quantile(0.95, &delta).map(|s| s * 1e3),
            }
        })
        .collect();
    let refusals = (now.refused.iter())
        .map(|((tenant, class, reason), &total)| RefusalCard {
            tenant: tenant.clone(),
            class: class.clone(),
            reason: reason.clone(),
            total,
            window: grown(
                base.map(|b| {
                    let key = (tenant.clone(), class.clone(), reason.clone());
                    b.refused.get(&key).copied().unwrap_or(0.0)
                }),
                total,
            ),
        })
        .collect();
    FlowFigures { classes, refusals }
}

/// The `q` quantile of cumulative buckets `(le, count)` sorted by `le`, interpolated
/// linearly within its bucket (the lowest bucket from 0; one reaching `+Inf` gives the
/// highest finite bound); none without observations.
fn quantile(q: f64, buckets: &[(f64, f64)]) -> Option<f64> {
    let total = buckets.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let rank = q * total;
    let mut lower = (0.0, 0.0);
    for &(le, n) in buckets {
        if n >= rank {
            if le.is_infinite() {
                return Some(lower.0);
            }
            let within = n - lower.1;
            let part = if within > 0.0 {
                (rank - lower.1) / within
            } else {
                1.0
            };
            return Some(lower.0 + (le - lower.0) * part);
        }
        lower = (le, n);
    }
    Some(lower.0)
}

#[cfg(test)]
mod tests;
