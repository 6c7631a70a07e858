//! How a decoder's `max_num_seqs` sequence slots are shared between requests.
//!
//! Every choice of every prompt is one sequence, and a request's sequences form one group.
//! Two halves keep one request from locking everyone else out:
//! - [`SlotBook`] admits sequences on the async side. A sequence is admitted while the engine
//!   holds fewer than `max_num_seqs`; past that, only when its group holds less than its fair
//!   share (`max_num_seqs` divided by the groups present, at least 1) and another group holds
//!   more. Otherwise it is refused (503): every request present already has its share.
//! - [`rebalance`] decides on the engine thread which admitted sequences hold a slot (are
//!   scheduled) and which are parked: at most `max_num_seqs` hold one, the free ones go to the
//!   groups holding the fewest, and a group holding two or more above a parked group's count
//!   gives one up (a running one is preempted and later recomputed, as when KV blocks run out).
//!
//! So a lone request with `n = max_num_seqs` runs every choice at once, and a request arriving
//! while it runs gets slots within a step, taken from it, instead of a 503 for its whole run.

use std::collections::HashMap;
use std::sync::Mutex;

/// The fair share of `cap` slots between `groups` requests.
pub fn fair_share(cap: usize, groups: usize) -> usize {
    (cap / groups.max(1)).max(1)
}

#[derive(Debug, Default)]
struct Book {
    per_group: HashMap<u64, usize>,
    total: usize,
}

/// Sequences admitted to the engine and not yet ended, per request (the `max_num_seqs`
/// admission bound).
#[derive(Debug, Default)]
pub struct SlotBook {
    book: Mutex<Book>,
}

impl SlotBook {
    fn lock(&self) -> std::sync::MutexGuard<'_, Book> {
        match self.book.lock() {
            Ok(b) => b,
            Err(p) => p.into_inner(),
        }
    }

    /// Admit `k` sequences of `group`, all or none: `false` when some would exceed what the
    /// rules above allow.
    pub fn take(&self, group: u64, k: usize, cap: usize) -> bool {
        let mut b = self.lock();
        let mine = b.per_group.get(&group).copied().unwrap_or(0);
        let groups = b.per_group.len() + usize::from(mine == 0);
        let share = fair_share(cap, groups);
        let others_above = b.per_group.iter().any(|(g, &c)| *g != group && c > share);
        // Each of the `k` is admitted below the cap, or within the group's share while
        // another group holds more than its own.
        let admit = (0..k).all(|i| b.total + i < cap || (mine + i < share && others_above));
        if admit && k > 0 {
            *b.per_group.entry(group).or_insert(0) += k;
            b.total += k;
        }
        admit
    }

    /// `k` sequences of `group` have left the engine (or were never started).
    pub fn release(&self, group: u64, k: usize) {
        let mut b = self.lock();
        if let Some(c) = b.per_group.get_mut(&group) {
            let k = k.min(*c);
            *c -= k;
            if *c == 0 {
                b.per_group.remove(&group);
            }
            b.total -= k;
        }
    }

    /// Sequences admitted and not yet ended.
    pub fn total(&self) -> usize {
        self.lock().total
    }
}

/// One move that brings the slot holders closer to a fair split.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Move {
    /// Park a slot holder of this group (the engine holds more than the cap).
    Park(u64),
    /// Give a free slot to the parked sequence at this index.
    Unpark(usize),
    /// Park a slot holder of the first group and give its slot to the parked sequence at the
    /// index.
    Swap(u64, usize),
}

/// The next move, given the groups of the slot holders and of the parked sequences (in
/// queue order), or `None` when the split is as fair as it gets.
pub fn rebalance(holders: &[u64], parked: &[u64], cap: usize) -> Option<Move> {
    if holders.len() <= cap && parked.is_empty() {
        return None;
    }
    let mut count: HashMap<u64, usize> = HashMap::new();
    for g in holders {
        *count.entry(*g).or_insert(0) += 1;
    }
    // Ties go to the earliest: the oldest parked sequence, the first group to hold a slot.
    let biggest = || {
        holders
            .iter()
            .copied()
            .fold(None::<(u64, usize)>, |best, g| {
                let c = count[&g];
                match best {
                    Some((_, bc)) if bc >= c => best,
                    _ => Some((g, c)),
                }
            })
    };
    if holders.len() > cap {
        return biggest().map(|(g, _)| Move::Park(g));
    }
    let (idx, fewest) = parked
        .iter()
        .enumerate()
        .map(|(i, g)| (i, count.get(g).copied().unwrap_or(0)))
        .fold(None::<(usize, usize)>, |best, (i, c)| match best {
            Some((_, bc)) if bc <= c => best,
            _ => Some((i, c)),
        })?;
    if holders.len() < cap {
        return Some(Move::Unpark(idx));
    }
    match biggest() {
        Some((g, c)) if c >= fewest + 2 => Some(Move::Swap(g, idx)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lone_request_takes_every_slot_and_a_newcomer_its_share() {
        let book = SlotBook::default();
        assert!(book.take(1, 4, 4));
        // Group 1 holds 4 > the share of 2: the newcomer gets up to 2, all or none.
        assert!(!book.take(2, 3, 4), "three would exceed group 2's share");
        assert_eq!(book.total(), 4, "a refusal takes nothing");
        assert!(book.take(2, 1, 4));
        assert!(book.take(2, 1, 4));
        assert!(!book.take(2, 1, 4));
        // A third group: share 4 / 3 = 1, group 1 still holds more.
        assert!(book.take(3, 1, 4));
        assert!(!book.take(3, 1, 4));
        assert_eq!(book.total(), 7);
        book.release(1, 4);
        assert_eq!(book.total(), 3);
        assert!(book.take(4, 1, 4), "below the cap anyone is admitted");
        // Below the cap, a request takes what is free.
        book.release(4, 1);
        book.release(3, 1);
        assert!(book.take(1, 2, 4));
        assert_eq!(book.total(), 4);
    }

    #[test]
    fn requests_at_their_share_refuse_a_newcomer() {
        let book = SlotBook::default();
        assert!(book.take(1, 1, 2));
        assert!(book.take(2, 1, 2));
        assert!(!book.take(3, 1, 2));
        book.release(2, 1);
        assert!(book.take(3, 1, 2));
        // Releasing an unknown group, or more than it holds, takes nothing from the others.
        book.release(99, 1);
        book.release(3, 5);
        assert_eq!(book.total(), 1);
    }

    /// Applies moves until none is left and returns the holders' groups, sorted.
    fn settle(mut holders: Vec<u64>, mut parked: Vec<u64>, cap: usize) -> (Vec<u64>, Vec<u64>) {
        for _ in 0..100 {
            match rebalance(&holders, &parked, cap) {
                None => {
                    holders.sort_unstable();
                    return (holders, parked);
                }
                Some(Move::Park(g)) => {
                    let i = holders.iter().rposition(|&h| h == g).unwrap();
                    parked.push(holders.remove(i));
                }
                Some(Move::Unpark(i)) => holders.push(parked.remove(i)),
                Some(Move::Swap(g, i)) => {
                    let h = holders.iter().rposition(|&h| h == g).unwrap();
                    holders.remove(h);
                    holders.push(parked.remove(i));
                    parked.push(g);
                }
            }
        }
        panic!("rebalance did not settle");
    }

    #[test]
    fn rebalancing_splits_the_slots_fairly() {
        // A newcomer takes slots from the request holding them all.
        let (h, p) = settle(vec![1; 4], vec![2, 2], 4);
        assert_eq!(h, vec![1, 1, 2, 2]);
        assert_eq!(p, vec![1, 1]);
        // Three groups over four slots: 2, 1, 1.
        let (h, _) = settle(vec![1; 4], vec![2, 3], 4);
        assert_eq!(h, vec![1, 1, 2, 3]);
        // Over the cap: the biggest group parks first.
        let (h, p) = settle(vec![1, 1, 1, 2], vec![], 2);
        assert_eq!(h, vec![1, 2]);
        assert_eq!(p, vec![1, 1]);
        // Free slots go to parked sequences, fewest-holding group first.
        assert_eq!(rebalance(&[1], &[1, 2], 4), Some(Move::Unpark(1)));
        // Fair already: nothing moves.
        assert_eq!(rebalance(&[1, 2], &[1, 2], 2), None);
        assert_eq!(rebalance(&[1, 1], &[], 2), None);
    }
}
