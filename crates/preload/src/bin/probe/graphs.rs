//! CUDA graphs over the fake driver, which records a captured stream's launches and runs them
//! at each replay (crates/fakecuda/src/graphs.rs): under a budget of 16 MiB, A (16 MiB) fills
//! HBM and B (8 MiB) lands on the host; a graph captured on a stream of its own passes each of
//! A's chunks to one launch and B's to four, and is replayed with a synchronization after each.
//! The replays heat B through the pointers its capture passed (no launch of the program's own
//! names B): B comes up for half of A, every byte intact. Before graph replays carried hotness,
//! nothing moved (graphs.rs in the preload crate).
//!
//! `eager`: as a server's loop, a kernel of the program's own runs before each replay, on C (2
//! MiB, allocated first, in HBM; the budget 2 MiB larger). Stage 3 then follows a cycle of that
//! one launch, with nothing to move; B must still come up for the replays (migrate.rs lets
//! stage 2 place their heat, leaving C where it is), where before it stayed on the host.

use std::ffi::{c_int, c_void};

use super::migration::{free_all_under, hbm_in_use, locations, verify_and_free, Kernels, Sync, CHUNK, READS};
use super::{Alloc, Code, Cuda, MIB, PER_THREAD};

type StreamCreate = unsafe extern "C" fn(*mut *mut c_void, u32, c_int) -> Code;
type BeginCapture = unsafe extern "C" fn(*mut c_void, c_int) -> Code;
type EndCapture = unsafe extern "C" fn(*mut c_void, *mut *mut c_void) -> Code;
type Instantiate = unsafe extern "C" fn(*mut *mut c_void, *mut c_void, u64) -> Code;
type GraphLaunch = unsafe extern "C" fn(*mut c_void, *mut c_void) -> Code;
type Destroy = unsafe extern "C" fn(*mut c_void) -> Code;

pub fn graph_replays(eager: bool) {
    let cuda = Cuda::load();
    cuda.start();
    let before = cuda.census();
    let kernels = Kernels::register(&cuda);
    let alloc: Alloc = cuda.get(c"cuMemAlloc", 0);
    let (mut a, mut b, mut c) = (0u64, 0u64, 0u64);
    // SAFETY: valid out-pointers.
    unsafe {
        if eager {
            assert_eq!(alloc(&mut c, 2 * MIB), 0);
        }
        assert_eq!(alloc(&mut a, 16 * MIB), 0);
        assert_eq!(alloc(&mut b, 8 * MIB), 0);
    }
    assert_eq!((locations(&cuda, a, 16 * MIB), locations(&cuda, b, 8 * MIB)), (vec![1; 8], vec![2; 4]));
    cuda.write(a, 16 * MIB, 11);
    cuda.write(b, 8 * MIB, 22);

    let create: StreamCreate = cuda.fake(c"cuStreamCreateWithPriority");
    let (begin, end): (BeginCapture, EndCapture) =
        (cuda.get(c"cuStreamBeginCapture", 0), cuda.get(c"cuStreamEndCapture", 0));
    let instantiate: Instantiate = cuda.get(c"cuGraphInstantiateWithFlags", 0);
    let replay: GraphLaunch = cuda.get(c"cuGraphLaunch", PER_THREAD);
    let (destroy_exec, destroy_graph): (Destroy, Destroy) =
        (cuda.get(c"cuGraphExecDestroy", 0), cuda.get(c"cuGraphDestroy", 0));
    let sync: Sync = cuda.get(c"cuCtxSynchronize", 0);
    let (mut stream, mut graph, mut exec) = (std::ptr::null_mut(), std::ptr::null_mut(), std::ptr::null_mut());
    let scalar = 7usize as *mut c_void;
    // SAFETY: the driver's stream and capture calls with valid out-pointers; launches with the
    // READS kernel's three parameters.
    unsafe {
        assert_eq!(create(&mut stream, 0, 0), 0);
        assert_eq!(begin(stream, 0), 0);
        for chunk in 0..8u64 {
            let at = a + chunk * CHUNK as u64;
            assert_eq!(kernels.launch_on(READS, &mut [at as *mut c_void, (at + 8) as *mut c_void, scalar], stream), 0);
        }
        for turn in 0..16u64 {
            let at = b + (turn % 4) * CHUNK as u64;
            assert_eq!(kernels.launch_on(READS, &mut [at as *mut c_void, (at + 8) as *mut c_void, scalar], stream), 0);
        }
        assert_eq!(end(stream, &mut graph), 0);
        assert_eq!(instantiate(&mut exec, graph, 0), 0);
    }
    assert!(!graph.is_null() && !exec.is_null(), "a graph and its instance");
    assert_eq!(locations(&cuda, b, 8 * MIB), [2; 4], "captured launches do not run, and move nothing");
    let mut replays = 0;
    while locations(&cuda, b, 8 * MIB) != [1; 4] {
        assert!(replays < 20, "B never came up: graph replays carry no hotness");
        // SAFETY: an executable graph of the fake's, the stream it was captured on; the driver's
        // synchronization; the READS kernel's three parameters, on C.
        unsafe {
            if eager {
                let mut args = [c as *mut c_void, (c + 8) as *mut c_void, scalar];
                assert_eq!(kernels.launch_on(READS, &mut args, stream), 0);
            }
            assert_eq!(replay(exec, stream), 0, "a replay reaches only mapped chunks");
            assert_eq!(sync(), 0);
        }
        replays += 1;
    }
    let a_where = locations(&cuda, a, 16 * MIB);
    assert_eq!(a_where.iter().filter(|&&w| w == 2).count(), 4, "half of A went down for B: {a_where:?}");
    let budget = if eager {
        assert_eq!(locations(&cuda, c, 2 * MIB), [1], "the cycle's own chunk stays in HBM");
        18 * MIB
    } else {
        16 * MIB
    };
    assert_eq!(hbm_in_use(&cuda), budget, "the budget, exactly");
    // SAFETY: as above.
    unsafe {
        assert_eq!(replay(exec, stream), 0, "and replays after the moves reach every chunk");
        assert_eq!(destroy_exec(exec), 0);
        assert_eq!(destroy_graph(graph), 0);
    }
    if eager {
        cuda.verify(a, 16 * MIB, 11);
        cuda.verify(b, 8 * MIB, 22);
        free_all_under(&cuda, &[c, a, b], &before, budget);
    } else {
        verify_and_free(&cuda, (a, b), &before);
    }
    println!("graphs: ok after {replays} replays");
}
