//! What every arm measured at each concurrency level it held: once a level has been applied
//! for the settling time (the window then holds only turns that ended at that level), each
//! tick keeps every arm's window figures for it, the latest replacing the one before. The
//! dashboard's static comparison table is filled from these, and they can be saved as
//! baseline files (`kvroute bench`'s format).

use kvroute_workload::Summary;
use serde::Serialize;
use std::collections::BTreeMap;

/// The most levels remembered; past it the level measured longest ago leaves.
pub const MAX_LEVELS: usize = 64;

/// One arm's figures at one level.
#[derive(Clone, Debug, Serialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS))]
pub struct ArmPoint {
    /// The arm.
    pub name: String,
    /// Whether it is the baseline.
    pub baseline: bool,
    /// Seconds the level had held when the figures were taken.
    pub held_secs: f64,
    /// When, in milliseconds since the Unix epoch.
    pub taken_unix_ms: u64,
    /// Its window at that instant.
    pub summary: Summary,
}

/// Every arm's figures at one concurrency level.
#[derive(Clone, Debug, Serialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS))]
pub struct LevelPoint {
    /// Conversations in flight.
    pub concurrency: usize,
    /// One per arm that measured it, in the service's arm order.
    pub arms: Vec<ArmPoint>,
}

/// The levels measured so far.
#[derive(Debug, Default)]
pub(crate) struct Levels {
    /// Level -> (arm order, point).
    points: BTreeMap<usize, BTreeMap<usize, ArmPoint>>,
}

impl Levels {
    /// Keeps `point` as arm `order`'s figures at `level`.
    pub(crate) fn record(&mut self, level: usize, order: usize, point: ArmPoint) {
        if !self.points.contains_key(&level) && self.points.len() >= MAX_LEVELS {
            let oldest = self
                .points
                .iter()
                .min_by_key(|(_, arms)| arms.values().map(|p| p.taken_unix_ms).max())
                .map(|(l, _)| *l);
            if let Some(l) = oldest {
                self.points.remove(&l);
            }
        }
        self.points.entry(level).or_default().insert(order, point);
    }

    /// Every level, lowest first.
    pub(crate) fn list(&self) -> Vec<LevelPoint> {
        self.points
            .iter()
            .map(|(level, arms)| LevelPoint {
                concurrency: *level,
                arms: arms.values().cloned().collect(),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn point(name: &str, at: u64) -> ArmPoint {
        ArmPoint {
            name: name.into(),
            baseline: false,
            held_secs: 90.0,
            taken_unix_ms: at,
            summary: Summary::from_records(&[], Duration::from_secs(1)),
        }
    }

    #[test]
    fn the_latest_figures_win_and_levels_are_bounded() {
        let mut l = Levels::default();
        l.record(60, 1, point("round_robin", 1));
        l.record(60, 0, point("goodput", 2));
        l.record(60, 0, point("goodput", 3));
        let list = l.list();
        assert_eq!(list.len(), 1);
        let names: Vec<_> = list[0].arms.iter().map(|a| a.name.as_str()).collect();
        assert_eq!(names, ["goodput", "round_robin"]);
        assert_eq!(list[0].arms[0].taken_unix_ms, 3);
        for level in 0..MAX_LEVELS + 5 {
            l.record(100 + level, 0, point("goodput", 10 + level as u64));
        }
        let list = l.list();
        assert_eq!(list.len(), MAX_LEVELS);
        // The level taken longest ago left first.
        assert!(list.iter().all(|p| p.concurrency != 60));
        assert_eq!(
            list.last().map(|p| p.concurrency),
            Some(100 + MAX_LEVELS + 4)
        );
    }
}
