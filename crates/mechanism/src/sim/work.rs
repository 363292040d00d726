//! Queued work performed when the simulated device runs it: copies, memsets and the pattern
//! kernels, each checking its memory as the hardware would at that moment.

use super::queues::Work;
use super::{SimDevice, SimState};

impl SimDevice {
    /// Performs memory work now, checking its memory as the hardware would at this moment.
    pub(super) fn perform(s: &mut SimState, work: Work) {
        let (dst, src, len, fault) = match work {
            Work::ToDevice { dst, src, len } => {
                let ok = Self::device_range_ok(s, dst, len) && Self::pinned_range_ok(s, src, len);
                (dst as usize, Some(src), len, (!ok).then(|| format!("asynchronous copy to device 0x{dst:x}+{len} from 0x{src:x}: memory not mapped or not pinned when the copy ran")))
            }
            Work::ToHost { dst, src, len } => {
                let ok = Self::device_range_ok(s, src, len) && Self::pinned_range_ok(s, dst, len);
                (dst, Some(src as usize), len, (!ok).then(|| format!("asynchronous copy to host 0x{dst:x}+{len} from 0x{src:x}: memory not mapped or not pinned when the copy ran")))
            }
            Work::Memset { dst, value, len } => {
                let ok = Self::device_range_ok(s, dst, len);
                if ok {
                    // SAFETY: the range was just checked to be mapped with access.
                    unsafe { std::ptr::write_bytes(dst as *mut u8, value, len) };
                }
                (
                    0,
                    None,
                    0,
                    (!ok).then(|| format!("asynchronous memset of 0x{dst:x}+{len}: memory not mapped when it ran")),
                )
            }
            Work::Fill { dst, words, seed, first } => {
                let ok = Self::device_range_ok(s, dst, words * 8);
                if ok {
                    for i in 0..words {
                        let word = crate::pattern::word(seed, first + i as u64);
                        // SAFETY: the range was just checked to be mapped with access; 8-byte
                        // writes need no alignment with write_unaligned.
                        unsafe { std::ptr::write_unaligned((dst as *mut u64).add(i), word) };
                    }
                }
                (
                    0,
                    None,
                    0,
                    (!ok).then(|| {
                        format!("pattern fill kernel over 0x{dst:x}+{}: memory not mapped when it ran", words * 8)
                    }),
                )
            }
            Work::Check { src, words, seed, first, counter } => {
                let ok = Self::device_range_ok(s, src, words * 8) && Self::device_range_ok(s, counter, 4);
                if ok {
                    // SAFETY: both ranges were just checked to be device memory with access.
                    let differing = (0..words)
                        .filter(|&i| unsafe { std::ptr::read_unaligned((src as *const u64).add(i)) } != crate::pattern::word(seed, first + i as u64))
                        .count() as u32;
                    // SAFETY: as above.
                    unsafe {
                        let c = counter as *mut u32;
                        std::ptr::write_unaligned(c, std::ptr::read_unaligned(c).wrapping_add(differing));
                    }
                }
                (
                    0,
                    None,
                    0,
                    (!ok).then(|| {
                        format!("pattern check kernel over 0x{src:x}+{}: memory not mapped when it ran", words * 8)
                    }),
                )
            }
            Work::Record { .. } | Work::Wait { .. } => return,
        };
        match (fault, src) {
            (Some(f), _) => {
                s.fault.get_or_insert(f);
            }
            // SAFETY: both ranges were just checked: mapped with access or pinned, and owned by
            // the engine, which keeps them for the copy until its fence completes.
            (None, Some(src)) => unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, len) },
            (None, None) => {}
        }
    }
}
