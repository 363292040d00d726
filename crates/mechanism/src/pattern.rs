//! Known byte patterns: every 8-byte word is a hash of (seed, word index), so any byte out of
//! place — a chunk swapped, shifted or stale — is detected. The device's pattern kernels
//! ([`crate::Device::fill_pattern_async`], [`crate::Device::check_pattern_async`]) compute
//! the same words on the GPU.

/// Word `index` of the pattern of `seed` (SplitMix64's finaliser over seed ⊕ index·φ).
pub fn word(seed: u64, index: u64) -> u64 {
    let mut z = seed ^ index.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Fills `out` with the pattern of `seed`, as if it started at byte `offset` of the stream.
pub fn fill(seed: u64, offset: usize, out: &mut [u8]) {
    debug_assert!(offset.is_multiple_of(8) && out.len().is_multiple_of(8));
    for (i, bytes) in out.chunks_exact_mut(8).enumerate() {
        bytes.copy_from_slice(&word(seed, (offset / 8 + i) as u64).to_le_bytes());
    }
}

/// The first byte offset where `data` differs from the pattern, if any.
pub fn first_mismatch(seed: u64, offset: usize, data: &[u8]) -> Option<usize> {
    data.chunks_exact(8)
        .enumerate()
        .find(|(i, bytes)| **bytes != word(seed, (offset / 8 + i) as u64).to_le_bytes())
        .map(|(i, _)| offset + i * 8)
}

#[cfg(test)]
mod tests {
    #[test]
    fn patterns_detect_a_changed_byte() {
        let mut data = vec![0u8; 4096];
        super::fill(7, 8192, &mut data);
        assert_eq!(super::first_mismatch(7, 8192, &data), None);
        assert_eq!(super::first_mismatch(8, 8192, &data), Some(8192));
        data[1001] ^= 1;
        assert_eq!(super::first_mismatch(7, 8192, &data), Some(8192 + 1000));
    }
}
