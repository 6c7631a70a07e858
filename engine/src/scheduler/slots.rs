//! The engine thread's side of sharing: dropping the sequences whose client left, parking and
//! unparking sequences for the fair share ([`crate::share`]), and preempting for KV blocks.

use super::{Engine, Exit, Sequence};
use crate::share::Move;

impl Engine {
    /// Remove sequences whose client has gone.
    pub(super) fn drop_closed(&mut self) {
        let mut i = 0;
        while i < self.running.len() {
            if self.running[i].events.is_closed() {
                let seq = self.running.remove(i);
                self.exit(seq, Exit::Cancelled);
            } else {
                i += 1;
            }
        }
        for parked in [false, true] {
            let mut j = 0;
            loop {
                let queue = if parked {
                    &mut self.parked
                } else {
                    &mut self.waiting
                };
                let Some(seq) = queue.get(j) else { break };
                if seq.events.is_closed() {
                    if let Some(seq) = queue.remove(j) {
                        self.exit(seq, Exit::Cancelled);
                    }
                } else {
                    j += 1;
                }
            }
        }
    }

    pub(super) fn is_idle(&self) -> bool {
        self.running.is_empty() && self.waiting.is_empty() && self.parked.is_empty()
    }

    /// Take a running sequence out of the batch, freeing its blocks; it is recomputed when it
    /// runs again.
    pub(super) fn evict(&mut self, idx: usize) -> Sequence {
        let mut seq = self.running.remove(idx);
        self.blocks.free_table(&seq.table);
        seq.table.clear();
        seq.computed = 0;
        seq.registered = 0;
        seq.weights = None;
        self.stats.preemptions += 1;
        self.metrics.preempted();
        seq
    }

    /// Move sequences between the slot holders and the parked until the split between
    /// requests is fair ([`crate::share::rebalance`]).
    pub(super) fn rebalance(&mut self) {
        loop {
            // The common step: nothing parked and the slots not over-full, so nothing to move
            // (and nothing to count).
            if self.parked.is_empty()
                && self.running.len() + self.waiting.len() <= self.cfg.max_num_seqs
            {
                return;
            }
            let holders: Vec<u64> = self
                .running
                .iter()
                .chain(self.waiting.iter())
                .map(|s| s.group)
                .collect();
            let parked: Vec<u64> = self.parked.iter().map(|s| s.group).collect();
            let Some(mv) = crate::share::rebalance(&holders, &parked, self.cfg.max_num_seqs) else {
                return;
            };
            let (give_up, take) = match mv {
                Move::Park(g) => (Some(g), None),
                Move::Unpark(i) => (None, Some(i)),
                Move::Swap(g, i) => (Some(g), Some(i)),
            };
            // Take first: parking pushes to the back of `parked`, which leaves `i` in place.
            if let Some(seq) = take.and_then(|i| self.parked.remove(i)) {
                self.waiting.push_back(seq);
            }
            if let Some(g) = give_up {
                // The youngest holder of the group: a waiting one costs nothing to park.
                let seq = if let Some(i) = self.waiting.iter().rposition(|s| s.group == g) {
                    self.waiting.remove(i)
                } else {
                    self.running
                        .iter()
                        .rposition(|s| s.group == g)
                        .map(|i| self.evict(i))
                };
                match seq {
                    Some(seq) => {
                        tracing::debug!(request_id = %seq.request_id, "sequence parked for the fair share");
                        self.parked.push_back(seq);
                    }
                    None => return,
                }
            }
        }
    }

    /// Free a running sequence's blocks and put it back at the front of the queue.
    pub(super) fn preempt(&mut self, idx: usize) {
        let seq = self.evict(idx);
        tracing::debug!(request_id = %seq.request_id, "sequence preempted for recompute");
        self.waiting.push_front(seq);
    }
}
