//! The file store with the memory the engine will hand it: slots inside pinned host memory
//! from `cuMemHostAlloc` (direct I/O must be able to pin those pages for the disk's DMA).
//! Skipped, with the reason printed, where there is no CUDA driver or GPU. Prints throughput
//! for both I/O paths; `TIERMEM_FS_BENCH_MIB` sets the amount (default 512 MiB).

mod file_store_common;

use std::time::Instant;

use file_store_common::{config, fill_random, open, PATHS};
use tiermem_mechanism::cuda::CudaDevice;
use tiermem_mechanism::Device;

const SLOT: usize = 2 << 20;

#[test]
fn pinned_host_slots_round_trip() {
    let dev = match CudaDevice::open(0) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("SKIPPED (no GPU): {e}");
            return;
        }
    };
    let mib: usize = std::env::var("TIERMEM_FS_BENCH_MIB").ok().and_then(|s| s.parse().ok()).unwrap_or(512);
    let n = (mib << 20) / SLOT;
    let bytes = n * SLOT;
    let src = dev.alloc_pinned(bytes).unwrap();
    let dst = dev.alloc_pinned(bytes).unwrap();
    // SAFETY: `src` is `bytes` of host-accessible pinned memory that only this test uses.
    let src_s = unsafe { std::slice::from_raw_parts_mut(src as *mut u8, bytes) };
    fill_random(src_s, 5);
    let reps: usize = std::env::var("TIERMEM_FS_BENCH_REPS").ok().and_then(|s| s.parse().ok()).unwrap_or(1);
    let mut results: Vec<(String, Vec<f64>, Vec<f64>)> = Vec::new();
    for _ in 0..reps {
        for (k, (io, depth)) in PATHS.iter().flat_map(|&io| [8u32, 32, 64].map(|d| (io, d))).enumerate() {
            let mut cfg = config("pinned", n, SLOT, io);
            cfg.queue_depth = depth;
            let Some(store) = open(cfg) else { continue };
            let slots = store.alloc(n).unwrap();
            let w: Vec<_> = (0..n).map(|i| (slots[i], (src + i * SLOT) as *const u8)).collect();
            let t = Instant::now();
            // SAFETY: SLOT-sized, page-aligned pieces of pinned memory alive through the call.
            unsafe { store.write(&w) }.unwrap();
            let tw = t.elapsed().as_secs_f64();
            // SAFETY: `dst` is ours alone; poison it so stale bytes cannot pass.
            unsafe { std::ptr::write_bytes(dst as *mut u8, 0xDB, bytes) };
            let r: Vec<_> = (0..n).map(|i| (slots[i], (dst + i * SLOT) as *mut u8)).collect();
            let t = Instant::now();
            // SAFETY: as above, distinct and writable.
            unsafe { store.read(&r) }.unwrap();
            let tr = t.elapsed().as_secs_f64();
            // SAFETY: the read has completed; nothing else writes `dst`.
            let dst_s = unsafe { std::slice::from_raw_parts(dst as *const u8, bytes) };
            assert!(dst_s == &src_s[..], "data differs after the round trip");
            let gb = bytes as f64 / 1e9;
            if results.len() <= k {
                results.push((format!("{} qd {depth}", store.io_path()), vec![], vec![]));
            }
            results[k].1.push(gb / tw);
            results[k].2.push(gb / tr);
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    for (name, mut w, mut r) in results {
        eprintln!(
            "{name}: {mib} MiB in 2 MiB slots, median of {reps}: write {:.2} GB/s, \
             read {:.2} GB/s (crc32c included)",
            median(&mut w),
            median(&mut r)
        );
    }
    dev.free_pinned(src, bytes).unwrap();
    dev.free_pinned(dst, bytes).unwrap();
}
