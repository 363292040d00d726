//! The probe's stage 3 checks: a loop over six buffers of 4 MiB (12 chunks) under a budget of
//! 16 MiB (8 chunks), one synchronization per cycle, as a training step does. Each cycle
//! launches, per buffer, a kernel that reads it and one that increments a word in its second
//! chunk. From the third cycle on (the first is recorded, the second follows its plan), every
//! kernel must find its buffer in HBM once its launch returns (the fake runs kernels at once);
//! cycles that diverge from the recording (another kernel at an index, more launches) run
//! correctly without that; every byte is checked at the end. `segments-alternate`: a step of
//! two different cycles (the loop, then the buffers in reverse order read by another kernel),
//! each ended by a synchronization.

use std::ffi::c_void;

use super::migration::{free_all, hbm_in_use, locations, Kernels, Sync, CHUNK, LIBRARY, READS, WRITES};
use super::{Alloc, Census, Cuda, MIB};

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
    let cuda = Cuda::load();
    cuda.start();
    let before = cuda.census();
    let kernels = Kernels::register(&cuda);
    let sync: Sync = cuda.get(c"cuCtxSynchronize", 0);
    let alloc: Alloc = cuda.get(c"cuMemAlloc", 0);
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

/// Checks every byte of the buffers, then frees them (and checks nothing is left).
fn check_and_free(cuda: &Cuda, buffers: &[u64], writes: &[u64], before: &Census) {
    for (i, &b) in buffers.iter().enumerate() {
        assert!(cuda.read(b, SIZE) == expected(i as u8, writes[i]), "buffer {i}'s bytes");
    }
    free_all(cuda, buffers, before);
}
