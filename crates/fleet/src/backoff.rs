//! The gateway's retry pauses: one exponential backoff (backon's [`ExponentialBuilder`]),
//! a named policy per use, its parameters written once here.
//!
//! Every policy doubles its pause from a first one up to a cap, without jitter, and never
//! gives up by itself (each use tries until it succeeds or its task ends). A call that is
//! simply tried again takes its policy through backon's [`backon::Retryable`] (`.retry()`,
//! which sleeps on `tokio::time::sleep`: paused time in tests skips it); a loop that keeps
//! its pause across iterations (a reconnection) holds [`Pauses`] and resets them on
//! success. backon doubles in `f32` (100 ms becomes 200.000003 ms, which tokio's
//! millisecond timer sleeps as 201 ms): every pause is rounded to the millisecond, so the
//! doubling is exact.

use backon::{BackoffBuilder, ExponentialBuilder};
use std::time::Duration;

/// Each pause is this many times the one before, up to the policy's cap.
const FACTOR: f32 = 2.0;

/// The first pause before connecting again (the ZMQ socket, the JetStream consumer) or
/// asking NATS again (the stream, a subscription).
const RECONNECT_FIRST: Duration = Duration::from_millis(100);

/// The longest pause before connecting or asking NATS again.
const RECONNECT_MAX: Duration = Duration::from_secs(2);

/// The first pause before publishing again an event JetStream did not acknowledge.
const PUBLISH_FIRST: Duration = Duration::from_millis(50);

/// The longest pause before publishing an event again.
const PUBLISH_MAX: Duration = Duration::from_secs(2);

/// The first pause before asking a replay service that did not answer again.
const REPLAY_FIRST: Duration = Duration::from_secs(1);

/// The longest pause before asking a replay service again.
const REPLAY_MAX: Duration = Duration::from_secs(30);

/// A policy: backon's exponential backoff, every pause rounded to the millisecond. Given
/// to backon's `.retry()`, or held as [`Pauses`].
#[derive(Clone, Copy, Debug)]
pub struct Policy(ExponentialBuilder);

/// A policy's pauses, one after another.
pub type Delays =
    std::iter::Map<<ExponentialBuilder as BackoffBuilder>::Backoff, fn(Duration) -> Duration>;

impl BackoffBuilder for Policy {
    type Backoff = Delays;

    fn build(self) -> Delays {
        self.0
            .build()
            .map(to_the_millisecond as fn(Duration) -> Duration)
    }
}

/// `d` rounded to the nearest millisecond.
fn to_the_millisecond(d: Duration) -> Duration {
    let ms = d.saturating_add(Duration::from_micros(500)).as_millis();
    Duration::from_millis(u64::try_from(ms).unwrap_or(u64::MAX))
}

/// Pauses from `first`, doubling up to `max`, without jitter or end.
const fn doubling(first: Duration, max: Duration) -> Policy {
    Policy(
        ExponentialBuilder::new()
            .with_min_delay(first)
            .with_factor(FACTOR)
            .with_max_delay(max)
            .without_max_times(),
    )
}

/// Connecting again, or asking NATS again: 100 ms, doubling up to 2 s. Reset when a
/// connection is made (the ZMQ socket's handshake, a JetStream consumer).
pub const fn reconnect() -> Policy {
    doubling(RECONNECT_FIRST, RECONNECT_MAX)
}

/// Publishing an event again until JetStream acknowledges it: 50 ms, doubling up to 2 s;
/// every event starts afresh.
pub const fn publish() -> Policy {
    doubling(PUBLISH_FIRST, PUBLISH_MAX)
}

/// Asking a replay service again while it does not answer: 1 s, doubling up to 30 s. Reset
/// when it answers.
pub const fn replay() -> Policy {
    doubling(REPLAY_FIRST, REPLAY_MAX)
}

/// A policy's pauses kept across a loop's iterations: the next one, and a reset when what
/// was retried succeeded.
#[derive(Debug)]
pub struct Pauses {
    policy: Policy,
    next: Delays,
}

impl Pauses {
    /// `policy`'s pauses from its first.
    pub fn new(policy: Policy) -> Self {
        Self {
            policy,
            next: policy.build(),
        }
    }

    /// The next pause.
    pub fn next_pause(&mut self) -> Duration {
        match self.next.next() {
            Some(d) => d,
            // The policies end only after `usize::MAX` pauses: begin again.
            None => {
                self.reset();
                self.next_pause()
            }
        }
    }

    /// Begins again from the first pause.
    pub fn reset(&mut self) {
        self.next = self.policy.build();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use backon::Retryable;
    use std::sync::atomic::{AtomicU32, Ordering};
    use tokio::time::Instant;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn reconnect_doubles_from_100_ms_to_2_s_and_resets() {
        let mut p = Pauses::new(reconnect());
        assert_eq!(p.next_pause(), ms(100));
        for expected in [200, 400, 800, 1600, 2000, 2000, 2000] {
            assert_eq!(p.next_pause(), ms(expected));
        }
        for _ in 0..1000 {
            assert_eq!(p.next_pause(), ms(2000));
        }
        p.reset();
        assert_eq!(p.next_pause(), ms(100));
        assert_eq!(p.next_pause(), ms(200));
    }

    #[test]
    fn publish_doubles_from_50_ms_to_2_s() {
        let mut p = Pauses::new(publish());
        assert_eq!(p.next_pause(), ms(50));
        for expected in [100, 200, 400, 800, 1600, 2000, 2000] {
            assert_eq!(p.next_pause(), ms(expected));
        }
        p.reset();
        assert_eq!(p.next_pause(), ms(50));
    }

    #[test]
    fn replay_doubles_from_1_s_to_30_s_and_resets() {
        let mut p = Pauses::new(replay());
        // Powers of two are exact in `f32`.
        for expected in [1, 2, 4, 8, 16, 30, 30, 30] {
            assert_eq!(p.next_pause(), Duration::from_secs(expected));
        }
        p.reset();
        assert_eq!(p.next_pause(), Duration::from_secs(1));
    }

    #[test]
    fn pauses_are_rounded_to_the_millisecond() {
        // What backon alone gives: a hair over 200 ms.
        let raw = reconnect().0.build().nth(1).unwrap_or_default();
        assert_ne!(raw, ms(200));
        assert_eq!(to_the_millisecond(raw), ms(200));
        assert_eq!(to_the_millisecond(Duration::from_micros(1499)), ms(1));
        assert_eq!(to_the_millisecond(Duration::from_micros(1500)), ms(2));
        assert_eq!(
            to_the_millisecond(Duration::MAX),
            Duration::from_millis(u64::MAX)
        );
    }

    #[test]
    fn no_policy_has_jitter() {
        for policy in [reconnect(), publish(), replay()] {
            let a: Vec<Duration> = policy.build().take(20).collect();
            let b: Vec<Duration> = policy.build().take(20).collect();
            assert_eq!(a, b);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn retry_sleeps_the_policys_pauses_on_paused_time() {
        let start = Instant::now();
        let tries = AtomicU32::new(0);
        let mut pauses = Vec::new();
        let done = (|| async {
            let n = tries.fetch_add(1, Ordering::Relaxed) + 1;
            if n < 8 {
                Err(n)
            } else {
                Ok(n)
            }
        })
        .retry(reconnect())
        .notify(|_, pause| pauses.push(pause))
        .await;
        assert_eq!(done, Ok(8));
        assert_eq!(pauses.len(), 7);
        // 100 + 200 + 400 + 800 + 1600 + 2000 + 2000 ms, on tokio's paused clock.
        assert_eq!(start.elapsed(), ms(7100));
        assert_eq!(pauses.iter().sum::<Duration>(), start.elapsed());
    }
}
