//! The process-wide engine and the allocations made through the C ABI.
//!
//! One engine per process serves every front end that speaks in device pointers: C programs
//! (`tiermem_init`), PyTorch's pluggable allocator (the Python extension installs its `Pool`'s
//! engine with [`install`]) and, later, the preload library. Each allocation is entered in an
//! [`AddressIndex`] so that a pointer anywhere inside it finds its buffer.
//!
//! Locking: one mutex guards the engine slot and the index; it is held only to read or change
//! them, never across an engine call, so a blocking acquire on one thread does not stall
//! another thread's allocation. An allocation keeps its own `Arc<Engine>`, so calls on it reach
//! the engine that made it even if the process engine has since been replaced.

use crate::index::{AddressIndex, Entry};
use crate::status::{Failure, TiermemStatus};
use std::sync::{Arc, Mutex, MutexGuard};
use tiermem::{Access, AllocOptions, BufferId, Engine, EngineConfig, Region, StreamHandle};

/// What the index keeps with an allocation.
#[derive(Clone)]
pub(crate) struct Allocation {
    pub engine: Arc<Engine>,
    pub id: BufferId,
    /// Made by `tiermem_torch_malloc` (and so freed only by `tiermem_torch_free`).
    pub torch: bool,
    /// Acquired for writing by the allocator itself (a PyTorch allocation, until it is freed).
    pub held: bool,
}

struct Process {
    engine: Option<Arc<Engine>>,
    /// The engine's lease from the node daemon, when `tiermem_init` made the engine and a
    /// daemon runs (`TIERMEM_DAEMON`); an installed engine brings its own (Python's Pool).
    daemon: Option<tiermem_tenant::DaemonLink>,
    allocations: AddressIndex<Allocation>,
}

static PROCESS: Mutex<Process> = Mutex::new(Process { engine: None, daemon: None, allocations: AddressIndex::new() });

fn process() -> MutexGuard<'static, Process> {
    // The guarded data stays consistent across a panic (every change is one map operation).
    PROCESS.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The process-wide engine, if one was created or installed.
pub fn engine() -> Option<Arc<Engine>> {
    process().engine.clone()
}

pub(crate) fn require_engine() -> Result<Arc<Engine>, Failure> {
    engine().ok_or_else(|| {
        Failure::new(
            TiermemStatus::NotInitialized,
            "no tiermem engine in this process: call tiermem_init first (from Python: tiermem.torch.allocator(pool))",
        )
    })
}

/// Makes `engine` the process-wide engine. Refused while another engine holds live
/// allocations made through the C ABI (PyTorch cannot switch allocators once it has used one).
pub fn install(engine: Arc<Engine>) -> Result<(), Failure> {
    let mut p = process();
    if let Some(current) = &p.engine {
        if !Arc::ptr_eq(current, &engine) && !p.allocations.is_empty() {
            return Err(Failure::invalid(format!(
                "another engine (Pool) is installed and holds {} live allocations; free them first",
                p.allocations.len()
            )));
        }
    }
    if !p.engine.as_ref().is_some_and(|current| Arc::ptr_eq(current, &engine)) {
        p.daemon = None; // the replaced engine's lease goes on while the engine lives, no longer
    }
    p.engine = Some(engine);
    Ok(())
}

/// Creates the process-wide engine from `config`; refused if there is one already.
pub fn init(config: EngineConfig) -> Result<Arc<Engine>, Failure> {
    let mut p = process();
    if p.engine.is_some() {
        return Err(Failure::invalid("an engine already exists in this process: call tiermem_shutdown first"));
    }
    // Held across creation so that two threads calling init at once create one engine.
    let engine = Arc::new(Engine::new(config)?);
    p.daemon = tiermem_tenant::attach_from_env(&engine);
    p.engine = Some(Arc::clone(&engine));
    Ok(engine)
}

/// Drops the process-wide engine (it is destroyed once no allocation refers to it);
/// refused while allocations made through the C ABI are live.
pub fn shutdown() -> Result<(), Failure> {
    let mut p = process();
    if !p.allocations.is_empty() {
        return Err(Failure::new(
            TiermemStatus::BufferState,
            format!("{} allocations are live: free them first", p.allocations.len()),
        ));
    }
    p.engine = None;
    p.daemon = None;
    Ok(())
}

/// Allocations made through the C ABI and not yet freed.
pub fn live_allocations() -> usize {
    process().allocations.len()
}

/// Allocates `size` bytes from the process engine and enters them in the index; with
/// `hold_on`, the allocation is acquired for writing on that stream until it is freed.
pub(crate) fn alloc(size: usize, options: AllocOptions, hold_on: Option<StreamHandle>) -> Result<u64, Failure> {
    let engine = require_engine()?;
    let (id, ptr) = engine.alloc(size, options)?;
    if let Some(stream) = hold_on {
        if let Err(e) = engine.acquire(&[Region::whole(id)], Access::ReadWrite, stream) {
            let _ = engine.free(id);
            return Err(e.into());
        }
    }
    let allocation = Allocation { engine, id, torch: hold_on.is_some(), held: hold_on.is_some() };
    if !process().allocations.insert(ptr, size, allocation.clone()) {
        // The engine handed out an address inside a live allocation: a bug, reported as one.
        let _ = allocation.engine.free(id);
        return Err(Failure::new(TiermemStatus::Internal, format!("0x{ptr:x} overlaps a live allocation")));
    }
    Ok(ptr)
}

/// The allocation containing `ptr`.
pub(crate) fn find(ptr: u64) -> Result<Entry<Allocation>, Failure> {
    process().allocations.find(ptr).cloned().ok_or_else(|| not_ours(ptr))
}

fn not_ours(ptr: u64) -> Failure {
    Failure::invalid(format!(
        "0x{ptr:x} was not allocated by tiermem (pass a pointer from tiermem_alloc, or one inside its range)"
    ))
}

/// The region `[ptr, ptr + len)`, which must lie inside one allocation.
pub(crate) fn region(ptr: u64, len: usize) -> Result<(Arc<Engine>, Region), Failure> {
    if len == 0 {
        return Err(Failure::invalid("length 0: pass the number of bytes (at least 1)"));
    }
    let entry = find(ptr)?;
    let offset = entry.offset_of(ptr);
    if len > entry.len - offset {
        return Err(Failure::invalid(format!(
            "0x{ptr:x}+{len} runs past the end of its allocation (0x{:x}, {} bytes)",
            entry.start, entry.len
        )));
    }
    Ok((entry.value.engine, Region::bytes(entry.value.id, offset, len)))
}

/// Frees the allocation starting at `ptr`: `torch` says which allocator's free this is, and
/// `stream` is where a held allocation's last use was ordered. A failed free changes nothing
/// the caller sees: the allocation stays in the index, to be freed again.
pub(crate) fn free(ptr: u64, torch: bool, stream: StreamHandle) -> Result<(), Failure> {
    let mut entry = {
        let mut p = process();
        let Some(entry) = p.allocations.get(ptr) else {
            return Err(match p.allocations.find(ptr) {
                Some(inside) => Failure::invalid(format!(
                    "0x{ptr:x} was not allocated by tiermem: it is inside the allocation at 0x{:x}, not its start (free the pointer the allocator returned)",
                    inside.start
                )),
                None => not_ours(ptr),
            });
        };
        if entry.value.torch != torch {
            let (made_by, free_with) = if entry.value.torch {
                ("tiermem_torch_malloc", "tiermem_torch_free")
            } else {
                ("tiermem_alloc", "tiermem_free")
            };
            return Err(Failure::invalid(format!("0x{ptr:x} was allocated by {made_by}: free it with {free_with}")));
        }
        p.allocations.remove(ptr).expect("just found")
    };
    let allocation = &mut entry.value;
    let outcome = (|| {
        if allocation.held {
            allocation.engine.release(&[Region::whole(allocation.id)], stream)?;
            allocation.held = false;
        }
        allocation.engine.free(allocation.id)
    })();
    outcome.map_err(|e| {
        process().allocations.insert(entry.start, entry.len, entry.value.clone());
        e.into()
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The process state is global: the tests that use it run one at a time.
    pub(crate) static SERIAL: Mutex<()> = Mutex::new(());

    fn sim() -> EngineConfig {
        EngineConfig {
            backend: "sim".parse().unwrap(),
            hbm_limit: Some(8 << 20),
            sim_hbm: 16 << 20,
            host_limit: Some(32 << 20),
            ..EngineConfig::default()
        }
    }

    #[test]
    fn allocations_are_found_by_any_pointer_inside_and_freed_by_their_start() {
        let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        init(sim()).unwrap();
        assert_eq!(init(sim()).err().map(|f| f.status), Some(TiermemStatus::InvalidArgument));
        let ptr = alloc(3 << 20, AllocOptions::default(), None).unwrap();
        let (_, inside) = region(ptr + 5, 10).unwrap();
        assert_eq!((inside.offset, inside.len), (5, Some(10)));
        assert!(region(ptr + (3 << 20) - 1, 2).err().unwrap().message.contains("runs past the end"));
        assert!(free(ptr + 1, false, StreamHandle(0)).unwrap_err().message.contains("not its start"));
        assert!(free(ptr, true, StreamHandle(0)).unwrap_err().message.contains("free it with tiermem_free"));
        assert_eq!(shutdown().unwrap_err().status, TiermemStatus::BufferState);
        free(ptr, false, StreamHandle(0)).unwrap();
        assert!(free(ptr, false, StreamHandle(0)).unwrap_err().message.contains("not allocated by tiermem"));
        shutdown().unwrap();
        assert_eq!(require_engine().err().map(|f| f.status), Some(TiermemStatus::NotInitialized));
    }

    #[test]
    fn a_free_that_fails_leaves_the_allocation_to_free_again() {
        let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        let engine = Arc::new(Engine::new(sim()).unwrap());
        install(Arc::clone(&engine)).unwrap();
        let ptr = alloc(1 << 20, AllocOptions::default(), None).unwrap();
        let (_, whole) = region(ptr, 1 << 20).unwrap();
        engine.acquire(&[whole], Access::ReadOnly, StreamHandle(0)).unwrap();
        let failure = free(ptr, false, StreamHandle(0)).unwrap_err();
        assert_eq!(failure.status, TiermemStatus::BufferState, "{failure}");
        assert_eq!(live_allocations(), 1);
        let other = Arc::new(Engine::new(sim()).unwrap());
        assert!(install(other).unwrap_err().message.contains("holds 1 live allocations"));
        engine.release(&[whole], StreamHandle(0)).unwrap();
        free(ptr, false, StreamHandle(0)).unwrap();
        assert_eq!(live_allocations(), 0);
        shutdown().unwrap();
    }
}
