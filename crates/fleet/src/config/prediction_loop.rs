//! `[accuracy]`: the settings of the prediction accuracy loop (`crate::accuracy`).

use serde::{Deserialize, Serialize};

/// Settings of the loop (`[accuracy]` in the gateway config).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AccuracyConfig {
    /// Recent requests per worker the verdict looks at.
    pub window: usize,
    /// Requests in the window before any verdict.
    pub min_samples: usize,
    /// Share of the window missing in one direction (or with differing token counts) that
    /// marks a worker degraded.
    pub degrade_share: f64,
    /// Rebuild a degraded worker's index from its replay service (off: only report).
    pub repair: bool,
    /// Seconds between two repairs of one worker at most.
    pub repair_cooldown_secs: f64,
    /// A worker whose events were lost for good (its cache state `unknown`, e.g. history
    /// older than the engine's replay buffer) is taken as exact again once this share of a
    /// whole window of answers since the loss was predicted exactly (1: all of them).
    pub heal_share: f64,
}

impl Default for AccuracyConfig {
    fn default() -> Self {
        Self {
            window: 32,
            min_samples: 16,
            degrade_share: 0.5,
            repair: true,
            repair_cooldown_secs: 30.0,
            heal_share: 0.9,
        }
    }
}

impl AccuracyConfig {
    /// Checks the settings.
    pub fn validate(&self) -> Result<(), String> {
        if self.window == 0 || self.window > 100_000 {
            return Err("accuracy.window must be within 1..=100000".into());
        }
        if self.min_samples == 0 || self.min_samples > self.window {
            return Err("accuracy.min_samples must be within 1..=window".into());
        }
        if !(self.degrade_share > 0.0 && self.degrade_share <= 1.0) {
            return Err("accuracy.degrade_share must be within (0, 1]".into());
        }
        if !(self.heal_share > 0.0 && self.heal_share <= 1.0) {
            return Err("accuracy.heal_share must be within (0, 1]".into());
        }
        if !(self.repair_cooldown_secs.is_finite() && self.repair_cooldown_secs >= 0.0) {
            return Err("accuracy.repair_cooldown_secs must be finite and not negative".into());
        }
        Ok(())
    }
}
