//! The probe's stage 3 checks: a loop over six buffers of 4 MiB (12 chunks) under a budget of
//! 16 MiB (8 chunks), one synchronization per cycle, as a training step does. Each cycle
//! launches, per buffer, a kernel that reads it and one that increments a word in its second
//! chunk. From the third cycle on (the first is recorded, the second follows its plan), every
//! kernel must find its buffer in HBM once its launch returns (the fake runs kernels at once);
//! cycles that diverge from the recording (another kernel at an index, more launches) run
//! correctly without that; every byte is checked at the end. `segments-alternate`: a step of
//! two different cycles (the loop, then the buffers in reverse order read by another kernel),
//! each ended by a synchronization. `segments-async`: a step whose tensors are made and freed
//! within it through the GPU's default pool (`cuMemAllocAsync`, `cuMemFreeAsync`, its release
//! threshold at the maximum, as PyTorch's `cudaMallocAsync` backend runs): each tensor comes
//! back at its address every step, and the plan brings it up before the launches that use it.

use std::ffi::{c_int, c_void};

use super::migration::{begin, free_all, hbm_in_use, locations, Kernels, Sync, CHUNK, LIBRARY, READS, WRITES};
use super::{AllocAsync, Census, Code, Cuda, FreeAsync, MIB};

const BUFFERS: usize = 6;
const SIZE: usize = 4 * MIB;
/// The word each cycle increments, in each buffer's second chunk.
const WORD: usize = CHUNK + 64;

/// How a cycle differs from the loop's.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Shape {
    Loop,
    /// A library kernel in place of the second buffer's read.
    OtherKernel,
    /// Three more launches at the end.
    Longer,
    /// The buffers in reverse order, each read by the library kernel: another cycle.
    Reversed,
}

/// One cycle over the buffers; checks each launch found its buffer in HBM if `resident`.
fn cycle(cuda: &Cuda, kernels: &Kernels, sync: Sync, buffers: &[u64], shape: Shape, resident: bool) {
    let order: Vec<(usize, u64)> = if shape == Shape::Reversed {
        buffers.iter().copied().enumerate().rev().collect()
    } else {
        buffers.iter().copied().enumerate().collect()
    };
    for (i, b) in order {
        let code = if shape == Shape::Reversed || (shape == Shape::OtherKernel && i == 1) {
            kernels.launch(LIBRARY, &mut [4usize as *mut c_void, b as *mut c_void])
        } else {
            kernels.launch(READS, &mut [b as *mut c_void, b as *mut c_void, 7usize as *mut c_void])
        };
        assert_eq!(code, 0, "a read of buffer {i}");
        if resident {
            assert_eq!(locations(cuda, b, SIZE), [1, 1], "buffer {i} is in HBM when its kernel runs");
        }
        let code = kernels.launch(WRITES, &mut [(b + WORD as u64) as *mut c_void]);
        assert_eq!(code, 0, "a write to buffer {i}");
    }
    if shape == Shape::Longer {
        for &b in &buffers[..3] {
            assert_eq!(kernels.launch(WRITES, &mut [(b + WORD as u64) as *mut c_void]), 0);
        }
    }
    // SAFETY: the driver's synchronization.
    assert_eq!(unsafe { sync() }, 0);
    assert!(hbm_in_use(cuda) <= 16 * MIB, "the budget holds");
}

/// The bytes buffer `seed` should hold after `writes` increments of its word.
fn expected(seed: u8, writes: u64) -> Vec<u8> {
    let mut bytes = Cuda::pattern(SIZE, seed);
    let word = u64::from_le_bytes(bytes[WORD..WORD + 8].try_into().expect("8 bytes")).wrapping_add(writes);
    bytes[WORD..WORD + 8].copy_from_slice(&word.to_le_bytes());
    bytes
}

/// `segments`, or `segments-alternate`: two different cycles a step (each ended by a
/// synchronization), told apart once each has followed the other twice.
pub fn segments(alternate: bool) {
    let (cuda, before, kernels, sync, alloc) = begin();
    let mut buffers = [0u64; BUFFERS];
    for (i, b) in buffers.iter_mut().enumerate() {
        // SAFETY: a valid out-pointer.
        assert_eq!(unsafe { alloc(b, SIZE) }, 0);
        cuda.write(*b, SIZE, i as u8);
    }
    let on = std::env::var("TIERMEM_SEGMENTS").map_or(true, |v| v != "off"); // on by default
    let mut writes = [0u64; BUFFERS];
    let mut run = |shape: Shape, resident: bool| {
        cycle(&cuda, &kernels, sync, &buffers, shape, resident && on);
        for (i, w) in writes.iter_mut().enumerate() {
            *w += 1 + u64::from(shape == Shape::Longer && i < 3);
        }
    };
    if alternate {
        for step in 0..8 {
            run(Shape::Loop, step >= 3);
            run(Shape::Reversed, step >= 2);
        }
        check_and_free(&cuda, &buffers, &writes, &before);
        println!("segments-alternate: ok");
        return;
    }
    for n in 0..8 {
        run(Shape::Loop, n >= 1);
    }
    // Diverging cycles, each followed by one planned from it (which diverges in turn), then
    // the loop again, followed once more.
    for shape in [Shape::OtherKernel, Shape::Longer] {
        run(shape, false);
        run(Shape::Loop, false);
        run(Shape::Loop, true);
        run(Shape::Loop, true);
    }
    check_and_free(&cuda, &buffers, &writes, &before);
    println!("segments: ok");
}

/// `segments-trial`: the loop of `segments` with each buffer read three times a cycle (24
/// launches, enough to be a sample of stage 3's trial, cycle.rs), 40 cycles: whatever the trial
/// chooses, and as it changes modes, every byte stays.
pub fn segments_trial() {
    let (cuda, before, kernels, sync, alloc) = begin();
    let mut buffers = [0u64; BUFFERS];
    for (i, b) in buffers.iter_mut().enumerate() {
        // SAFETY: a valid out-pointer.
        assert_eq!(unsafe { alloc(b, SIZE) }, 0);
        cuda.write(*b, SIZE, i as u8);
    }
    for _ in 0..40 {
        for &b in &buffers {
            for times in 1..=3usize {
                let args = &mut [b as *mut c_void, b as *mut c_void, times as *mut c_void];
                assert_eq!(kernels.launch(READS, args), 0);
            }
            assert_eq!(kernels.launch(WRITES, &mut [(b + WORD as u64) as *mut c_void]), 0);
        }
        // SAFETY: the driver's synchronization.
        assert_eq!(unsafe { sync() }, 0);
        assert!(hbm_in_use(&cuda) <= 16 * MIB, "the budget holds");
    }
    check_and_free(&cuda, &buffers, &[40; BUFFERS], &before);
    println!("segments-trial: ok");
}

/// Checks every byte of the buffers, then frees them (and checks nothing is left).
fn check_and_free(cuda: &Cuda, buffers: &[u64], writes: &[u64], before: &Census) {
    for (i, &b) in buffers.iter().enumerate() {
        assert!(cuda.read(b, SIZE) == expected(i as u8, writes[i]), "buffer {i}'s bytes");
    }
    free_all(cuda, buffers, before);
}

/// `segments-async`: two weights of 4 MiB made once, then steps that make three tensors of 4
/// MiB, write each and read it with a weight (forward), read them again in reverse order and
/// free each after its last read (backward), and synchronize: 10 chunks a step under a budget
/// of 8; then a short cycle that makes a tensor of that size too, writes it, frees it and
/// synchronizes (a loss read back). The two cycles are told apart from the fifth step on
/// (cycle.rs); from the sixth, each tensor comes back at its address and every launch finds
/// its chunks in HBM if the plan places kept frees (`TIERMEM_PLAN_KEPT`, on by default); the
/// weights' bytes are checked at the end.
pub fn segments_async() {
    type GetPool = unsafe extern "C" fn(*mut *mut c_void, c_int) -> Code;
    type SetAttribute = unsafe extern "C" fn(*mut c_void, c_int, *mut c_void) -> Code;
    const RELEASE_THRESHOLD: c_int = 4;
    let (cuda, before, kernels, sync, alloc) = begin();
    let alloc_async: AllocAsync = cuda.get(c"cuMemAllocAsync", 0);
    let free_async: FreeAsync = cuda.get(c"cuMemFreeAsync", 0);
    let default_pool: GetPool = cuda.get(c"cuDeviceGetDefaultMemPool", 0);
    let set_attribute: SetAttribute = cuda.get(c"cuMemPoolSetAttribute", 0);
    let (mut pool, mut threshold) = (std::ptr::null_mut(), u64::MAX);
    let mut weights = [0u64; 2];
    // SAFETY: valid out-pointers and the driver's own pool.
    unsafe {
        assert_eq!(default_pool(&mut pool, 0), 0);
        assert_eq!(set_attribute(pool, RELEASE_THRESHOLD, (&raw mut threshold).cast()), 0);
        for (i, w) in weights.iter_mut().enumerate() {
            assert_eq!(alloc(w, SIZE), 0);
            cuda.write(*w, SIZE, 40 + i as u8);
        }
    }
    let planned = std::env::var("TIERMEM_PLAN_KEPT").map_or(true, |v| v != "off");
    let stream = std::ptr::null_mut();
    let mut first: Option<[u64; 3]> = None;
    const SETTLED: usize = 5;
    for step in 0..10 {
        let resident = planned && step >= SETTLED;
        let found = |ptr: u64, what: &str| {
            if resident {
                assert_eq!(locations(&cuda, ptr, SIZE), [1, 1], "step {step}: {what} is in HBM when its kernel runs");
            }
        };
        let mut tensors = [0u64; 3];
        for (i, t) in tensors.iter_mut().enumerate() {
            // SAFETY: a valid out-pointer.
            assert_eq!(unsafe { alloc_async(t, SIZE, stream) }, 0, "step {step}: tensor {i}");
            assert_eq!(kernels.launch(WRITES, &mut [(*t + WORD as u64) as *mut c_void]), 0);
            found(*t, "a tensor written");
            let w = weights[i % 2];
            assert_eq!(kernels.launch(READS, &mut [w as *mut c_void, *t as *mut c_void, 3usize as *mut c_void]), 0);
            found(*t, "a tensor read");
            found(w, "a weight");
        }
        for (i, &t) in tensors.iter().enumerate().rev() {
            let w = weights[i % 2];
            assert_eq!(kernels.launch(READS, &mut [t as *mut c_void, w as *mut c_void, 2usize as *mut c_void]), 0);
            found(t, "a tensor read backward");
            found(w, "a weight backward");
            // SAFETY: a pointer the allocation gave, freed once.
            assert_eq!(unsafe { free_async(t, stream) }, 0);
        }
        // Once the cycles are told apart, each tensor comes back where it was the step before.
        match first {
            None if step == SETTLED - 1 => first = Some(tensors),
            None => {}
            Some(first) => assert_eq!(tensors, first, "step {step}: each tensor comes back at its address"),
        }
        // SAFETY: the driver's synchronization.
        assert_eq!(unsafe { sync() }, 0);
        assert!(hbm_in_use(&cuda) <= 16 * MIB, "the budget holds");
        let mut loss = 0u64;
        // SAFETY: a valid out-pointer; the pointer it gave, freed once; the synchronization.
        unsafe {
            assert_eq!(alloc_async(&mut loss, SIZE, stream), 0, "step {step}: the loss");
            assert_eq!(kernels.launch(WRITES, &mut [(loss + WORD as u64) as *mut c_void]), 0);
            assert_eq!(free_async(loss, stream), 0);
            assert_eq!(sync(), 0);
        }
    }
    for (i, &w) in weights.iter().enumerate() {
        cuda.verify(w, SIZE, 40 + i as u8);
    }
    // The kept frees go back with the pool's threshold at 0 at the next synchronization.
    threshold = 0;
    // SAFETY: as above.
    unsafe {
        assert_eq!(set_attribute(pool, RELEASE_THRESHOLD, (&raw mut threshold).cast()), 0);
        assert_eq!(sync(), 0);
    }
    free_all(&cuda, &weights, &before);
    println!("segments-async: ok");
}
