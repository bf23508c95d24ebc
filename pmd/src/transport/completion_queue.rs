//! The completion queue `poll_completions` hands out from: completions in
//! the order they happened, appended by the post and receive paths, taken
//! oldest first.
//!
//! A vector and a read index, not a `VecDeque`: the waiting completions are
//! always one contiguous run, so taking `n` of them is one loop over a
//! slice and an index bump (no two halves, no drain guard), and a caller
//! that takes everything (the usual case: post, then poll) empties it back
//! to the start. A caller that always leaves some behind has the run moved
//! down once the taken part is at least half the vector, so memory stays
//! bounded by what waits and each completion is moved at most once more.

use super::types::Completion;

/// Taken completions at the front before the run is moved down.
const COMPACT_AT: usize = 64;

/// Completions waiting to be polled, oldest first.
#[derive(Debug, Default)]
pub(crate) struct CompletionQueue {
    items: Vec<Completion>,
    /// `items[..head]` were taken; `items[head..]` wait.
    head: usize,
}

impl CompletionQueue {
    /// Appends one completion.
    #[inline]
    pub fn push_back(&mut self, c: Completion) {
        self.items.push(c);
    }

    /// Whether none waits.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.head == self.items.len()
    }

    /// How many wait.
    #[inline]
    pub fn len(&self) -> usize {
        self.items.len() - self.head
    }

    /// Moves the oldest waiting completions into `out`, as many as fit;
    /// returns how many.
    #[inline]
    pub fn take_into(&mut self, out: &mut [Completion]) -> usize {
        let waiting = &self.items[self.head..];
        let n = out.len().min(waiting.len());
        for (slot, c) in out[..n].iter_mut().zip(waiting) {
            slot.copy_fields(c);
        }
        self.head += n;
        if self.head == self.items.len() {
            self.items.clear();
            self.head = 0;
        } else if self.head >= COMPACT_AT && self.head * 2 >= self.items.len() {
            self.compact();
        }
        n
    }

    /// Moves the waiting run to the front (out of line: the rare case).
    #[cold]
    #[inline(never)]
    fn compact(&mut self) {
        self.items.drain(..self.head);
        self.head = 0;
    }
}

impl Extend<Completion> for CompletionQueue {
    fn extend<I: IntoIterator<Item = Completion>>(&mut self, iter: I) {
        self.items.extend(iter);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn completion(cookie: u64) -> Completion {
        Completion {
            cookie,
            ..Completion::default()
        }
    }

    /// Pushes and takes in uneven steps against a model (`VecDeque`): the
    /// same completions come out in the same order, and the vector never
    /// holds much more than what waits.
    #[test]
    fn takes_in_order_whatever_the_steps_and_stays_bounded() {
        let mut q = CompletionQueue::default();
        let mut model = std::collections::VecDeque::new();
        let mut next = 0u64;
        let mut out = vec![Completion::default(); 40];
        for round in 0..5000u64 {
            let pushes = (round * 7 + 3) % 23;
            for _ in 0..pushes {
                q.push_back(completion(next));
                model.push_back(next);
                next += 1;
            }
            let want = ((round * 13 + 5) % 41) as usize;
            let n = q.take_into(&mut out[..want.min(40)]);
            assert_eq!(n, want.min(40).min(model.len()));
            for c in &out[..n] {
                assert_eq!(Some(c.cookie), model.pop_front());
            }
            assert_eq!(q.len(), model.len());
            assert_eq!(q.is_empty(), model.is_empty());
            assert!(q.items.len() <= 2 * (model.len() + COMPACT_AT) + 40);
        }
        q.extend((0..3).map(|i| completion(next + i)));
        assert_eq!(q.len(), model.len() + 3);
    }

    #[test]
    fn taking_everything_empties_it_to_the_start() {
        let mut q = CompletionQueue::default();
        q.extend((0..5).map(completion));
        let mut out = vec![Completion::default(); 8];
        assert_eq!(q.take_into(&mut out), 5);
        assert_eq!((q.items.len(), q.head), (0, 0));
        assert_eq!(q.take_into(&mut out), 0);
        assert!(q.is_empty());
    }
}
