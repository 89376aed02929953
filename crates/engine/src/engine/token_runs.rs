//! Tokens of silent steps reported by run rather than one by one.
//!
//! Over a run of silent steps (see the `silent` module) the running set does not change:
//! every sequence in it gets one token at the end of each step. A caller that only needs
//! each token's request and time (the fleet simulator: inter-token gaps) can take the run as
//! its sequences and its step ends ([`Engine::set_token_runs`]) instead of one
//! [`crate::engine::Sampled`] per token, which for a busy engine is most of its output.
//!
//! [`Engine::set_token_runs`]: crate::Engine::set_token_runs

use kvroute_core::{RequestId, Time};

/// Runs of silent steps' tokens, in time order. See the module documentation.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TokenRuns {
    ids: Vec<RequestId>,
    times: Vec<Time>,
    /// The end of each run in `ids` and in `times`.
    ends: Vec<(usize, usize)>,
}

impl TokenRuns {
    /// True when there is no token.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Drops every run, keeping the buffers.
    pub fn clear(&mut self) {
        self.ids.clear();
        self.times.clear();
        self.ends.clear();
    }

    /// Each run: its sequences (in the engine's order) and its step ends (in time order).
    /// Every sequence of a run got one token at each of its times.
    pub fn runs(&self) -> impl Iterator<Item = (&[RequestId], &[Time])> + '_ {
        let mut start = (0, 0);
        self.ends.iter().map(move |&end| {
            let run = (&self.ids[start.0..end.0], &self.times[start.1..end.1]);
            start = end;
            run
        })
    }

    /// Every token as `(request, time)`, in the order stepping one step at a time reports
    /// them (by step, then by sequence).
    pub fn tokens(&self) -> impl Iterator<Item = (RequestId, Time)> + '_ {
        self.runs().flat_map(|(ids, times)| {
            times
                .iter()
                .flat_map(move |&t| ids.iter().map(move |&id| (id, t)))
        })
    }

    /// Moves the runs of `other` after these.
    pub fn append(&mut self, other: &mut Self) {
        let (ids, times) = (self.ids.len(), self.times.len());
        self.ends
            .extend(other.ends.iter().map(|&(i, t)| (i + ids, t + times)));
        self.ids.append(&mut other.ids);
        self.times.append(&mut other.times);
        other.clear();
    }

    /// Starts a run of the sequences `ids`; its steps follow ([`TokenRuns::push_step`]).
    pub(super) fn begin(&mut self, ids: impl Iterator<Item = RequestId>) {
        self.ids.extend(ids);
    }

    /// A step of the run begun last ended at `time`.
    pub(super) fn push_step(&mut self, time: Time) {
        self.times.push(time);
    }

    /// Ends the run begun last (dropped when no step was pushed).
    pub(super) fn end(&mut self) {
        let (ids, times) = self.ends.last().copied().unwrap_or((0, 0));
        if self.times.len() == times {
            self.ids.truncate(ids);
        } else {
            self.ends.push((self.ids.len(), self.times.len()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(ms: u64) -> Time {
        Time::from_millis(ms)
    }

    #[test]
    fn runs_list_their_tokens_by_step_then_sequence_and_empty_runs_vanish() {
        let mut a = TokenRuns::default();
        a.begin([RequestId(1), RequestId(2)].into_iter());
        a.push_step(t(10));
        a.push_step(t(20));
        a.end();
        a.begin([RequestId(3)].into_iter());
        a.end();
        let mut b = TokenRuns::default();
        b.begin([RequestId(2)].into_iter());
        b.push_step(t(30));
        b.end();
        a.append(&mut b);
        assert!(b.is_empty());
        let tokens: Vec<_> = a.tokens().collect();
        assert_eq!(
            tokens,
            vec![
                (RequestId(1), t(10)),
                (RequestId(2), t(10)),
                (RequestId(1), t(20)),
                (RequestId(2), t(20)),
                (RequestId(2), t(30)),
            ]
        );
        assert_eq!(a.runs().count(), 2);
        a.clear();
        assert!(a.is_empty() && a.tokens().next().is_none());
    }
}
