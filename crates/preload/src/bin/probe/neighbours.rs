//! The probe's checks of neighbours' HBM beyond the budget (spill.rs), over the fake driver
//! with two GPUs (`TIERMEM_FAKE_GPUS=2`), GPU 1 lending 10 MiB (`TIERMEM_PEERS=1`,
//! `TIERMEM_PEER_LIMIT=10MiB`, no reserve) and a budget of 16 MiB on GPU 0: what does not fit
//! goes to GPU 1 while it has room, then to the host; moves take GPU 1's chunks before the
//! host's; every byte intact; everything given back, to both GPUs, at the last free.

use std::ffi::c_void;

use super::migration::{begin, free_all, hbm_in_use, locations, verify_and_free, READS};
use super::MIB;

/// Where the fake says a chunk lies (`tiermem_fake_location`).
const HBM: i32 = 1;
const HOST: i32 = 2;
const NEIGHBOUR: i32 = 3;

pub fn neighbours() {
    let (cuda, before, kernels, sync, alloc) = begin();
    let (mut a, mut b, mut c) = (0u64, 0u64, 0u64);
    // SAFETY: valid out-pointers.
    unsafe {
        assert_eq!(alloc(&mut a, 16 * MIB), 0);
        assert_eq!(alloc(&mut b, 8 * MIB), 0);
        assert_eq!(alloc(&mut c, 4 * MIB), 0);
    }
    assert_eq!(locations(&cuda, a, 16 * MIB), [HBM; 8], "A fills the budget");
    assert_eq!(locations(&cuda, b, 8 * MIB), [NEIGHBOUR; 4], "B goes to GPU 1, which lends");
    assert_eq!(locations(&cuda, c, 4 * MIB), [NEIGHBOUR, HOST], "C: GPU 1's last 2 MiB, then the host");
    let census = cuda.census();
    assert_eq!((census.neighbour_chunks, census.neighbour_used_bytes), (5, 10 * MIB), "GPU 1 holds what it lent");
    assert_eq!(census.gpu_chunks * 2 * MIB, 16 * MIB, "GPU 0 holds the budget");
    for (ptr, len, seed) in [(a, 16 * MIB, 11), (b, 8 * MIB, 22), (c, 4 * MIB, 33)] {
        cuda.write(ptr, len, seed);
    }
    let launch_on = |ptr: u64| {
        for _ in 0..10 {
            let mut args = [ptr as *mut c_void, (ptr + 4 * MIB as u64 + 8) as *mut c_void, 7usize as *mut c_void];
            assert_eq!(kernels.launch(READS, &mut args), 0, "a launch on 0x{ptr:x}");
        }
    };
    // B is hot: it comes up; A's cold half goes down, to the host (GPU 1 lent all it may).
    launch_on(b);
    // SAFETY: the driver's synchronization.
    assert_eq!(unsafe { sync() }, 0);
    assert_eq!(locations(&cuda, b, 8 * MIB), [HBM; 4], "B, hot, came up from GPU 1");
    assert_eq!(locations(&cuda, a, 16 * MIB), [HOST, HOST, HOST, HOST, HBM, HBM, HBM, HBM], "A's cold half");
    assert_eq!(hbm_in_use(&cuda), 16 * MIB, "the budget, exactly");
    // A's first half is hot now: it comes up, and what leaves HBM goes to GPU 1 first (the
    // chunks B left there), before the host.
    launch_on(a);
    // SAFETY: as above.
    assert_eq!(unsafe { sync() }, 0);
    assert_eq!(locations(&cuda, a, 8 * MIB), [HBM; 4], "A's first half came up");
    let all: Vec<i32> =
        [(a, 16 * MIB), (b, 8 * MIB), (c, 4 * MIB)].iter().flat_map(|&(ptr, len)| locations(&cuda, ptr, len)).collect();
    let expected = [[HBM; 8].as_slice(), &[NEIGHBOUR; 4], &[NEIGHBOUR, HOST]].concat();
    assert_eq!(all, expected, "A up; B, cold, down to GPU 1 (the chunks it left there), C as it was");
    assert_eq!(cuda.census().neighbour_used_bytes, 10 * MIB, "GPU 1 lends no more than its limit");
    for (ptr, len, seed) in [(a, 16 * MIB, 11), (b, 8 * MIB, 22), (c, 4 * MIB, 33)] {
        cuda.verify(ptr, len, seed);
    }
    // C freed gives GPU 1 room for one chunk again. B is hot: it comes up, and of A's four
    // chunks going down the first takes that room, before the host chunks A left as spares.
    let free: super::Free = cuda.get(c"cuMemFree", 0);
    // SAFETY: a pointer the allocation gave.
    assert_eq!(unsafe { free(c) }, 0);
    launch_on(b);
    // SAFETY: as above.
    assert_eq!(unsafe { sync() }, 0);
    assert_eq!(locations(&cuda, b, 8 * MIB), [HBM; 4], "B came up again");
    let a_where = locations(&cuda, a, 16 * MIB);
    let count = |place| a_where.iter().filter(|&&l| l == place).count();
    assert_eq!((count(HBM), count(NEIGHBOUR), count(HOST)), (4, 1, 3), "GPU 1's room first: {a_where:?}");
    verify_and_free(&cuda, (a, b), &before);
    let census = cuda.census();
    assert_eq!((census.neighbour_chunks, census.neighbour_used_bytes), (0, 0), "GPU 1 got everything back");
    println!("neighbours: ok");
}

type Hold = extern "C" fn(i32, isize) -> super::Code;

/// A lender that runs short gets its memory back (spill.rs, rounds.rs): GPU 1 (256 MiB) keeps
/// 200 MiB free (`TIERMEM_PEER_RESERVE=200MiB`, so it lends 56 MiB); B (8 MiB) and C (4 MiB)
/// land there. Another program then takes 40 MiB of GPU 1 (still 204 MiB free: nothing moves),
/// then 10 MiB more (194 MiB free, 6 MiB short): at the next synchronization 6 MiB of what it
/// lent move to the host, every byte intact, and it lends no more; once the other program
/// leaves, it lends again.
pub fn neighbours_reclaim() {
    let (cuda, before, _kernels, sync, alloc) = begin();
    let hold: Hold = cuda.fake(c"tiermem_fake_hold");
    let alloc_at = |len: usize| {
        let mut ptr = 0u64;
        // SAFETY: a valid out-pointer.
        assert_eq!(unsafe { alloc(&mut ptr, len) }, 0);
        ptr
    };
    let (a, b, c) = (alloc_at(16 * MIB), alloc_at(8 * MIB), alloc_at(4 * MIB));
    assert_eq!(locations(&cuda, b, 8 * MIB), [NEIGHBOUR; 4]);
    assert_eq!(locations(&cuda, c, 4 * MIB), [NEIGHBOUR; 2]);
    for (ptr, len, seed) in [(a, 16 * MIB, 11), (b, 8 * MIB, 22), (c, 4 * MIB, 33)] {
        cuda.write(ptr, len, seed);
    }
    let synchronize = || {
        // SAFETY: the driver's synchronization.
        assert_eq!(unsafe { sync() }, 0);
    };
    assert_eq!(hold(1, 40 * MIB as isize), 0);
    synchronize();
    assert_eq!(locations(&cuda, b, 8 * MIB), [NEIGHBOUR; 4], "204 MiB free, above the reserve: nothing moves");
    assert_eq!(hold(1, 10 * MIB as isize), 0);
    synchronize();
    let lent_where = [locations(&cuda, b, 8 * MIB), locations(&cuda, c, 4 * MIB)].concat();
    let count = |place| lent_where.iter().filter(|&&l| l == place).count();
    assert_eq!((count(HOST), count(NEIGHBOUR)), (3, 3), "6 MiB back to GPU 1: {lent_where:?}");
    assert_eq!(cuda.census().neighbour_used_bytes, 50 * MIB + 6 * MIB, "the other program's and what is still lent");
    for (ptr, len, seed) in [(a, 16 * MIB, 11), (b, 8 * MIB, 22), (c, 4 * MIB, 33)] {
        cuda.verify(ptr, len, seed);
    }
    let d = alloc_at(2 * MIB);
    assert_eq!(locations(&cuda, d, 2 * MIB), [HOST], "GPU 1 is at its reserve: it lends no more");
    assert_eq!(hold(1, -50 * MIB as isize), 0);
    synchronize();
    let e = alloc_at(4 * MIB);
    assert_eq!(locations(&cuda, e, 4 * MIB), [NEIGHBOUR; 2], "the other program left: GPU 1 lends again");
    free_all(&cuda, &[a, b, c, d, e], &before);
    assert_eq!(cuda.census().neighbour_used_bytes, 0, "GPU 1 got everything back");
    println!("neighbours-reclaim: ok");
}
