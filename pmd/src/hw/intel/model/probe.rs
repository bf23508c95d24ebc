//! [`FenceRecorder`]: checks, for a modelled write-combined aperture, that
//! every publication (release store of a tag, credit or FreeQ entry) comes
//! after a store fence with no data store in between, and that no word is
//! written both as data and as a publication (a flag copied out with the
//! data would be unordered under write-combining).

use std::collections::HashMap;
use std::sync::Mutex;
use std::thread::ThreadId;

use crate::hw::StoreProbe;

/// What a [`FenceRecorder`] saw.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FenceReport {
    /// Data stores.
    pub data: u64,
    /// Store fences.
    pub fences: u64,
    /// Publications.
    pub publishes: u64,
    /// Publications with a data store since the last fence (must be 0).
    pub unfenced: u64,
    /// Words written both as data and as a publication (must be 0).
    pub mixed_words: u64,
}

#[derive(Debug, Default)]
struct Inner {
    report: FenceReport,
    /// Per thread: a data store since the last fence.
    dirty: HashMap<ThreadId, bool>,
    /// One bit per 8-byte word: written as data / published.
    data_words: Vec<u64>,
    published_words: Vec<u64>,
    first_unfenced: Option<usize>,
}

/// Records the stores of one write-combined window (see the module doc).
#[derive(Debug)]
pub struct FenceRecorder {
    inner: Mutex<Inner>,
}

fn mark(bits: &mut Vec<u64>, word: usize) {
    if bits.len() <= word / 64 {
        bits.resize(word / 64 + 1, 0);
    }
    bits[word / 64] |= 1 << (word % 64);
}

fn marked(bits: &[u64], word: usize) -> bool {
    bits.get(word / 64)
        .is_some_and(|b| b & (1 << (word % 64)) != 0)
}

impl FenceRecorder {
    /// A recorder that has seen nothing.
    pub fn new() -> FenceRecorder {
        FenceRecorder {
            inner: Mutex::new(Inner::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What was seen so far.
    pub fn report(&self) -> FenceReport {
        self.lock().report
    }

    /// The offset of the first publication that was not fenced, if any.
    pub fn first_unfenced(&self) -> Option<usize> {
        self.lock().first_unfenced
    }
}

impl Default for FenceRecorder {
    fn default() -> Self {
        FenceRecorder::new()
    }
}

impl StoreProbe for FenceRecorder {
    fn data(&self, offset: usize, len: usize) {
        let mut g = self.lock();
        g.report.data += 1;
        g.dirty.insert(std::thread::current().id(), true);
        if len == 0 {
            return;
        }
        for w in offset / 8..=(offset + len - 1) / 8 {
            if marked(&g.published_words, w) && !marked(&g.data_words, w) {
                g.report.mixed_words += 1;
            }
            mark(&mut g.data_words, w);
        }
    }

    fn fence(&self) {
        let mut g = self.lock();
        g.report.fences += 1;
        g.dirty.insert(std::thread::current().id(), false);
    }

    fn publish(&self, offset: usize, _size: usize) {
        let mut g = self.lock();
        g.report.publishes += 1;
        if g.dirty
            .get(&std::thread::current().id())
            .copied()
            .unwrap_or(false)
        {
            g.report.unfenced += 1;
            g.first_unfenced.get_or_insert(offset);
        }
        let w = offset / 8;
        if marked(&g.data_words, w) && !marked(&g.published_words, w) {
            g.report.mixed_words += 1;
        }
        mark(&mut g.published_words, w);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unfenced_and_mixed_stores_are_caught() {
        let r = FenceRecorder::new();
        r.data(0, 56);
        r.fence();
        r.publish(56, 8);
        assert_eq!(r.report().unfenced, 0);
        r.data(64, 56);
        r.publish(120, 8);
        assert_eq!(r.report().unfenced, 1);
        assert_eq!(r.first_unfenced(), Some(120));
        assert_eq!(r.report().mixed_words, 0);
        r.data(56, 8); // a tag word written as data
        assert_eq!(r.report().mixed_words, 1);
    }
}
