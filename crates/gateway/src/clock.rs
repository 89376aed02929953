//! The gateway's clock: every time the gateway reads (the router's `Time`, deadlines,
//! latencies) comes from one [`Clock`] given to its state, on tokio's time, so tests run on
//! paused time (`tokio::time::pause`) instead of sleeping.

use kvroute_core::Time;
use std::time::Duration;
use tokio::time::Instant;

/// Time since the gateway started, on tokio's clock.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    start: Instant,
}

impl Clock {
    /// A clock starting now.
    pub fn starting_now() -> Self {
        Self {
            start: Instant::now(),
        }
    }

    /// The router's time now.
    pub fn now(&self) -> Time {
        Time(self.start.elapsed())
    }

    /// The instant of router time `t` (for timers).
    pub fn instant(&self, t: Time) -> Instant {
        self.start + t.0
    }

    /// Seconds from `t` to now (zero when `t` is ahead).
    pub fn secs_since(&self, t: Time) -> f64 {
        self.now().0.saturating_sub(t.0).as_secs_f64()
    }

    /// Time from `t` to now.
    pub fn since(&self, t: Time) -> Duration {
        self.now().0.saturating_sub(t.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn it_follows_tokios_paused_time() {
        let c = Clock::starting_now();
        let t0 = c.now();
        tokio::time::sleep(Duration::from_secs(90)).await;
        assert_eq!(c.since(t0), Duration::from_secs(90));
        assert_eq!(c.secs_since(c.now().plus(Duration::from_secs(1))), 0.0);
        assert_eq!(c.instant(t0) + Duration::from_secs(90), Instant::now());
    }
}
