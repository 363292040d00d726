//! Which buffers of a known schedule stay in HBM for the whole pass, spread along it.
//!
//! With a schedule, Belady keeps resident whatever fits and streams the rest, but it does not
//! choose *where* in the pass the resident buffers lie: from a cold start it keeps the first
//! steps that filled HBM, and in a loop its victims are always the chunks just used, so the
//! resident set settles as one long stretch of the pass. While the program runs through that
//! stretch, nothing it uses is missing: the copy link can only fill the paging window ahead
//! and then idles. Measured on the H200 with a tied Llama (embedding and two layers resident,
//! 1.15 GB in one stretch), the link idled unless the window was about as long as the
//! stretch's run time — and every byte of window is a byte more streamed per pass
//! (about bytes used − HBM + window): 1.13× the optimum's traffic at a 192 MiB window
//! against 1.04× at 32 MiB, which the decode could not use because the link then idled.
//!
//! So the resident set is planned, not left to form: given the room HBM has beside the window
//! (the caller's), [`spread_resident`] keeps
//! 1. buffers used more than once a pass, cheapest per use first (a tied embedding used at the
//!    pass's first and last step, norms packed together used by every layer): streamed, each
//!    would cost a copy per use;
//! 2. buffers larger than the window, spread evenly among themselves: one of them streamed
//!    cannot be paged ahead whole, so the program waits for its copy whatever the window;
//! 3. the rest, spread evenly along the pass by error diffusion: after any prefix of the
//!    schedule, the kept bytes are within one buffer of the same fraction of the bytes walked.
//!
//! A pass then streams the same bytes as Belady's stretch (HBM holds as much), but streamed
//! and kept buffers alternate, so every step the program runs gives the link something to
//! copy, and a short window keeps it busy. Kept buffers are evicted only after every other
//! candidate (the engine sorts them last), so a budget that shrinks still finds room.

/// One buffer of a schedule, in the order of first use: its size and how many steps of a
/// pass use it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scheduled {
    /// Size in chunks (any unit, as long as `room` and `window` use it too).
    pub chunks: usize,
    /// Steps of one pass that use it.
    pub uses: usize,
}

/// Which of `buffers` (in order of first use) to keep resident for the whole pass: at most
/// `room` chunks in all, chosen as the module's doc says; `window` is the paging-ahead window
/// in chunks. Deterministic.
pub fn spread_resident(buffers: &[Scheduled], room: usize, window: usize) -> Vec<bool> {
    let mut keep = vec![false; buffers.len()];
    let mut left = room;
    let mut shared: Vec<usize> = (0..buffers.len()).filter(|&i| buffers[i].uses > 1).collect();
    // Cheapest per use first (chunks_a / uses_a < chunks_b / uses_b, without division), then
    // in schedule order.
    shared.sort_by(|&a, &b| (buffers[a].chunks * buffers[b].uses).cmp(&(buffers[b].chunks * buffers[a].uses)));
    for i in shared {
        if buffers[i].chunks <= left {
            keep[i] = true;
            left -= buffers[i].chunks;
        }
    }
    let large: Vec<usize> = (0..buffers.len()).filter(|&i| !keep[i] && buffers[i].chunks > window).collect();
    diffuse(buffers, &large, &mut keep, &mut left);
    let rest: Vec<usize> = (0..buffers.len()).filter(|&i| !keep[i] && buffers[i].chunks <= window).collect();
    diffuse(buffers, &rest, &mut keep, &mut left);
    keep
}

/// Keeps buffers of `order` (indices into `buffers`, in schedule order) so that the kept
/// chunks of every prefix stay near the fraction of `left` to the order's total: a buffer is
/// kept if keeping it brings the kept chunks no further past that fraction of the chunks
/// walked than half its size.
fn diffuse(buffers: &[Scheduled], order: &[usize], keep: &mut [bool], left: &mut usize) {
    let total: u128 = order.iter().map(|&i| buffers[i].chunks as u128).sum();
    if total == 0 {
        return;
    }
    let budget = (*left as u128).min(total);
    let (mut walked, mut kept) = (0u128, 0u128);
    for &i in order {
        let c = buffers[i].chunks;
        walked += c as u128;
        // kept + c/2 <= walked * budget / total, in integers.
        if c <= *left && (2 * kept + c as u128) * total <= 2 * walked * budget {
            keep[i] = true;
            kept += c as u128;
            *left -= c;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn once(chunks: &[usize]) -> Vec<Scheduled> {
        chunks.iter().map(|&chunks| Scheduled { chunks, uses: 1 }).collect()
    }

    #[test]
    fn half_the_room_keeps_every_other_buffer() {
        let keep = spread_resident(&once(&[4; 8]), 16, 8);
        assert_eq!(keep, [true, false, true, false, true, false, true, false]);
    }

    #[test]
    fn shared_buffers_come_first_cheapest_per_use_first() {
        let buffers = [
            Scheduled { chunks: 10, uses: 2 },
            Scheduled { chunks: 4, uses: 1 },
            Scheduled { chunks: 1, uses: 12 },
            Scheduled { chunks: 4, uses: 1 },
        ];
        // Room for the norms (1 chunk, 12 uses) and the embedding (10 chunks, 2 uses), not more.
        assert_eq!(spread_resident(&buffers, 12, 8), [true, false, true, false]);
        // Room for the norms only: the embedding does not fit, the layers share the rest.
        assert_eq!(spread_resident(&buffers, 5, 8), [false, true, true, false]);
    }

    #[test]
    fn buffers_larger_than_the_window_are_spread_among_themselves_first() {
        // Blocks of 6 chunks (window 4) alternate with attention of 2: room for two blocks.
        let keep = spread_resident(&once(&[2, 6, 2, 6, 2, 6, 2, 6]), 12, 4);
        assert_eq!(keep, [false, true, false, false, false, true, false, false]);
    }

    #[test]
    fn no_room_keeps_nothing_and_room_for_all_keeps_all() {
        let buffers = once(&[3, 1, 4, 1, 5]);
        assert!(spread_resident(&buffers, 0, 2).iter().all(|&k| !k));
        assert!(spread_resident(&buffers, 14, 2).iter().all(|&k| k));
    }
}
