//! The dashboard's settings (`GET /api/config`): its SLO objectives (the `goodput` policy's by
//! default, so the gateways route for what the dashboard judges by), the concurrency slider's
//! range and the baseline files it compares with.

use serde::{Deserialize, Serialize};

/// The dashboard's settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS))]
#[serde(default, deny_unknown_fields)]
pub struct DashboardConfig {
    /// TTFT p95 objective, in milliseconds.
    pub slo_ttft_p95_ms: f64,
    /// TPOT p95 objective, in milliseconds.
    pub slo_tpot_p95_ms: f64,
    /// Lowest concurrency of the slider.
    pub slider_min: usize,
    /// Highest concurrency of the slider.
    pub slider_max: usize,
    /// Step of the slider.
    pub slider_step: usize,
    /// Baseline files' contents (`kvroute bench` writes them; each names its policy and
    /// says whether the fleet simulator made it): compared with where no live arm measured.
    #[cfg_attr(feature = "ts", ts(type = "Array<Baseline>"))]
    pub baselines: Vec<serde_json::Value>,
}

/// The slider's default range and step: the reference demo's 60-180 conversations in steps of
/// 20 (the demo's fleet is sized for it).
pub const DEFAULT_SLIDER: (usize, usize, usize) = (60, 180, 20);

/// The dashboard's default objectives, in milliseconds: the `goodput` policy's, so the
/// gateways route for what the dashboard judges by.
pub fn default_objectives_ms() -> (f64, f64) {
    let g = kvroute_core::policy::GoodputConfig::default();
    (g.ttft_secs * 1e3, g.tpot_secs * 1e3)
}

impl Default for DashboardConfig {
    fn default() -> Self {
        let (ttft, tpot) = default_objectives_ms();
        Self {
            slo_ttft_p95_ms: ttft,
            slo_tpot_p95_ms: tpot,
            slider_min: DEFAULT_SLIDER.0,
            slider_max: DEFAULT_SLIDER.1,
            slider_step: DEFAULT_SLIDER.2,
            baselines: Vec::new(),
        }
    }
}

impl DashboardConfig {
    /// Checks the settings.
    pub fn validate(&self) -> Result<(), String> {
        for (name, v) in [
            ("slo_ttft_p95_ms", self.slo_ttft_p95_ms),
            ("slo_tpot_p95_ms", self.slo_tpot_p95_ms),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return Err(format!("{name} must be > 0, got {v}"));
            }
        }
        if self.slider_min == 0
            || self.slider_step == 0
            || self.slider_min > self.slider_max
            || self.slider_max > crate::MAX_CONCURRENCY
        {
            return Err(format!(
                "the slider needs 1 <= min <= max <= {} and step >= 1, got {}..{} step {}",
                crate::MAX_CONCURRENCY,
                self.slider_min,
                self.slider_max,
                self.slider_step
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_slider_and_objectives_are_checked() {
        assert!(DashboardConfig::default().validate().is_ok());
        for bad in [
            DashboardConfig {
                slider_min: 0,
                ..DashboardConfig::default()
            },
            DashboardConfig {
                slider_min: 200,
                ..DashboardConfig::default()
            },
            DashboardConfig {
                slo_ttft_p95_ms: -1.0,
                ..DashboardConfig::default()
            },
        ] {
            assert!(bad.validate().is_err());
        }
    }
}
