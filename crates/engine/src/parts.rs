//! Buffers side by side: one reservation of device addresses cut into several buffers.
//!
//! A tensor that a program uses a slice at a time (a mixture-of-experts layer's fused expert
//! weights, `[experts, rows, cols]`, of which a decode step reads the experts its tokens chose)
//! is best moved a slice at a time: each slice its own buffer, so that the schedule can name
//! it and the engine can page it ahead on its own. But the program still indexes the whole
//! tensor, so the slices must lie at consecutive addresses. [`crate::Engine::alloc_parts`]
//! reserves one range for all the parts, each starting at a chunk boundary, and gives each
//! its own buffer: chunks, residency and schedule are per part, as for any buffer.
//!
//! A part is freed like any buffer; the range goes back to the driver with the last of them
//! (the driver frees a reservation whole), so the parts may be freed in any order.

use crate::buffer::{AllocOptions, BufferId};
use crate::engine::Inner;
use crate::error::{Context, Error, Result};
use std::collections::HashMap;
use tiermem_mechanism::DevicePtr;

/// Which buffers are parts of a shared reservation, and how many of each are still alive.
#[derive(Default)]
pub(crate) struct Parts {
    base_of: HashMap<BufferId, DevicePtr>,
    ranges: HashMap<DevicePtr, SharedRange>,
}

struct SharedRange {
    size: usize,
    live: usize,
}

impl Parts {
    fn add(&mut self, base: DevicePtr, size: usize, ids: &[BufferId]) {
        self.ranges.insert(base, SharedRange { size, live: ids.len() });
        self.base_of.extend(ids.iter().map(|&id| (id, base)));
    }

    /// The range to unreserve when buffer `id` (reserving `va`, `reserved` bytes) is freed:
    /// its own for a buffer that is no part, the whole reservation for the last part alive
    /// of one, nothing for another part.
    pub fn to_unreserve(&self, id: BufferId, va: DevicePtr, reserved: usize) -> Option<(DevicePtr, usize)> {
        let Some(&base) = self.base_of.get(&id) else { return Some((va, reserved)) };
        let range = &self.ranges[&base];
        (range.live == 1).then_some((base, range.size))
    }

    /// Buffer `id` is freed (its range, if [`Parts::to_unreserve`] named one, unreserved).
    pub fn freed(&mut self, id: BufferId) {
        let Some(base) = self.base_of.remove(&id) else { return };
        let range = self.ranges.get_mut(&base).expect("a part's range is known while a part lives");
        range.live -= 1;
        if range.live == 0 {
            self.ranges.remove(&base);
        }
    }
}

impl Inner {
    /// Buffers of `sizes` bytes at consecutive addresses, each from a chunk boundary (module
    /// docs), named `name[i]` when `options` names them. Returns `(id, address)` per part.
    pub(crate) fn alloc_parts(&mut self, sizes: &[usize], options: AllocOptions) -> Result<Vec<(BufferId, u64)>> {
        const CALL: &str = "alloc_parts";
        if sizes.is_empty() || sizes.contains(&0) {
            return Err(Error::ZeroSize { call: CALL });
        }
        let chunk = self.tiers.chunk;
        let reserved: Vec<usize> = sizes.iter().map(|s| s.next_multiple_of(chunk)).collect();
        let total = reserved.iter().sum();
        self.fits_in_all_tiers(CALL, total)?;
        let base = self.tiers.device.reserve(total).during(CALL)?;
        let mut at = base;
        let parts: Vec<(BufferId, u64)> = sizes
            .iter()
            .zip(&reserved)
            .enumerate()
            .map(|(i, (&size, &bytes))| {
                let va = at;
                at += bytes as u64;
                let name = options.name.as_ref().map(|name| format!("{name}[{i}]"));
                (self.state.add_buffer(va, size, bytes, AllocOptions { name, ..options.clone() }), va)
            })
            .collect();
        let ids: Vec<BufferId> = parts.iter().map(|&(id, _)| id).collect();
        self.parts.add(base, total, &ids);
        Ok(parts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_range_goes_back_with_the_last_part_in_any_order() {
        let mut parts = Parts::default();
        let (a, b, c) = (BufferId(1), BufferId(2), BufferId(3));
        parts.add(0x1000, 96, &[a, b, c]);
        assert_eq!(parts.to_unreserve(BufferId(9), 0x9000, 32), Some((0x9000, 32)), "no part: its own range");
        assert_eq!(parts.to_unreserve(b, 0x1020, 32), None);
        parts.freed(b);
        assert_eq!(parts.to_unreserve(c, 0x1040, 32), None);
        parts.freed(c);
        assert_eq!(parts.to_unreserve(a, 0x1000, 32), Some((0x1000, 96)));
        parts.freed(a);
        assert!(parts.ranges.is_empty() && parts.base_of.is_empty());
    }
}
