//! `kvroute bench`'s progress, cell by cell, with the time left: a bar on a terminal
//! (redrawn every second, so a live run's countdown moves), else one line on stderr per
//! finished cell. The time left is the seconds per unit of work measured so far over the
//! work left (a live run's work is its fixed duration; a simulated run's grows with its
//! load), before any run has finished the live runs' duration.

use indicatif::{ProgressBar, ProgressState, ProgressStyle};
use parking_lot::Mutex;
use std::io::IsTerminal;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Seconds left from what finished so far (pure: the caller gives the times).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Eta {
    /// Seconds the finished runs took.
    pub done_secs: f64,
    /// Their work.
    pub done_work: f64,
    /// Seconds per unit of work before any run has finished (live runs: their duration,
    /// one unit each); None: unknown until one has.
    pub prior_secs_per_work: Option<f64>,
}

impl Eta {
    /// Seconds per unit of work: measured, else the prior.
    fn rate(&self) -> Option<f64> {
        if self.done_work > 0.0 {
            Some(self.done_secs / self.done_work)
        } else {
            self.prior_secs_per_work
        }
    }

    /// Seconds left: `current` (the running run's work and seconds so far) finishing, then
    /// `after` units of work; None while nothing tells.
    pub fn left(&self, current: Option<(f64, f64)>, after: f64) -> Option<f64> {
        let rate = self.rate()?;
        let running = current.map_or(0.0, |(work, elapsed)| (work * rate - elapsed).max(0.0));
        Some(running + after * rate)
    }

    /// A run of `work` took `secs`.
    pub fn record(&mut self, work: f64, secs: f64) {
        self.done_work += work;
        self.done_secs += secs;
    }
}

/// A duration as a person reads it: `42s`, `7m02s`, `1h05m`.
pub fn hms(secs: f64) -> String {
    let s = secs.max(0.0).round() as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
    }
}

/// Where the sweep is.
#[derive(Debug)]
struct State {
    eta: Eta,
    /// Each cell's work per run, in the order they run.
    cell_work: Vec<f64>,
    runs_per_cell: usize,
    /// The cell running (index) and its runs finished.
    cell: usize,
    runs_done: usize,
    /// When the running run started.
    run_started: Option<Instant>,
}

impl State {
    /// Work of the runs not started yet (besides the running one, when one runs).
    fn work_not_started(&self) -> f64 {
        let this = self.cell_work.get(self.cell).copied().unwrap_or(0.0);
        let later: f64 = self.cell_work.iter().skip(self.cell + 1).sum();
        let started = self.runs_done + usize::from(self.run_started.is_some());
        let runs_left = self.runs_per_cell.saturating_sub(started);
        this * runs_left as f64 + later * self.runs_per_cell as f64
    }

    fn left(&self, now: Instant) -> Option<f64> {
        let current = self.run_started.map(|t| {
            let work = self.cell_work.get(self.cell).copied().unwrap_or(0.0);
            (work, now.saturating_duration_since(t).as_secs_f64())
        });
        self.eta.left(current, self.work_not_started())
    }

    fn left_text(&self, now: Instant) -> String {
        self.left(now).map_or_else(
            || "time left: estimating".into(),
            |s| format!("~{} left", hms(s)),
        )
    }
}

/// The sweep's progress, shown as it goes.
pub struct Progress {
    state: Arc<Mutex<State>>,
    started: Instant,
    bar: Option<ProgressBar>,
}

impl Progress {
    /// A sweep of cells whose runs each cost `cell_work` (in order), `runs_per_cell` runs
    /// each; `prior_secs_per_work` as in [`Eta`]. A bar when stderr is a terminal.
    pub fn new(
        cell_work: Vec<f64>,
        runs_per_cell: usize,
        prior_secs_per_work: Option<f64>,
    ) -> Self {
        let cells = cell_work.len();
        let state = Arc::new(Mutex::new(State {
            eta: Eta {
                prior_secs_per_work,
                ..Eta::default()
            },
            cell_work,
            runs_per_cell,
            cell: 0,
            runs_done: 0,
            run_started: None,
        }));
        let bar = std::io::stderr().is_terminal().then(|| {
            let shared = state.clone();
            let style = ProgressStyle::with_template(
                "{bar:30} {pos}/{len} cells done, {elapsed} elapsed, {left} {msg}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .with_key(
                "left",
                move |_: &ProgressState, w: &mut dyn std::fmt::Write| {
                    let left = shared.lock().left_text(Instant::now());
                    let _ = w.write_str(&left);
                },
            );
            let bar = ProgressBar::new(cells as u64).with_style(style);
            bar.enable_steady_tick(Duration::from_secs(1));
            bar
        });
        Self {
            state,
            started: Instant::now(),
            bar,
        }
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, State> {
        self.state.lock()
    }

    /// Run `run` (from 0) of cell `cell` (from 0), the cell labelled `label`, starts.
    pub fn run_starts(&self, cell: usize, run: usize, label: &str) {
        let mut s = self.lock();
        s.cell = cell;
        s.runs_done = run;
        s.run_started = Some(Instant::now());
        let runs = s.runs_per_cell;
        drop(s);
        if let Some(bar) = &self.bar {
            bar.set_message(if runs > 1 {
                format!("· now {label}, run {}/{runs}", run + 1)
            } else {
                format!("· now {label}")
            });
        }
    }

    /// The running run ended.
    pub fn run_ends(&self) {
        let mut s = self.lock();
        if let Some(t) = s.run_started.take() {
            let work = s.cell_work.get(s.cell).copied().unwrap_or(0.0);
            s.eta.record(work, t.elapsed().as_secs_f64());
        }
        s.runs_done += 1;
    }

    /// Cell `cell` (from 0), `label`, is done: the bar moves on, or a line says so.
    pub fn cell_done(&self, cell: usize, label: &str, cell_secs: f64) {
        let mut s = self.lock();
        s.cell = cell + 1;
        s.runs_done = 0;
        let line = format!(
            "bench: cell {}/{} {label} done in {}; {} elapsed, {}",
            cell + 1,
            s.cell_work.len(),
            hms(cell_secs),
            hms(self.started.elapsed().as_secs_f64()),
            s.left_text(Instant::now())
        );
        drop(s);
        match &self.bar {
            Some(bar) => bar.inc(1),
            None => eprintln!("{line}"),
        }
    }

    /// Prints `f`'s output without tearing the bar.
    pub fn suspend(&self, f: impl FnOnce()) {
        match &self.bar {
            Some(bar) => bar.suspend(f),
            None => f(),
        }
    }

    /// The sweep is over.
    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }

    /// The first line: what runs, and for how long when that is known.
    pub fn announce(&self, what: &str) {
        let s = self.lock();
        let total = s.eta.left(None, s.work_not_started());
        let runs = s.cell_work.len() * s.runs_per_cell;
        let line = format!(
            "bench: {} cells x {} run(s) = {runs} runs, {what}{}",
            s.cell_work.len(),
            s.runs_per_cell,
            total.map_or_else(String::new, |t| format!(": about {}", hms(t)))
        );
        drop(s);
        self.suspend(|| eprintln!("{line}"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_left_is_measured_work_over_work_left() {
        // Nothing known yet: no guess.
        let mut eta = Eta::default();
        assert_eq!(eta.left(Some((1.0, 5.0)), 3.0), None);
        // Live runs: their duration before any finished (60 s each), counting down.
        let live = Eta {
            prior_secs_per_work: Some(60.0),
            ..Eta::default()
        };
        assert_eq!(live.left(None, 4.0), Some(240.0));
        assert_eq!(live.left(Some((1.0, 20.0)), 3.0), Some(220.0));
        // A run past its estimate adds nothing more.
        assert_eq!(live.left(Some((1.0, 90.0)), 0.0), Some(0.0));
        // Measured: 30 s for 10 units of work, 30 units left: 90 s.
        eta.record(10.0, 30.0);
        assert_eq!(eta.left(None, 30.0), Some(90.0));
        // The measurement wins over the prior.
        let mut measured = live.clone();
        measured.record(1.0, 70.0);
        assert_eq!(measured.left(None, 2.0), Some(140.0));
    }

    #[test]
    fn work_left_counts_the_running_cells_other_runs_and_every_later_cell() {
        let mut s = State {
            eta: Eta::default(),
            cell_work: vec![1.0, 2.0, 4.0],
            runs_per_cell: 3,
            cell: 1,
            runs_done: 1,
            run_started: None,
        };
        // Between runs: cell 1's two runs left (4), cell 2's three (12).
        assert_eq!(s.work_not_started(), 16.0);
        // While cell 1's second run runs: one more of cell 1 (2), then cell 2 (12).
        s.run_started = Some(Instant::now());
        assert_eq!(s.work_not_started(), 14.0);
        // Between cells: the next cell whole.
        s.run_started = None;
        s.cell = 2;
        s.runs_done = 0;
        assert_eq!(s.work_not_started(), 12.0);
    }

    #[test]
    fn durations_read_as_minutes_and_hours() {
        assert_eq!(hms(42.4), "42s");
        assert_eq!(hms(422.0), "7m02s");
        assert_eq!(hms(3900.0), "1h05m");
        assert_eq!(hms(-3.0), "0s");
    }
}
