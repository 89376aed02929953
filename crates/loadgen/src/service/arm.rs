//! One arm of a live A/B: a name, the endpoint it drives, whether it is the baseline the
//! others are compared with, and at run time its own observer (window, totals,
//! conversations), fleet reader and run. Every arm of a service runs the same load (the same
//! conversations, seeded alike, at the same concurrency) against its own endpoint.

use crate::closed_loop::Control;
use crate::observer::{Observer, ObserverConfig, Totals};
use crate::window::WindowStats;
use crate::worker_cards::FleetReader;
use crate::RunResult;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use tokio::task::JoinHandle;

/// The most arms a service drives.
pub const MAX_ARMS: usize = 4;

/// The name a service's only arm gets when none is configured.
pub const DEFAULT_ARM: &str = "live";

/// An arm's settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS))]
#[serde(deny_unknown_fields)]
pub struct ArmConfig {
    /// Its name in the statistics, the metrics' `arm` label and the dashboard (the demo
    /// names its arms by policy): 1-32 characters of `[A-Za-z0-9_.-]`.
    pub name: String,
    /// Base URL of the endpoint it drives.
    pub target: String,
    /// Whether it is the baseline the other arms are compared with.
    #[serde(default)]
    pub baseline: bool,
}

impl ArmConfig {
    /// Checks the name (it becomes a label value and a query parameter) and the URL.
    pub(crate) fn validate(&self) -> Result<(), String> {
        let ok = (1..=32).contains(&self.name.len())
            && self
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
        if !ok {
            return Err(format!(
                "arm name {:?} must be 1-32 characters of letters, digits, '_', '.', '-'",
                self.name
            ));
        }
        if !(self.target.starts_with("http://") || self.target.starts_with("https://")) {
            return Err(format!(
                "arm {}: target {:?} must be an http(s) URL",
                self.name, self.target
            ));
        }
        Ok(())
    }
}

/// Checks a service's arms: at most [`MAX_ARMS`], names unique, at most one baseline and at
/// least one arm that is not.
pub(crate) fn validate(arms: &[ArmConfig]) -> Result<(), String> {
    if arms.is_empty() || arms.len() > MAX_ARMS {
        return Err(format!(
            "a service drives 1..={MAX_ARMS} arms, got {}",
            arms.len()
        ));
    }
    for (i, a) in arms.iter().enumerate() {
        a.validate()?;
        if arms[..i].iter().any(|b| b.name == a.name) {
            return Err(format!("two arms are named {:?}", a.name));
        }
    }
    let baselines = arms.iter().filter(|a| a.baseline).count();
    if baselines > 1 || baselines == arms.len() {
        return Err("at most one arm is the baseline, and at least one is not".into());
    }
    Ok(())
}

/// An arm at run time.
pub(crate) struct Arm {
    pub(crate) config: ArmConfig,
    pub(crate) observer: Arc<Observer>,
    pub(crate) fleet: FleetReader,
}

impl Arm {
    pub(crate) fn new(config: ArmConfig, observer: &ObserverConfig) -> Self {
        Self {
            fleet: FleetReader::new(&config.target),
            observer: Arc::new(Observer::new(observer)),
            config,
        }
    }

    /// Its figures now.
    pub(crate) fn stats(&self) -> ArmStats {
        ArmStats {
            name: self.config.name.clone(),
            target: self.config.target.clone(),
            baseline: self.config.baseline,
            active_conversations: self.observer.active_conversations(),
            totals: self.observer.totals(),
            window: self.observer.window(),
        }
    }
}

/// An arm's run: its control and task.
#[derive(Default)]
pub(crate) struct ArmRun {
    pub(crate) control: Option<Control>,
    pub(crate) handle: Option<JoinHandle<RunResult>>,
}

impl ArmRun {
    pub(crate) fn running(&self) -> bool {
        self.control.as_ref().is_some_and(|c| !c.is_stopped())
            && self.handle.as_ref().is_some_and(|h| !h.is_finished())
    }

    pub(crate) fn finishing(&self) -> bool {
        self.handle.as_ref().is_some_and(|h| !h.is_finished())
    }
}

/// An arm's figures, as the dashboard sees them.
#[derive(Clone, Debug, Serialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS))]
pub struct ArmStats {
    /// Its name.
    pub name: String,
    /// The endpoint it drives.
    pub target: String,
    /// Whether it is the baseline.
    pub baseline: bool,
    /// Conversations under way.
    pub active_conversations: usize,
    /// Counts since the current run started.
    pub totals: Totals,
    /// The rolling window.
    pub window: WindowStats,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arm(name: &str, baseline: bool) -> ArmConfig {
        ArmConfig {
            name: name.into(),
            target: "http://127.0.0.1:1".into(),
            baseline,
        }
    }

    #[test]
    fn arms_are_checked() {
        assert!(validate(&[arm("goodput", false), arm("round_robin", true)]).is_ok());
        assert!(validate(&[arm("live", false)]).is_ok());
        for bad in [
            vec![],
            vec![arm("a", false), arm("a", true)],
            vec![arm("a", true)],
            vec![arm("a", true), arm("b", true), arm("c", false)],
            vec![arm("bad name", false)],
            vec![arm("x\"}", false)],
            vec![arm(&"x".repeat(33), false)],
            (0..5).map(|i| arm(&format!("a{i}"), false)).collect(),
        ] {
            assert!(validate(&bad).is_err(), "{bad:?}");
        }
        let mut no_url = arm("a", false);
        no_url.target = "127.0.0.1:80".into();
        assert!(validate(&[no_url]).is_err());
    }
}
