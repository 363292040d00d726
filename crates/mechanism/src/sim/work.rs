//! Queued memory work, performed when the simulated device runs it: copies, memsets and the
//! pattern kernels, each checking its memory as the hardware would at that moment — mapped,
//! with access from the GPU that runs it, or pinned — and otherwise leaving a sticky fault.

use super::queues::Work;
use super::{SimDevice, SimState};

/// Memory work on a stream.
pub(super) enum Op {
    ToDevice {
        dst: u64,
        src: usize,
        len: usize,
    },
    ToHost {
        dst: usize,
        src: u64,
        len: usize,
    },
    /// Device memory to device memory (`Device::copy_between_devices_async`).
    Between {
        dst: u64,
        src: u64,
        len: usize,
    },
    Memset {
        dst: u64,
        value: u8,
        len: usize,
    },
    /// The pattern kernels (`Device::fill_pattern_async`, `Device::check_pattern_async`).
    Fill {
        dst: u64,
        words: usize,
        seed: u64,
        first: u64,
    },
    Check {
        src: u64,
        words: usize,
        seed: u64,
        first: u64,
        counter: u64,
    },
}

/// Performs memory work now, checking its memory as the hardware would at this moment.
pub(super) fn perform(s: &mut SimState, work: Work) {
    let Work::Memory { gpu, op } = work else { return };
    let device = |ptr: u64, len: usize| SimDevice::device_range_ok(s, gpu, ptr, len);
    let pinned = |ptr: usize, len: usize| SimDevice::pinned_range_ok(s, ptr, len);
    let fault = match op {
        Op::ToDevice { dst, src, len } if device(dst, len) && pinned(src, len) => {
            // SAFETY: both ranges were just checked (mapped with access, pinned) and are the
            // engine's, which keeps them for the copy until its fence completes.
            unsafe { copy(src, dst as usize, len) }
        }
        Op::ToDevice { dst, src, len } => Some(format!("asynchronous copy to device 0x{dst:x}+{len} from 0x{src:x}")),
        Op::ToHost { dst, src, len } if device(src, len) && pinned(dst, len) => {
            // SAFETY: as above.
            unsafe { copy(src as usize, dst, len) }
        }
        Op::ToHost { dst, src, len } => Some(format!("asynchronous copy to host 0x{dst:x}+{len} from 0x{src:x}")),
        Op::Between { dst, src, len } if device(dst, len) && device(src, len) => {
            // SAFETY: as above; the call refused overlapping ranges.
            unsafe { copy(src as usize, dst as usize, len) }
        }
        Op::Between { dst, src, len } => {
            Some(format!("asynchronous copy between devices to 0x{dst:x}+{len} from 0x{src:x}"))
        }
        Op::Memset { dst, value, len } if device(dst, len) => {
            // SAFETY: the range was just checked to be mapped with access.
            unsafe { std::ptr::write_bytes(dst as *mut u8, value, len) };
            None
        }
        Op::Memset { dst, len, .. } => Some(format!("asynchronous memset of 0x{dst:x}+{len}")),
        Op::Fill { dst, words, seed, first } if device(dst, words * 8) => {
            for i in 0..words {
                let word = crate::pattern::word(seed, first + i as u64);
                // SAFETY: the range was just checked to be mapped with access; 8-byte
                // writes need no alignment with write_unaligned.
                unsafe { std::ptr::write_unaligned((dst as *mut u64).add(i), word) };
            }
            None
        }
        Op::Fill { dst, words, .. } => Some(format!("pattern fill kernel over 0x{dst:x}+{}", words * 8)),
        Op::Check { src, words, seed, first, counter } if device(src, words * 8) && device(counter, 4) => {
            // SAFETY: both ranges were just checked to be device memory with access.
            let differing = (0..words)
                    .filter(|&i| unsafe { std::ptr::read_unaligned((src as *const u64).add(i)) } != crate::pattern::word(seed, first + i as u64))
                    .count() as u32;
            // SAFETY: as above.
            unsafe {
                let c = counter as *mut u32;
                std::ptr::write_unaligned(c, std::ptr::read_unaligned(c).wrapping_add(differing));
            }
            None
        }
        Op::Check { src, words, .. } => Some(format!("pattern check kernel over 0x{src:x}+{}", words * 8)),
    };
    if let Some(what) = fault {
        record_fault(s, gpu, what);
    }
}

/// Records the first fault of asynchronous work: it is sticky, as a CUDA context error.
fn record_fault(s: &mut SimState, gpu: usize, what: String) {
    s.fault.get_or_insert(format!(
        "{what} on GPU {gpu}: memory not mapped with access from GPU {gpu}, or not pinned, when it ran"
    ));
}

/// Copies `len` bytes from `src` to `dst` and reports no fault.
///
/// # Safety
/// Both ranges must be valid for `len` bytes and not overlap.
unsafe fn copy(src: usize, dst: usize, len: usize) -> Option<String> {
    // SAFETY: guaranteed by the caller.
    unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, len) };
    None
}
