//! Huber weights for the ledger's online fits: a sample far off the current fit (a request
//! stuck behind a stall, a preempted one) counts as at most `HUBER` robust scales, so one
//! outlier moves a fit a bounded step, while a lasting change moves the scale and is learned.

/// Residuals beyond this many robust scales are down-weighted.
const HUBER: f64 = 3.0;
/// Samples seen before any is down-weighted.
const FIRST_WEIGHED: u64 = 8;

/// The robust scale of a fit's residuals: their exponentially weighted mean, each bounded.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct RobustScale {
    scale: f64,
}

impl RobustScale {
    /// The weight of a sample `y` that the fit predicted as `predicted` (`None` before it
    /// predicts anything) after `samples` samples, and the scale updated with `decay`.
    pub(super) fn weigh(
        &mut self,
        y: f64,
        predicted: Option<f64>,
        samples: u64,
        decay: f64,
    ) -> f64 {
        let Some(p) = predicted else {
            self.scale = 0.1 * y;
            return 1.0;
        };
        let r = (y - p).abs();
        let w = if samples >= FIRST_WEIGHED && r > HUBER * self.scale {
            HUBER * self.scale / r
        } else {
            1.0
        };
        let r = r.min(HUBER * self.scale.max(0.05 * y));
        self.scale = self.scale * decay + (1.0 - decay) * r;
        w
    }
}
