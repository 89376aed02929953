//! The waiting queue's order and the preemption victim, first come first served or by
//! priority (vLLM's `--scheduling-policy priority`, [`super::EngineConfig::priority_scheduling`]):
//! waiting requests ordered by `(priority, arrival)`, lower first, the first of them that has
//! arrived admitted next (a request is in vLLM's queue only once it arrived); when the cache
//! has no block for a running sequence, the running one of the largest `(priority, arrival)`
//! is preempted (possibly the one asking, or one already given work in the step, which is
//! taken back, as vLLM does) and goes back to the queue in its place by the same order. First come first served: the queue in arrival order (a preempted sequence
//! back at its front), the most recently admitted unscheduled sequence preempted.

use super::{Engine, Seq};
use kvroute_core::Time;

impl Engine {
    /// Queues `s` in its place.
    pub(super) fn enqueue(&mut self, s: Seq) {
        if self.cfg.priority_scheduling {
            let key = (s.priority, s.arrived);
            let at = self
                .waiting
                .partition_point(|w| (w.priority, w.arrived) <= key);
            self.waiting.insert(at, s);
        } else {
            self.waiting.push_back(s);
        }
    }

    /// Puts preempted sequences (in running order) back in the queue.
    pub(super) fn requeue(&mut self, back: Vec<Seq>) {
        if self.cfg.priority_scheduling {
            for s in back {
                self.enqueue(s);
            }
        } else {
            // Oldest first at the front.
            for s in back.into_iter().rev() {
                self.waiting.push_front(s);
            }
        }
    }

    /// The index of the waiting request admitted next, when it has arrived.
    pub(super) fn first_ready(&self) -> Option<usize> {
        if self.cfg.priority_scheduling {
            self.waiting.iter().position(|s| s.ready <= self.now)
        } else {
            self.waiting
                .front()
                .filter(|s| s.ready <= self.now)
                .map(|_| 0)
        }
    }

    /// When the next waiting request may be admitted (None: nothing waits).
    pub(super) fn next_ready(&self) -> Option<Time> {
        if self.cfg.priority_scheduling {
            self.waiting.iter().map(|s| s.ready).min()
        } else {
            self.waiting.front().map(|s| s.ready)
        }
    }

    /// The running sequence to preempt so that sequence `i` gets blocks, among those not
    /// preempted in this step: by priority, any of them (`i` itself, or one already given
    /// work in this step, which the caller takes back); first come, first served, the most
    /// recently admitted one not scheduled yet, else `i`.
    pub(super) fn victim(&self, i: usize, scheduled: &[bool], preempted: &[bool]) -> usize {
        if self.cfg.priority_scheduling {
            let key = |v: usize| (self.running[v].priority, self.running[v].arrived);
            (0..self.running.len())
                .filter(|v| !preempted[*v])
                // The last of equal keys: the most recently admitted.
                .max_by_key(|&v| (key(v), v))
                .unwrap_or(i)
        } else {
            (0..self.running.len())
                .rev()
                .find(|v| *v != i && !scheduled[*v] && !preempted[*v])
                .unwrap_or(i)
        }
    }
}
