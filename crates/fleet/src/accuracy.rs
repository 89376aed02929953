//! Prediction accuracy, closed loop: for every answered request the router's predicted
//! cached tokens on the chosen worker are compared with the `cached_tokens` the engine
//! reports, and the gateway's prompt token count with the engine's `prompt_tokens`. Over a
//! window of recent requests per worker, a worker whose predictions keep missing in one
//! direction (events lost without a gap, a reset that kept its sequence) or whose token
//! counts keep differing (another tokenizer or chat template than the engine's) is marked
//! degraded with the reason; the caller repairs what can be repaired (its index rebuilt from
//! the replay service) and says so in logs, metrics and `/debug/workers`. Pure: no IO.

use serde::Serialize;
use std::collections::VecDeque;

pub use crate::config::AccuracyConfig;

/// One answered request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sample {
    /// Prompt tokens the router predicted cached on the worker.
    pub predicted: u64,
    /// Prompt tokens the engine reported cached.
    pub cached: u64,
    /// The prompt's tokens as the gateway counted them.
    pub gateway_prompt: u64,
    /// The prompt's tokens as the engine counted them.
    pub engine_prompt: u64,
    /// The KV block size (a prediction within one block is exact).
    pub block_size: u64,
}

/// How one prediction came out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Within a block of what the engine reported.
    Exact,
    /// Predicted at least a block more than the engine had.
    Over,
    /// Predicted at least a block less than the engine had.
    Under,
}

impl Outcome {
    /// Its metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Exact => "exact",
            Outcome::Over => "over",
            Outcome::Under => "under",
        }
    }
}

impl Sample {
    /// How this prediction came out.
    pub fn outcome(&self) -> Outcome {
        let b = self.block_size.max(1);
        if self.predicted >= self.cached.saturating_add(b) {
            Outcome::Over
        } else if self.cached >= self.predicted.saturating_add(b) {
            Outcome::Under
        } else {
            Outcome::Exact
        }
    }

    /// The prediction's error in tokens, whichever direction.
    pub fn abs_error(&self) -> u64 {
        self.predicted.abs_diff(self.cached)
    }
}

/// Why a worker's predictions are not trusted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Degraded {
    /// The index holds blocks the engine does not (removals or a reset were missed).
    OverPredicting,
    /// The engine holds blocks the index does not (stores were missed).
    UnderPredicting,
    /// The engine counts other prompt tokens than the gateway: another tokenizer or chat
    /// template; rebuilding the index does not help.
    TokenCountsDiffer,
}

impl Degraded {
    /// Its metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Degraded::OverPredicting => "over_predicting",
            Degraded::UnderPredicting => "under_predicting",
            Degraded::TokenCountsDiffer => "token_counts_differ",
        }
    }

    /// What it means, for logs.
    pub fn explain(self) -> &'static str {
        match self {
            Degraded::OverPredicting => "predictions keep exceeding the engine's cached tokens: the index holds blocks the engine dropped (removals or a cache reset were not seen)",
            Degraded::UnderPredicting => "the engine keeps reporting more cached tokens than predicted: the index misses blocks it stored (events lost without a gap)",
            Degraded::TokenCountsDiffer => "the engine counts other prompt tokens than the gateway: its tokenizer or chat template differs from the gateway's",
        }
    }
}

/// One worker's recent predictions.
#[derive(Debug, Default)]
pub struct Tracker {
    recent: VecDeque<(Outcome, bool, u64)>,
    /// Requests seen since start.
    pub total: u64,
    /// Exact predictions since start.
    pub exact_total: u64,
    /// The current verdict, when degraded.
    pub degraded: Option<Degraded>,
    /// Repairs started since start.
    pub repairs: u64,
}

/// What `Tracker::record` found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Recorded {
    /// This prediction's outcome.
    pub outcome: Outcome,
    /// Whether the token counts differed.
    pub tokens_differ: bool,
    /// The worker became degraded with this request (it was not before).
    pub newly: Option<Degraded>,
    /// After it, the window agrees with the engine ([`Tracker::agrees`]).
    pub agrees: bool,
}

/// A summary of the window, for `/debug/workers` and the gauges.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Summary {
    /// Requests in the window.
    pub samples: usize,
    /// Share of exact predictions in the window (None when empty).
    pub exact_ratio: Option<f64>,
    /// Over-predictions in the window.
    pub over: usize,
    /// Under-predictions in the window.
    pub under: usize,
    /// Requests whose token counts differed, in the window.
    pub token_count_mismatches: usize,
    /// Mean absolute error in tokens over the window.
    pub mean_abs_error_tokens: Option<f64>,
    /// Requests since start.
    pub total: u64,
    /// Exact predictions since start.
    pub exact_total: u64,
    /// The current verdict.
    pub degraded: Option<Degraded>,
    /// Repairs since start.
    pub repairs: u64,
}

impl Tracker {
    /// Records a request; says whether the worker became degraded by it.
    pub fn record(&mut self, s: Sample, cfg: &AccuracyConfig) -> Recorded {
        let outcome = s.outcome();
        let tokens_differ = s.gateway_prompt != s.engine_prompt;
        self.total += 1;
        if outcome == Outcome::Exact {
            self.exact_total += 1;
        }
        if self.recent.len() == cfg.window {
            self.recent.pop_front();
        }
        self.recent
            .push_back((outcome, tokens_differ, s.abs_error()));
        let verdict = self.verdict(cfg);
        let newly = match (self.degraded, verdict) {
            (None, Some(v)) => Some(v),
            _ => None,
        };
        // A worker stays degraded until it is repaired (or its window says otherwise).
        if verdict.is_some() || self.recent.len() >= cfg.min_samples {
            self.degraded = verdict;
        }
        Recorded {
            outcome,
            tokens_differ,
            newly,
            agrees: self.agrees(cfg),
        }
    }

    fn verdict(&self, cfg: &AccuracyConfig) -> Option<Degraded> {
        let n = self.recent.len();
        if n < cfg.min_samples {
            return None;
        }
        let share = |k: usize| k as f64 / n as f64 >= cfg.degrade_share;
        let count =
            |f: &dyn Fn(&(Outcome, bool, u64)) -> bool| self.recent.iter().filter(|x| f(x)).count();
        if share(count(&|x| x.1)) {
            Some(Degraded::TokenCountsDiffer)
        } else if share(count(&|x| x.0 == Outcome::Over)) {
            Some(Degraded::OverPredicting)
        } else if share(count(&|x| x.0 == Outcome::Under)) {
            Some(Degraded::UnderPredicting)
        } else {
            None
        }
    }

    /// A repair started: the window starts afresh (the old predictions say nothing about
    /// the rebuilt index).
    pub fn repaired(&mut self) {
        self.repairs += 1;
        self.recent.clear();
        self.degraded = None;
    }

    /// The window starts afresh, the verdict with it (events were lost: what came before
    /// says nothing about the index now).
    pub fn restart(&mut self) {
        self.recent.clear();
        self.degraded = None;
    }

    /// Whether the window is full and at least `cfg.heal_share` of it was predicted exactly
    /// (and it is not degraded): the index agrees with the engine's cache.
    pub fn agrees(&self, cfg: &AccuracyConfig) -> bool {
        let n = self.recent.len();
        let exact = self.recent.iter().filter(|x| x.0 == Outcome::Exact).count();
        n >= cfg.window && self.degraded.is_none() && exact as f64 >= cfg.heal_share * n as f64
    }

    /// The window's figures.
    pub fn summary(&self) -> Summary {
        let n = self.recent.len();
        let count =
            |f: &dyn Fn(&(Outcome, bool, u64)) -> bool| self.recent.iter().filter(|x| f(x)).count();
        let exact = count(&|x| x.0 == Outcome::Exact);
        Summary {
            samples: n,
            exact_ratio: (n > 0).then(|| exact as f64 / n as f64),
            over: count(&|x| x.0 == Outcome::Over),
            under: count(&|x| x.0 == Outcome::Under),
            token_count_mismatches: count(&|x| x.1),
            mean_abs_error_tokens: (n > 0)
                .then(|| self.recent.iter().map(|x| x.2 as f64).sum::<f64>() / n as f64),
            total: self.total,
            exact_total: self.exact_total,
            degraded: self.degraded,
            repairs: self.repairs,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> AccuracyConfig {
        AccuracyConfig {
            window: 8,
            min_samples: 4,
            ..AccuracyConfig::default()
        }
    }

    fn s(predicted: u64, cached: u64) -> Sample {
        Sample {
            predicted,
            cached,
            gateway_prompt: 100,
            engine_prompt: 100,
            block_size: 16,
        }
    }

    #[test]
    fn outcomes_are_judged_within_a_block() {
        assert_eq!(s(32, 32).outcome(), Outcome::Exact);
        assert_eq!(s(32, 47).outcome(), Outcome::Exact);
        assert_eq!(s(48, 32).outcome(), Outcome::Over);
        assert_eq!(s(0, 16).outcome(), Outcome::Under);
        assert_eq!(s(0, 16).abs_error(), 16);
    }

    #[test]
    fn a_worker_missing_one_way_is_degraded_once_and_repaired() {
        let (mut t, c) = (Tracker::default(), cfg());
        // Accurate requests: nothing.
        for _ in 0..4 {
            assert_eq!(t.record(s(32, 32), &c).newly, None);
        }
        // Under-predictions take over the window: degraded once, at half of it.
        let newly: Vec<_> = (0..4).map(|_| t.record(s(0, 64), &c).newly).collect();
        assert_eq!(newly, [None, None, None, Some(Degraded::UnderPredicting)]);
        assert_eq!(t.record(s(0, 64), &c).newly, None, "reported once");
        assert_eq!(t.degraded, Some(Degraded::UnderPredicting));
        let sum = t.summary();
        assert_eq!((sum.samples, sum.under, sum.over), (8, 5, 0));
        assert_eq!(sum.exact_ratio, Some(3.0 / 8.0));
        t.repaired();
        assert_eq!((t.degraded, t.repairs, t.summary().samples), (None, 1, 0));
        assert_eq!(t.summary().total, 9);
    }

    #[test]
    fn over_prediction_and_token_counts_have_their_own_verdicts() {
        let c = cfg();
        let mut over = Tracker::default();
        let got: Vec<_> = (0..4).map(|_| over.record(s(64, 0), &c).newly).collect();
        assert_eq!(got[3], Some(Degraded::OverPredicting));
        let mut tok = Tracker::default();
        let mut differ = s(0, 0);
        differ.engine_prompt = 101;
        let got: Vec<_> = (0..4).map(|_| tok.record(differ, &c).newly).collect();
        assert_eq!(got[3], Some(Degraded::TokenCountsDiffer));
        // Mixed, below the share: never degraded.
        let mut mixed = Tracker::default();
        for i in 0..40 {
            let x = if i % 4 == 0 { s(0, 64) } else { s(32, 32) };
            assert_eq!(mixed.record(x, &c).newly, None);
        }
    }

    #[test]
    fn bad_settings_are_refused() {
        assert!(AccuracyConfig::default().validate().is_ok());
        for bad in [
            AccuracyConfig {
                window: 0,
                ..AccuracyConfig::default()
            },
            AccuracyConfig {
                min_samples: 40,
                ..AccuracyConfig::default()
            },
            AccuracyConfig {
                degrade_share: 0.0,
                ..AccuracyConfig::default()
            },
            AccuracyConfig {
                repair_cooldown_secs: f64::NAN,
                ..AccuracyConfig::default()
            },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_full_window_of_exact_predictions_since_a_restart_agrees() {
        let cfg = AccuracyConfig {
            heal_share: 0.75,
            ..cfg()
        };
        let (exact, under) = (s(32, 32), s(0, 64));
        let mut t = Tracker::default();
        for _ in 0..cfg.window {
            assert!(!t.agrees(&cfg), "not before the window is full");
            t.record(exact, &cfg);
        }
        assert!(t.agrees(&cfg));
        // Events lost: the window starts afresh.
        t.restart();
        assert!(!t.agrees(&cfg));
        // Two misses in eight are within 0.75; three are not.
        for k in 0..cfg.window {
            t.record(if k < 2 { under } else { exact }, &cfg);
        }
        assert!(t.agrees(&cfg));
        t.restart();
        for k in 0..cfg.window {
            t.record(if k < 3 { under } else { exact }, &cfg);
        }
        assert!(!t.agrees(&cfg));
        let bad = AccuracyConfig {
            heal_share: 0.0,
            ..cfg
        };
        assert!(bad.validate().is_err());
    }
}
