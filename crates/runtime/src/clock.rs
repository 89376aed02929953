//! The live clock: every time a live process reads (the router's `Time`, deadlines, latencies,
//! the simulated engine's virtual time) comes from one [`Clock`] it is given, on tokio's time,
//! so tests run on paused time (`tokio::time::pause`) instead of sleeping.

use kvroute_core::Time;
use std::time::Duration;
use tokio::time::Instant;

/// Time since a process (or its engine) started, on tokio's clock, running at `speedup`
/// seconds per real second (1 for the gateway; the simulated engine's may run faster).
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    start: Instant,
    speedup: f64,
}

/// Wakes for a clock not at real speed are this much late at most, so that its time has
/// surely reached the event a wake is for (float rounding would otherwise wake a hair early,
/// to find nothing due).
const WAKE_SLACK: Duration = Duration::from_micros(1);

/// The instant of a time out of range: a year from the start.
const FAR: Duration = Duration::from_secs(86_400 * 365);

impl Clock {
    /// A clock starting now, at real speed.
    pub fn starting_now() -> Self {
        Self::new(1.0)
    }

    /// A clock starting now, running at `speedup` seconds per real second (positive and
    /// finite: checked by the caller's config).
    pub fn new(speedup: f64) -> Self {
        Self {
            start: Instant::now(),
            speedup,
        }
    }

    /// Whether it runs at real speed: then times are exact, with no float rounding.
    fn real_speed(&self) -> bool {
        self.speedup == 1.0
    }

    /// The time now.
    pub fn now(&self) -> Time {
        self.at(Instant::now())
    }

    /// The time at a real instant (the start for an instant before it).
    pub fn at(&self, instant: Instant) -> Time {
        let real = instant.saturating_duration_since(self.start);
        if self.real_speed() {
            Time(real)
        } else {
            Time::from_secs_f64(real.as_secs_f64() * self.speedup)
        }
    }

    /// The real instant at which the clock reaches `t` (for timers; a year from the start
    /// when out of range).
    pub fn instant(&self, t: Time) -> Instant {
        let real = if self.real_speed() {
            Some(t.0)
        } else {
            Duration::try_from_secs_f64(t.as_secs_f64() / self.speedup)
                .ok()
                .and_then(|d| d.checked_add(WAKE_SLACK))
        };
        real.and_then(|d| self.start.checked_add(d))
            .unwrap_or_else(|| self.start + FAR)
    }

    /// Time from `t` to now (zero when `t` is ahead).
    pub fn since(&self, t: Time) -> Duration {
        self.now().0.saturating_sub(t.0)
    }

    /// Seconds from `t` to now (zero when `t` is ahead).
    pub fn secs_since(&self, t: Time) -> f64 {
        self.since(t).as_secs_f64()
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
        assert_eq!(
            c.at(c.instant(Time::from_millis(1234))),
            Time::from_millis(1234)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_faster_clock_runs_at_its_speedup_on_paused_time() {
        let c = Clock::new(50.0);
        tokio::time::sleep(Duration::from_secs(2)).await;
        let now = c.now();
        assert!(
            now.since(Time::from_secs_f64(100.0)) < Duration::from_millis(1),
            "{now:?}"
        );
        assert!(
            Time::from_secs_f64(100.0).since(now) < Duration::from_millis(1),
            "{now:?}"
        );
        // The end of time, at either speed: a year or more from now, not a panic.
        let year = Instant::now() + Duration::from_secs(86_400 * 365);
        assert!(c.instant(Time(Duration::MAX)) >= year);
        assert!(Clock::starting_now().instant(Time(Duration::MAX)) >= year);
    }

    #[test]
    fn instants_and_times_round_trip_in_order() {
        let c = Clock::new(50.0);
        for ms in [0u64, 1, 7, 1000, 123_456] {
            let t = Time::from_millis(ms);
            let i = c.instant(t);
            assert!(c.at(i) >= t, "{ms}");
            assert!(c.at(i).since(t) < Duration::from_millis(1), "{ms}");
        }
    }
}
