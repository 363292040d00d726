//! Memory areas (GAME's memory-area descriptors): the device cut into areas, each backed by
//! one engine buffer once written, and a present bit per 4 KiB page.
//!
//! # Why areas and present bits
//!
//! Swap writes pages where it likes and discards them when the process that owned them frees
//! them or exits. If the device were one engine buffer, every byte ever written would hold
//! memory until `swapoff`: the engine has no way to drop one chunk's copies. So each area
//! (2 MiB by default: one engine chunk) is its own buffer, allocated on the first write to the
//! area and freed when every page of it has been discarded — the engine gives its HBM, host
//! slot or file slot back. A page whose bit is clear was never written or was discarded since:
//! it reads as zeros without the engine being asked, whatever the buffer still holds there.
//!
//! # Partial pages
//!
//! Bits are per page; requests are in bytes (the kernel sends whole 512-byte sectors, and for
//! swap whole pages). A write that covers part of a page whose bit is clear first writes
//! zeros over the rest of that page (the buffer may hold a discarded page's old bytes there),
//! then sets the bit. A discard clears the bits of the pages it covers whole; a page it covers
//! only in part stays present, and the discarded bytes of it are overwritten with zeros (an
//! engine write), so that, as [`crate::Blocks::discard`] promises, they read as zeros.
//!
//! # Concurrency
//!
//! Bits are atomics in one flat array (64 pages a word); an area's buffer sits behind its own
//! `RwLock`, so requests to different areas never meet. Under the shared lock: reads, and
//! writes to an area that has a buffer and need no zero fill; they set bits (never clear
//! them). Under the exclusive lock: the first write (which allocates the buffer), writes that
//! zero-fill part of a page, and discards (which clear bits and may free the buffer). The
//! invariant that follows: **a bit is set only while its area has a buffer**, and a buffer is
//! freed only while the exclusive lock shows every bit of its area clear.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::RwLock;
use tiermem::BufferId;

/// The unit of the present bits, and of swap.
pub const PAGE: u64 = 4096;

/// One area's descriptor: the engine buffer behind it, once written.
#[derive(Default)]
pub(crate) struct Area {
    pub buffer: RwLock<Option<Backing>>,
}

/// An area's engine buffer and its device address (stable for the buffer's life), kept so
/// that a copy need not ask the engine for it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Backing {
    pub id: BufferId,
    pub va: u64,
}

/// A present bit for every page of the device.
pub(crate) struct PresentBits {
    words: Box<[AtomicU64]>,
}

fn word_and_mask(page: u64) -> (usize, u64) {
    ((page / 64) as usize, 1u64 << (page % 64))
}

/// The mask of pages `first..end` within word `word`, and the word's page range.
fn word_mask(word: u64, first: u64, end: u64) -> u64 {
    let (lo, hi) = (word * 64, word * 64 + 64);
    let (from, to) = (first.max(lo) - lo, end.min(hi) - lo);
    if to - from == 64 {
        u64::MAX
    } else {
        ((1u64 << (to - from)) - 1) << from
    }
}

impl PresentBits {
    pub fn new(pages: u64) -> Self {
        Self { words: (0..pages.div_ceil(64)).map(|_| AtomicU64::new(0)).collect() }
    }

    pub fn is_set(&self, page: u64) -> bool {
        let (word, mask) = word_and_mask(page);
        self.words[word].load(Ordering::Acquire) & mask != 0
    }

    /// Sets the bits of pages `first..end`; returns how many were clear before.
    pub fn set(&self, first: u64, end: u64) -> u64 {
        self.update(first, end, |word, mask| {
            let before = word.fetch_or(mask, Ordering::AcqRel);
            u64::from((mask & !before).count_ones())
        })
    }

    /// Clears the bits of pages `first..end`; returns how many were set before.
    pub fn clear(&self, first: u64, end: u64) -> u64 {
        self.update(first, end, |word, mask| {
            let before = word.fetch_and(!mask, Ordering::AcqRel);
            u64::from((mask & before).count_ones())
        })
    }

    /// Whether any page of `first..end` is present.
    pub fn any(&self, first: u64, end: u64) -> bool {
        self.update(first, end, |word, mask| u64::from(word.load(Ordering::Acquire) & mask != 0)) > 0
    }

    fn update(&self, first: u64, end: u64, mut op: impl FnMut(&AtomicU64, u64) -> u64) -> u64 {
        if first >= end {
            return 0;
        }
        (first / 64..end.div_ceil(64)).map(|w| op(&self.words[w as usize], word_mask(w, first, end))).sum()
    }

    /// The runs of pages `first..end` with the same bit, in order: `(start, end, present)`.
    /// Allocates nothing.
    pub fn runs(&self, first: u64, end: u64) -> impl Iterator<Item = (u64, u64, bool)> + '_ {
        let mut at = first;
        std::iter::from_fn(move || {
            if at >= end {
                return None;
            }
            let start = at;
            let present = self.is_set(start);
            while at < end && self.is_set(at) == present {
                at += 1;
            }
            Some((start, at, present))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bits_set_and_clear_across_words_and_count_what_changed() {
        let bits = PresentBits::new(300);
        assert_eq!(bits.set(60, 130), 70);
        assert_eq!(bits.set(64, 70), 0, "already set");
        assert!(bits.is_set(60) && bits.is_set(129) && !bits.is_set(59) && !bits.is_set(130));
        assert_eq!(bits.clear(0, 64), 4);
        assert!(bits.any(64, 300) && !bits.any(0, 64) && !bits.any(130, 300));
        assert_eq!(bits.set(0, 300), 300 - 66);
        assert_eq!(bits.clear(0, 300), 300);
        assert!(!bits.any(0, 300));
        assert_eq!(bits.set(5, 5), 0, "an empty range changes nothing");
    }

    #[test]
    fn runs_split_where_the_bit_changes() {
        let bits = PresentBits::new(128);
        bits.set(3, 5);
        bits.set(64, 66);
        let runs: Vec<_> = bits.runs(0, 70).collect();
        assert_eq!(runs, [(0, 3, false), (3, 5, true), (5, 64, false), (64, 66, true), (66, 70, false)]);
        assert_eq!(bits.runs(3, 4).collect::<Vec<_>>(), [(3, 4, true)]);
        assert_eq!(bits.runs(4, 4).count(), 0);
    }
}
