//! The probe as a tenant of the node daemon (tests/daemon_lease.rs drives it over stdin): three
//! allocations of 16 MiB with patterns, then one command per line, one answer per line:
//! `where` → `hbm N host M` (chunks of 2 MiB by tier, from the fake driver; `where-all` →
//! `hbm N neighbour K host M`, K on GPU 1), `budget` → the
//! total `cuMemGetInfo_v2` reports, `touch` → kernels read every chunk and the context is
//! synchronized (a quiesce point; `touch-only I,J`: the chunks of those buffers only),
//! `where-each` → `hbm A B C` (chunks in HBM per buffer), `by-address` → the buffers' indices
//! by address, `sync` → `synced` (a synchronization alone), `capture` and
//! `end-capture` → `capturing` and `captured` (a stream capture on the legacy stream begun and
//! ended), `verify` → `verified` once every byte reads back as written, `exit`.

use std::ffi::{c_int, c_void};
use std::io::{BufRead, Write};

use super::migration::{locations, Kernels, Sync, CHUNK, READS};
use super::{Alloc, Code, Cuda, MIB};

const BUFFERS: usize = 3;
const LEN: usize = 16 * MIB;

pub fn lease() {
    let cuda = Cuda::load();
    cuda.start();
    let kernels = Kernels::register(&cuda);
    let alloc: Alloc = cuda.get(c"cuMemAlloc", 0);
    let sync: Sync = cuda.get(c"cuCtxSynchronize", 0);
    type Begin = unsafe extern "C" fn(*mut c_void, c_int) -> Code;
    type End = unsafe extern "C" fn(*mut c_void, *mut *mut c_void) -> Code;
    let (begin, end): (Begin, End) = (cuda.get(c"cuStreamBeginCapture", 0), cuda.get(c"cuStreamEndCapture", 0));
    let buffers: Vec<u64> = (0..BUFFERS)
        .map(|i| {
            let mut ptr = 0;
            // SAFETY: a valid out-pointer.
            assert_eq!(unsafe { alloc(&mut ptr, LEN) }, 0, "cuMemAlloc of 16 MiB");
            cuda.write(ptr, LEN, i as u8 + 1);
            ptr
        })
        .collect();
    let mut out = std::io::stdout().lock();
    writeln!(out, "ready").unwrap();
    out.flush().unwrap();
    for line in std::io::stdin().lock().lines() {
        let answer = match line.expect("a command on stdin").trim() {
            "where" => {
                let all: Vec<i32> = buffers.iter().flat_map(|&b| locations(&cuda, b, LEN)).collect();
                let hbm = all.iter().filter(|&&l| l == 1).count();
                format!("hbm {hbm} host {}", all.len() - hbm)
            }
            "where-all" => {
                let all: Vec<i32> = buffers.iter().flat_map(|&b| locations(&cuda, b, LEN)).collect();
                let count = |code: i32| all.iter().filter(|&&l| l == code).count();
                format!("hbm {} neighbour {} host {}", count(1), count(3), count(2))
            }
            "budget" => format!("{}", cuda.mem_info().1),
            "host-chunks" => cuda.census().host_chunks.to_string(),
            "where-each" => {
                let hbm = |&b: &u64| locations(&cuda, b, LEN).iter().filter(|&&l| l == 1).count().to_string();
                format!("hbm {}", buffers.iter().map(hbm).collect::<Vec<_>>().join(" "))
            }
            "by-address" => {
                let mut order: Vec<usize> = (0..BUFFERS).collect();
                order.sort_by_key(|&i| buffers[i]);
                order.iter().map(usize::to_string).collect::<Vec<_>>().join(" ")
            }
            touch if touch.starts_with("touch") => {
                let only: Vec<usize> = match touch.strip_prefix("touch-only ") {
                    Some(list) => list.split(',').map(|n| n.parse().expect("touch-only I,J")).collect(),
                    None => (0..BUFFERS).collect(),
                };
                for &b in only.iter().map(|&i| &buffers[i]) {
                    for chunk in 0..LEN / CHUNK {
                        let at = (b + (chunk * CHUNK) as u64) as *mut c_void;
                        assert_eq!(kernels.launch(READS, &mut [at, at, 4usize as *mut c_void]), 0, "a launch");
                    }
                }
                // SAFETY: the driver's cuCtxSynchronize on the current context.
                assert_eq!(unsafe { sync() }, 0, "cuCtxSynchronize");
                "touched".to_string()
            }
            "sync" => {
                // SAFETY: the driver's cuCtxSynchronize on the current context.
                assert_eq!(unsafe { sync() }, 0, "cuCtxSynchronize");
                "synced".to_string()
            }
            "capture" => {
                // SAFETY: the driver's capture call on the legacy stream.
                assert_eq!(unsafe { begin(std::ptr::null_mut(), 0) }, 0, "cuStreamBeginCapture");
                "capturing".to_string()
            }
            "end-capture" => {
                let mut graph = std::ptr::null_mut();
                // SAFETY: as above, with a valid out-pointer.
                assert_eq!(unsafe { end(std::ptr::null_mut(), &mut graph) }, 0, "cuStreamEndCapture");
                "captured".to_string()
            }
            "verify" => {
                for (i, &b) in buffers.iter().enumerate() {
                    cuda.verify(b, LEN, i as u8 + 1);
                }
                "verified".to_string()
            }
            "exit" => break,
            other => panic!("unknown command {other:?}"),
        };
        writeln!(out, "{answer}").unwrap();
        out.flush().unwrap();
    }
}
