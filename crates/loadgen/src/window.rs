//! The rolling window of a live load: the turns that finished in the last `span` (60 s by
//! default), summarized on demand with the statistics whole runs use ([`Summary`]), so the
//! dashboard's figures and a report's are computed the same way.

use kvroute_core::Time;
use kvroute_workload::{RequestRecord, Summary};
use serde::Serialize;
use std::collections::VecDeque;
use std::time::Duration;

/// Turns that finished within the last `span`, at most `max_records` of them.
#[derive(Debug)]
pub struct Window {
    span: Duration,
    max_records: usize,
    records: VecDeque<RequestRecord>,
    /// Records pushed out by `max_records` before their time was up.
    overflowed: u64,
}

/// A window's figures at one instant.
#[derive(Clone, Debug, Serialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS))]
pub struct WindowStats {
    /// The window's length asked for, in seconds.
    pub span_secs: f64,
    /// The time the figures cover, in seconds: the span, or less when the load has not run
    /// that long or more turns finished than the window holds.
    pub covered_secs: f64,
    /// Records pushed out early because the window was full (its figures then cover less
    /// than the span).
    pub overflowed: u64,
    /// The turns' statistics (rates over `covered_secs`).
    pub summary: Summary,
}

/// When a turn left the load: its end, or its arrival when it never finished.
fn ended(r: &RequestRecord) -> Time {
    r.finished.unwrap_or(r.arrival)
}

impl Window {
    /// A window of `span` holding at most `max_records` turns (at least one).
    pub fn new(span: Duration, max_records: usize) -> Self {
        Self {
            span,
            max_records: max_records.max(1),
            records: VecDeque::new(),
            overflowed: 0,
        }
    }

    /// Adds a finished turn (records come in about finishing order); the turns whose time is
    /// up by its end leave, so the window holds its span whether or not anyone reads it.
    pub fn push(&mut self, record: RequestRecord) {
        self.expire(ended(&record));
        if self.records.len() >= self.max_records {
            self.records.pop_front();
            self.overflowed += 1;
        }
        self.records.push_back(record);
    }

    /// Drops the turns that finished before `now - span`.
    fn expire(&mut self, now: Time) {
        let cutoff = now.0.saturating_sub(self.span);
        while let Some(front) = self.records.front() {
            if ended(front).0 >= cutoff {
                break;
            }
            self.records.pop_front();
        }
    }

    /// Turns in the window now.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// Whether the window holds no turn.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Forgets every turn (a new run starts from an empty window).
    pub fn clear(&mut self) {
        self.records.clear();
    }

    /// Drops the turns that finished before `now - span` and summarizes the rest; `running`
    /// is how long the load has run (the window covers no more than that).
    pub fn stats(&mut self, now: Time, running: Duration) -> WindowStats {
        self.expire(now);
        let mut covered = self.span.min(running);
        if self.records.len() >= self.max_records {
            if let Some(oldest) = self.records.front() {
                let t = ended(oldest).0;
                covered = covered.min(now.0.saturating_sub(t));
            }
        }
        // Summarized in place: a full window can hold a lot of inter-token gaps.
        let summary = Summary::from_records(self.records.make_contiguous(), covered);
        WindowStats {
            span_secs: self.span.as_secs_f64(),
            covered_secs: covered.as_secs_f64(),
            overflowed: self.overflowed,
            summary,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvroute_core::RequestId;

    fn rec(id: u64, sent_s: f64, ttft_s: f64, done_s: f64) -> RequestRecord {
        let t = |s: f64| Time(Duration::from_secs_f64(s));
        let mut r = RequestRecord::new(RequestId(id), t(sent_s), 100);
        r.first_token = Some(t(sent_s + ttft_s));
        r.finished = Some(t(done_s));
        r.output_tokens = 10;
        r.cached_tokens = 50;
        r
    }

    #[test]
    fn turns_leave_the_window_when_their_time_is_up() {
        let mut w = Window::new(Duration::from_secs(60), 1000);
        w.push(rec(0, 0.0, 1.0, 5.0));
        w.push(rec(1, 30.0, 0.2, 40.0));
        w.push(rec(2, 60.0, 0.4, 70.0));
        let s = w.stats(Time(Duration::from_secs(80)), Duration::from_secs(80));
        // The turn that finished at 5 s is older than 80 - 60 = 20 s.
        assert_eq!(s.summary.sent, 2);
        assert_eq!(w.len(), 2);
        assert_eq!(s.covered_secs, 60.0);
        let p50 = s.summary.ttft_ms.p50.unwrap();
        assert!((200.0..=400.0).contains(&p50), "{p50}");
        assert_eq!(s.summary.hit_rate, Some(0.5));
        // 2 turns over 60 s.
        assert!((s.summary.requests_per_s.unwrap() - 2.0 / 60.0).abs() < 1e-9);
    }

    #[test]
    fn a_window_nobody_reads_still_forgets_turns_whose_time_is_up() {
        // One turn a second for an hour, never summarized (no dashboard open): the window
        // holds its last minute, not every turn up to `max_records`.
        let mut w = Window::new(Duration::from_secs(60), 20_000);
        for i in 0..3600 {
            let s = i as f64;
            w.push(rec(i, s, 0.1, s + 1.0));
        }
        assert!((60..=62).contains(&w.len()), "{}", w.len());
        assert_eq!(w.overflowed, 0);
    }

    #[test]
    fn a_young_load_covers_only_its_running_time() {
        let mut w = Window::new(Duration::from_secs(60), 1000);
        w.push(rec(0, 0.0, 0.1, 2.0));
        let s = w.stats(Time(Duration::from_secs(4)), Duration::from_secs(4));
        assert_eq!(s.covered_secs, 4.0);
        assert!((s.summary.requests_per_s.unwrap() - 0.25).abs() < 1e-9);
    }

    #[test]
    fn a_full_window_says_so_and_covers_less() {
        let mut w = Window::new(Duration::from_secs(60), 2);
        for i in 0..4 {
            w.push(rec(i, i as f64, 0.1, 10.0 + i as f64));
        }
        let s = w.stats(Time(Duration::from_secs(20)), Duration::from_secs(20));
        assert_eq!((s.summary.sent, s.overflowed), (2, 2));
        // The oldest record kept finished at 12 s.
        assert_eq!(s.covered_secs, 8.0);
    }

    #[test]
    fn an_empty_window_has_no_figures() {
        let mut w = Window::new(Duration::from_secs(60), 10);
        let s = w.stats(Time(Duration::from_secs(1)), Duration::from_secs(1));
        assert_eq!(s.summary.sent, 0);
        assert_eq!(s.summary.ttft_ms.p95, None);
        assert_eq!(s.summary.requests_per_s, Some(0.0));
        assert!(w.is_empty());
    }
}
