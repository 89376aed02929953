//! Virtual time of the engine, running at `speedup` virtual seconds per real second from
//! the worker's start.

use kvroute_core::Time;
use std::time::Duration;
use tokio::time::Instant;

/// Maps real instants to the engine's virtual time and back.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Clock {
    start: Instant,
    speedup: f64,
}

/// Wakes are this much late at most, so that the engine's time has surely reached the event
/// a wake is for (float rounding would otherwise wake a hair early, to find nothing due).
const WAKE_SLACK: Duration = Duration::from_micros(1);

impl Clock {
    /// A clock starting now; `speedup` is positive and finite (checked by the config).
    pub(crate) fn new(speedup: f64) -> Self {
        Self {
            start: Instant::now(),
            speedup,
        }
    }

    /// The virtual time now.
    pub(crate) fn now(&self) -> Time {
        self.at(Instant::now())
    }

    /// The virtual time at a real instant.
    pub(crate) fn at(&self, instant: Instant) -> Time {
        let real = instant.saturating_duration_since(self.start).as_secs_f64();
        Time::from_secs_f64(real * self.speedup)
    }

    /// The real instant at which virtual time reaches `t` (a far future when out of range).
    pub(crate) fn instant_of(&self, t: Time) -> Instant {
        let real = Duration::try_from_secs_f64(t.as_secs_f64() / self.speedup)
            .unwrap_or(Duration::from_secs(86_400 * 365));
        self.start
            .checked_add(real + WAKE_SLACK)
            .unwrap_or_else(|| self.start + Duration::from_secs(86_400 * 365))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instants_and_times_round_trip_in_order() {
        let c = Clock::new(50.0);
        for ms in [0u64, 1, 7, 1000, 123_456] {
            let t = Time::from_millis(ms);
            let i = c.instant_of(t);
            assert!(c.at(i) >= t, "{ms}");
            assert!(c.at(i).since(t) < Duration::from_millis(1), "{ms}");
        }
    }
}
