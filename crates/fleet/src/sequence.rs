//! The decisions of event ingestion, without IO: what a batch's sequence number means, and
//! what a replay answer says about the engine after its publisher went away and came back.
//!
//! An engine numbers its batches 0, 1, 2, ... per incarnation and keeps the last few
//! thousand for replay. After a reconnect the gateway asks the replay service for the batch
//! it applied last: the same batch (same sequence number and the same content) means the
//! same incarnation, whose cache the index still mirrors; anything else means the engine
//! restarted (its cache is gone) and the index is rebuilt from the replay.

use kvroute_protocol::kv_events::{Event, EventBatch};
use std::collections::VecDeque;
use std::hash::{DefaultHasher, Hash, Hasher};

/// How many of the batches applied last are remembered to tell a batch delivered twice or
/// late from a new incarnation's.
pub const RECENT_MARKS: usize = 1024;

/// A batch's sequence number and a digest of its content: tells one incarnation's batch
/// from another's with the same number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mark {
    /// The sequence number.
    pub seq: u64,
    digest: u64,
}

impl Mark {
    /// A mark from its parts (a snapshot's).
    pub fn from_parts(seq: u64, digest: u64) -> Self {
        Self { seq, digest }
    }

    /// The content digest.
    pub fn digest(&self) -> u64 {
        self.digest
    }

    /// The mark of `b`.
    pub fn of(b: &EventBatch) -> Self {
        let mut h = DefaultHasher::new();
        b.ts.to_bits().hash(&mut h);
        b.dp_rank.hash(&mut h);
        b.events.len().hash(&mut h);
        for e in &b.events {
            match e {
                Event::Stored(s) => {
                    (0u8, s.block_hashes.first(), s.block_hashes.len()).hash(&mut h);
                    (s.parent, s.token_ids.len(), s.token_ids.first()).hash(&mut h);
                }
                Event::Removed(r) => {
                    (1u8, r.block_hashes.first(), r.block_hashes.len()).hash(&mut h);
                }
                Event::Cleared => 2u8.hash(&mut h),
                Event::Unknown(tag) => (3u8, tag).hash(&mut h),
            }
        }
        Self {
            seq: b.seq,
            digest: h.finish(),
        }
    }
}

/// What a live batch with sequence `seq` means when `next` was expected (None: nothing
/// seen yet).
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// The next one: apply it.
    Apply,
    /// Batches `from..seq` were lost: fetch them, then apply this one.
    Gap {
        /// The first missing sequence number.
        from: u64,
    },
    /// The number went back: a batch delivered twice or late, or a new engine incarnation
    /// ([`judge_back`] says which).
    Back,
}

/// Classifies a live batch.
pub fn classify(next: Option<u64>, seq: u64) -> Step {
    match next {
        None => Step::Apply,
        Some(n) if seq == n => Step::Apply,
        Some(n) if seq > n => Step::Gap { from: n },
        Some(_) => Step::Back,
    }
}

/// The marks of the batches applied last, at most [`RECENT_MARKS`].
#[derive(Debug, Default)]
pub struct Recent {
    marks: VecDeque<Mark>,
}

impl Recent {
    /// Remembers an applied batch (forgetting the oldest past the bound).
    pub fn push(&mut self, mark: Mark) {
        if self.marks.len() == RECENT_MARKS {
            self.marks.pop_front();
        }
        self.marks.push_back(mark);
    }

    /// Forgets everything (the index was dropped).
    pub fn clear(&mut self) {
        self.marks.clear();
    }

    fn find(&self, seq: u64) -> Option<Mark> {
        self.marks.iter().rev().find(|m| m.seq == seq).copied()
    }
}

/// What a batch whose number went back (below `next`) is.
#[derive(Debug, PartialEq, Eq)]
pub enum Back {
    /// A batch applied already, delivered again: drop it.
    Duplicate,
    /// A recent number never applied (lost in a gap and delivered late, or replayed past):
    /// drop it; the engine is the same.
    Stale,
    /// Another engine incarnation: its number 0, other content under a number applied, or a
    /// number too far back to be a late delivery.
    Restart,
}

/// Judges a batch with `mark` that arrived when `next` was expected (`mark.seq < next`).
pub fn judge_back(recent: &Recent, mark: Mark, next: u64) -> Back {
    match recent.find(mark.seq) {
        Some(m) if m == mark => Back::Duplicate,
        Some(_) => Back::Restart,
        None if mark.seq == 0 => Back::Restart,
        None if next.saturating_sub(mark.seq) <= RECENT_MARKS as u64 => Back::Stale,
        None => Back::Restart,
    }
}

/// What an answer of the replay service, asked from the last applied batch on, says.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The same incarnation: apply the answer's batches after position `from` (the index
    /// still mirrors the cache).
    Same {
        /// Index into the answer of the first batch not applied yet.
        from: usize,
    },
    /// Not the batch applied last: the engine restarted (or its ring no longer holds that
    /// batch). Ask again from 0 and rebuild.
    Changed,
}

/// Judges `answer` (batches from `last.seq` on) against the batch applied last.
pub fn verdict(last: Mark, answer: &[std::sync::Arc<EventBatch>]) -> Verdict {
    match answer.first() {
        Some(b) if Mark::of(b) == last => Verdict::Same { from: 1 },
        _ => Verdict::Changed,
    }
}

/// The consecutive run of `answer` (sorted by sequence number) from its start, and whether
/// it begins at the stream's first batch (then nothing before it was missed).
pub fn complete_from_start(answer: &[std::sync::Arc<EventBatch>]) -> (usize, bool) {
    let Some(first) = answer.first() else {
        return (0, true);
    };
    let run = answer
        .iter()
        .enumerate()
        .take_while(|(i, b)| b.seq == first.seq.wrapping_add(*i as u64))
        .count();
    (run, first.seq == 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn batch(seq: u64, ts: f64) -> Arc<EventBatch> {
        Arc::new(EventBatch {
            seq,
            ts,
            events: vec![Event::Cleared],
            dp_rank: None,
        })
    }

    #[test]
    fn sequence_numbers_are_classified() {
        assert_eq!(classify(None, 17), Step::Apply);
        assert_eq!(classify(Some(5), 5), Step::Apply);
        assert_eq!(classify(Some(5), 9), Step::Gap { from: 5 });
        assert_eq!(classify(Some(5), 4), Step::Back);
        assert_eq!(classify(Some(5), 0), Step::Back);
    }

    #[test]
    fn a_batch_going_back_is_a_duplicate_a_late_one_or_a_restart() {
        let mut recent = Recent::default();
        // Applied: 0..=9 except 6 (lost in a gap).
        for seq in (0..10).filter(|&s| s != 6) {
            recent.push(Mark::of(&batch(seq, seq as f64)));
        }
        let next = 10;
        let judge = |seq, ts| judge_back(&recent, Mark::of(&batch(seq, ts)), next);
        assert_eq!(judge(8, 8.0), Back::Duplicate);
        assert_eq!(judge(0, 0.0), Back::Duplicate);
        assert_eq!(judge(6, 6.0), Back::Stale);
        // Other content under a number applied, or a new stream's first batch.
        assert_eq!(judge(8, 80.0), Back::Restart);
        assert_eq!(judge(0, 50.0), Back::Restart);
        // Far behind everything remembered.
        let far = judge_back(&recent, Mark::of(&batch(6, 6.0)), 5_000);
        assert_eq!(far, Back::Restart);
        // The memory is bounded: the oldest marks go first.
        for seq in 10..10 + RECENT_MARKS as u64 {
            recent.push(Mark::of(&batch(seq, seq as f64)));
        }
        assert_eq!(recent.marks.len(), RECENT_MARKS);
        assert!(recent.find(9).is_none() && recent.find(10).is_some());
        recent.clear();
        assert!(recent.find(10).is_none());
    }

    #[test]
    fn a_replay_answer_tells_the_same_engine_from_a_restarted_one() {
        let last = Mark::of(&batch(4, 10.0));
        // The same batch 4, then two more.
        let same = [batch(4, 10.0), batch(5, 11.0), batch(6, 12.0)];
        assert_eq!(verdict(last, &same), Verdict::Same { from: 1 });
        // A batch 4 of another incarnation (another time): restarted.
        assert_eq!(verdict(last, &[batch(4, 99.0)]), Verdict::Changed);
        // Nothing from 4 on (a new engine with fewer batches) or a ring past 4.
        assert_eq!(verdict(last, &[]), Verdict::Changed);
        assert_eq!(verdict(last, &[batch(7, 13.0)]), Verdict::Changed);
        // Content counts, not only the time.
        let mut other = (*batch(4, 10.0)).clone();
        other.events = vec![Event::Unknown("x".into())];
        assert_eq!(verdict(last, &[Arc::new(other)]), Verdict::Changed);
    }

    #[test]
    fn a_full_answer_is_complete_only_from_the_first_batch() {
        assert_eq!(complete_from_start(&[]), (0, true));
        assert_eq!(
            complete_from_start(&[batch(0, 1.0), batch(1, 1.0), batch(3, 1.0)]),
            (2, true)
        );
        assert_eq!(
            complete_from_start(&[batch(5, 1.0), batch(6, 1.0)]),
            (2, false)
        );
    }
}
