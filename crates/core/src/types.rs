//! Small value types shared by every part of the core.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::time::Duration;

/// A worker (engine replica, or one data-parallel rank of it), named by the caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct WorkerId(pub u64);

impl fmt::Display for WorkerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// What a worker does in a disaggregated fleet: a request's prompt is computed (prefill) on
/// one worker and its tokens generated (decode) on another, its KV cache moved between
/// them; a worker that does both serves a request alone.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkerRole {
    /// Prefill and decode: every request may be served whole here (the default).
    #[default]
    Both,
    /// Prefill only: it computes prompts whose KV another worker decodes from.
    Prefill,
    /// Decode only (it may also compute a prompt itself when no prefill worker does).
    Decode,
}

impl WorkerRole {
    /// Every role, in their order.
    pub const ALL: [WorkerRole; 3] = [WorkerRole::Both, WorkerRole::Prefill, WorkerRole::Decode];

    /// Its name in configuration, labels and answers.
    pub fn as_str(self) -> &'static str {
        match self {
            WorkerRole::Both => "both",
            WorkerRole::Prefill => "prefill",
            WorkerRole::Decode => "decode",
        }
    }

    /// Whether it generates tokens (a request's worker of record is one that does).
    pub fn decodes(self) -> bool {
        self != WorkerRole::Prefill
    }
}

impl fmt::Display for WorkerRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for WorkerRole {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|r| r.as_str() == s)
            .ok_or_else(|| format!("role {s:?} is not one of both, prefill, decode"))
    }
}

/// The workers a request may go to.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub enum Eligible {
    /// Any worker.
    #[default]
    Any,
    /// Any but this one (a retry after it failed there).
    Except(WorkerId),
    /// Only these, sorted and without repeats (a data plane's subset of endpoints).
    Only(std::sync::Arc<[WorkerId]>),
}

/// [`Eligible::Any`], for requests that borrow it.
pub static ANY_WORKER: Eligible = Eligible::Any;

impl Eligible {
    /// Any worker but `worker`, when one is given.
    pub fn except(worker: Option<WorkerId>) -> Self {
        worker.map_or(Self::Any, Self::Except)
    }

    /// Only `workers` (an empty set allows none).
    pub fn only(workers: impl IntoIterator<Item = WorkerId>) -> Self {
        let mut v: Vec<WorkerId> = workers.into_iter().collect();
        v.sort_unstable();
        v.dedup();
        Self::Only(v.into())
    }

    /// Whether `worker` may be chosen.
    pub fn allows(&self, worker: WorkerId) -> bool {
        match self {
            Self::Any => true,
            Self::Except(w) => *w != worker,
            Self::Only(ws) => ws.binary_search(&worker).is_ok(),
        }
    }

    /// Whether the two sets may share a worker (`Except` sets are taken to: the fleet has
    /// more than two workers as far as this can tell).
    pub fn overlaps(&self, other: &Eligible) -> bool {
        match (self, other) {
            (Self::Only(a), Self::Only(b)) => a.iter().any(|w| b.binary_search(w).is_ok()),
            (Self::Only(s), Self::Any) | (Self::Any, Self::Only(s)) => !s.is_empty(),
            (Self::Only(s), Self::Except(x)) | (Self::Except(x), Self::Only(s)) => {
                s.iter().any(|w| w != x)
            }
            _ => true,
        }
    }

    /// The set for a retry after `worker` failed: a subset loses it; otherwise every worker
    /// but it (only the worker that failed last is avoided).
    pub fn after_failure(&self, worker: WorkerId) -> Self {
        match self {
            Self::Any | Self::Except(_) => Self::Except(worker),
            Self::Only(ws) => Self::Only(ws.iter().copied().filter(|w| *w != worker).collect()),
        }
    }
}

/// A request, named by the caller; unique among requests in flight.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct RequestId(pub u64);

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A point in time, as the time since an origin the caller chose (process start for the
/// gateway, zero for the simulator). The core never reads a clock.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
pub struct Time(pub Duration);

impl Time {
    /// The origin.
    pub const ZERO: Time = Time(Duration::ZERO);

    /// Time from seconds (negative and non-finite values clamp to zero / the maximum).
    pub fn from_secs_f64(s: f64) -> Self {
        Time(Duration::try_from_secs_f64(s.max(0.0)).unwrap_or(Duration::MAX))
    }

    /// Time from milliseconds.
    pub fn from_millis(ms: u64) -> Self {
        Time(Duration::from_millis(ms))
    }

    /// Seconds since the origin.
    pub fn as_secs_f64(self) -> f64 {
        self.0.as_secs_f64()
    }

    /// `self + d`, saturating.
    pub fn plus(self, d: Duration) -> Time {
        Time(self.0.saturating_add(d))
    }

    /// `self - earlier`, zero when `earlier` is later.
    pub fn since(self, earlier: Time) -> Duration {
        self.0.saturating_sub(earlier.0)
    }
}

/// The KV block size in tokens: non-zero and at most 1,048,576.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "usize", into = "usize")]
pub struct BlockSize(usize);

/// A block size that is zero or absurdly large.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("block size must be between 1 and {max} tokens, got {0}", max = BlockSize::MAX)]
pub struct InvalidBlockSize(pub usize);

impl BlockSize {
    /// The largest accepted block size.
    pub const MAX: usize = 1 << 20;

    /// Validates a block size.
    pub fn new(tokens: usize) -> Result<Self, InvalidBlockSize> {
        if tokens == 0 || tokens > Self::MAX {
            Err(InvalidBlockSize(tokens))
        } else {
            Ok(Self(tokens))
        }
    }

    /// Tokens per block.
    pub fn get(self) -> usize {
        self.0
    }

    /// Number of blocks (full or partial) that `tokens` tokens occupy.
    pub fn blocks_for(self, tokens: usize) -> usize {
        tokens.div_ceil(self.0)
    }
}

impl TryFrom<usize> for BlockSize {
    type Error = InvalidBlockSize;
    fn try_from(v: usize) -> Result<Self, Self::Error> {
        Self::new(v)
    }
}

impl From<BlockSize> for usize {
    fn from(b: BlockSize) -> usize {
        b.0
    }
}

impl fmt::Display for BlockSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_size_rejects_zero_and_huge() {
        assert!(BlockSize::new(0).is_err());
        assert!(BlockSize::new(BlockSize::MAX + 1).is_err());
        assert_eq!(BlockSize::new(16).unwrap().blocks_for(33), 3);
        let parsed: Result<BlockSize, _> = serde_json::from_str("0");
        assert!(parsed.is_err());
    }

    #[test]
    fn time_saturates() {
        assert_eq!(Time::from_secs_f64(-1.0), Time::ZERO);
        assert_eq!(Time::from_secs_f64(f64::NAN), Time::ZERO);
        assert_eq!(
            Time::from_millis(5).since(Time::from_millis(9)),
            Duration::ZERO
        );
    }
}
