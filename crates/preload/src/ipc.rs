//! Legacy CUDA IPC on tiermem's memory: `cuIpcGetMemHandle`, `cuIpcOpenMemHandle(_v2)` and
//! `cuIpcCloseMemHandle`, which `torch.multiprocessing` uses to hand a CUDA tensor to another
//! process, and which the driver refuses for memory of the VMM API (`CUDA_ERROR_INVALID_VALUE`)
//! — all of tiermem's memory is VMM memory, so without this a program that shares CUDA tensors
//! works alone and breaks under `tiermem run`.
//!
//! # How
//!
//! Every chunk tiermem creates is made shareable as a POSIX file descriptor where the driver
//! allows ([`create_chunk`]; on the H200 it costs nothing more to create). A handle asked for an
//! allocation of tiermem's exports its chunks' descriptors, keeps them, and answers 64 bytes
//! that name the allocation (ipc_wire.rs); the handle travels as the program sends it. The
//! process that opens it — under `tiermem run` too, as children are — asks the exporter's
//! socket for the descriptors, imports each chunk and maps them in order into VA of its own,
//! as the allocation is laid out; the pointer it answers is that VA's start, as the driver's
//! would be the allocation's start. Closing unmaps and releases them once every open is
//! closed; the memory itself lives until both sides have let go, as the driver keeps it.
//!
//! # What it costs the exporter
//!
//! Another process maps the chunks themselves, so a shared allocation never moves again (the
//! planners skip it: migrate.rs, cycle.rs): what was in HBM counts against the budget until it is
//! freed, what was on the host stays there and is read over PCIe. A handle of the driver's own
//! (a small allocation the driver serves, placement.rs) passes through untouched, as do handles
//! tiermem did not make. Freeing the allocation forgets its export: a process opening the handle
//! after that gets `CUDA_ERROR_INVALID_VALUE`, as after a free without tiermem.
//! An imported allocation is not counted against the importer's budget: it is the exporter's.

use std::collections::BTreeMap;
use std::ffi::c_uint;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard};

use tiermem_mechanism::{ChunkLocation, Device, DeviceError, PhysHandle};

use crate::boundary::{
    guard, inside, log, to_driver, CuResult, CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_NOT_INITIALIZED, CUDA_SUCCESS,
};
use crate::driver::{driver, IpcOpenMemHandleFn};
use crate::ipc_wire::{self, IpcMemHandle, Layout, Name};
use crate::process;

/// An allocation of this process's that a handle names: its chunks' descriptors, kept to
/// hand out (the allocation's start is the key).
struct Export {
    serial: u64,
    layout: Layout,
    fds: Vec<OwnedFd>,
}

/// Another process's allocation mapped here (its start in this process is the key).
struct Import {
    name: Name,
    ordinal: usize,
    layout: Layout,
    handles: Vec<PhysHandle>,
    /// Opens not yet closed.
    opened: usize,
}

static EXPORTS: Mutex<BTreeMap<u64, Export>> = Mutex::new(BTreeMap::new());
static IMPORTS: Mutex<BTreeMap<u64, Import>> = Mutex::new(BTreeMap::new());
static SERIAL: AtomicU64 = AtomicU64::new(0);
/// Opens of other processes' handles that mapped their memory here.
static OPENED: AtomicU64 = AtomicU64::new(0);

/// The `--stats` line, if any handle was made or opened.
pub fn report() -> Option<String> {
    let (exported, opened) = (SERIAL.load(Relaxed), OPENED.load(Relaxed));
    (exported + opened > 0).then(|| {
        format!(
            "tiermem: stats: IPC handles: {exported} allocation(s) shared with other processes (never moved since), \
             {opened} opened from other processes"
        )
    })
}

fn lock<T>(mutex: &'static Mutex<T>) -> MutexGuard<'static, T> {
    // Each change under these locks is one map update: consistent after a panic.
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Per kind of location (HBM, host): whether the driver refused shareable chunks there.
static PLAIN_ONLY: [AtomicBool; 2] = [AtomicBool::new(false), AtomicBool::new(false)];

/// Whether tiermem's allocations can be shared by legacy IPC handles: chunks have been made
/// shareable in HBM and on the host alike (what `CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE`
/// reports, pointers.rs).
pub fn shareable() -> bool {
    PLAIN_ONLY.iter().all(|plain| !plain.load(Relaxed))
}

/// Creates a chunk as the allocations and moves need one: shareable as a POSIX file descriptor
/// where the driver allows it (so that a handle can be made for it later), else plain, from
/// then on for that kind of location. Running out of memory is an answer, not a reason to
/// fall back.
pub fn create_chunk(device: &dyn Device, location: ChunkLocation, granules: usize) -> Result<PhysHandle, DeviceError> {
    let plain_only = &PLAIN_ONLY[usize::from(location == ChunkLocation::Host)];
    if !plain_only.load(Relaxed) {
        match device.create_shareable_chunks_at(location, granules) {
            Ok(handle) => return Ok(handle),
            Err(why) if out_of_memory(&why) => return Err(why),
            Err(_) => plain_only.store(true, Relaxed),
        }
    }
    device.create_chunks_at(location, granules)
}

/// Whether the driver's answer `why` means memory ran out.
pub fn out_of_memory(why: &DeviceError) -> bool {
    match why {
        DeviceError::OutOfMemory { .. } => true,
        DeviceError::Driver { code, .. } => code.contains("OUT_OF_MEMORY"),
        _ => false,
    }
}

/// The export of `va` with `serial`, as the socket hands it out: its layout and its
/// descriptors, duplicated.
fn lookup(va: u64, serial: u64) -> Option<(Layout, Vec<OwnedFd>)> {
    let exports = lock(&EXPORTS);
    let export = exports.get(&va).filter(|e| e.serial == serial)?;
    let fds = export.fds.iter().map(|fd| fd.try_clone()).collect::<Result<Vec<_>, _>>().ok()?;
    Some((export.layout, fds))
}

/// Forgets the export of the allocation at `va`, being freed.
pub fn forget(va: u64) {
    lock(&EXPORTS).remove(&va);
}

fn name(va: u64, serial: u64) -> Name {
    Name { pid: std::process::id(), nonce: ipc_wire::nonce(), va, serial }
}

/// The handle of the tiermem allocation holding `dptr`; `None`: not tiermem's.
fn export(dptr: u64) -> Option<Result<Name, String>> {
    let mut p = process::lock();
    let (va, ordinal) = p.books.containing_mut(dptr).map(|a| (a.va, a.ordinal))?;
    let mut exports = lock(&EXPORTS);
    if let Some(export) = exports.get(&va) {
        return Some(Ok(name(va, export.serial)));
    }
    let device = p.gpus.get(&ordinal).and_then(|gpu| gpu.device.clone())?;
    let allocation = p.books.get_mut(va)?;
    let fds = allocation.chunks.iter().map(|&(handle, _)| device.export_chunk(handle)).collect::<Result<Vec<_>, _>>();
    let fds = match fds {
        Ok(fds) => fds,
        Err(why) => return Some(Err(format!("its chunks cannot be shared ({why})"))),
    };
    if let Err(why) = ipc_wire::serve(lookup) {
        return Some(Err(why));
    }
    allocation.shared = true;
    let layout =
        Layout { reserved: allocation.reserved as u64, chunk: allocation.chunk as u64, count: fds.len() as u32 };
    let serial = SERIAL.fetch_add(1, Relaxed) + 1;
    exports.insert(va, Export { serial, layout, fds });
    Some(Ok(name(va, serial)))
}

/// `cuIpcGetMemHandle`: for tiermem's memory, a handle of tiermem's (module documentation);
/// for anything else, the driver's answer.
///
/// # Safety
/// As the driver's: `handle` null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuIpcGetMemHandle(handle: *mut IpcMemHandle, dptr: u64) -> CuResult {
    let Some(real) = driver().and_then(|d| d.ipc_get_mem_handle) else { return CUDA_ERROR_NOT_INITIALIZED };
    // SAFETY: the caller's arguments, as the driver takes them.
    let to_real = || to_driver(|| unsafe { real(handle, dptr) });
    if inside() || handle.is_null() {
        return to_real();
    }
    guard("cuIpcGetMemHandle", || match export(dptr) {
        None => to_real(),
        Some(Ok(name)) => {
            // SAFETY: checked non-null; the caller's out-pointer.
            unsafe { handle.write(name.encode()) };
            CUDA_SUCCESS
        }
        Some(Err(why)) => {
            log("cuIpcGetMemHandle", &format!("0x{dptr:x}: {why}"), "answering CUDA_ERROR_INVALID_VALUE");
            CUDA_ERROR_INVALID_VALUE
        }
    })
}

/// Maps the allocation `name` names into VA of this process's, on the current GPU; its start.
fn import(call: &str, name: Name) -> Result<u64, String> {
    let mut imports = lock(&IMPORTS);
    if let Some((&base, import)) = imports.iter_mut().find(|(_, import)| import.name == name) {
        import.opened += 1;
        return Ok(base);
    }
    let ordinal = match process::current_gpu() {
        Some(Ok(ordinal)) => ordinal,
        Some(Err(code)) => return Err(format!("no current context (CUDA error {code})")),
        None => return Err("the driver cannot say the current GPU".into()),
    };
    let device = process::lock().gpu(call, ordinal).device.clone();
    let device = device.ok_or_else(|| format!("GPU {ordinal} could not be opened by tiermem"))?;
    let (layout, fds) = ipc_wire::fetch(&name)?;
    let (reserved, chunk) = (layout.reserved as usize, layout.chunk as usize);
    if chunk == 0 || reserved == 0 || reserved.div_ceil(chunk) != fds.len() || fds.len() != layout.count as usize {
        return Err(format!(
            "pid {} described the allocation inconsistently ({layout:?}, {} fds)",
            name.pid,
            fds.len()
        ));
    }
    let (base, handles) = map(device.as_ref(), &layout, &fds).map_err(|why| format!("mapping it failed ({why})"))?;
    imports.insert(base, Import { name, ordinal, layout, handles, opened: 1 });
    OPENED.fetch_add(1, Relaxed);
    Ok(base)
}

/// Reserves VA for `layout`, imports and maps each chunk in order, opens it to this GPU; any
/// failure undoes every step.
fn map(device: &dyn Device, layout: &Layout, fds: &[OwnedFd]) -> Result<(u64, Vec<PhysHandle>), DeviceError> {
    let (reserved, chunk) = (layout.reserved as usize, layout.chunk as usize);
    let len = |index: usize| chunk.min(reserved - index * chunk);
    let base = device.reserve(reserved)?;
    let (mut handles, mut mapped) = (Vec::with_capacity(fds.len()), 0);
    let mut steps = || -> Result<(), DeviceError> {
        for (index, fd) in fds.iter().enumerate() {
            handles.push(device.import_chunk(fd.as_fd(), len(index))?);
            device.map_sized(base + (index * chunk) as u64, handles[index], len(index))?;
            mapped += 1;
        }
        device.set_access(base, reserved)
    };
    match steps() {
        Ok(()) => Ok((base, handles)),
        Err(first) => {
            unmap(device, base, layout, mapped, &handles);
            Err(first)
        }
    }
}

/// Unmaps the first `mapped` chunks of an import at `base`, releases `handles`, unreserves.
fn unmap(
    device: &dyn Device,
    base: u64,
    layout: &Layout,
    mapped: usize,
    handles: &[PhysHandle],
) -> Option<DeviceError> {
    let (reserved, chunk) = (layout.reserved as usize, layout.chunk as usize);
    let mut results: Vec<_> =
        (0..mapped).map(|i| device.unmap(base + (i * chunk) as u64, chunk.min(reserved - i * chunk))).collect();
    results.extend(handles.iter().map(|&handle| device.release_chunk(handle)));
    results.push(device.unreserve(base, reserved));
    results.into_iter().find_map(Result::err)
}

/// `cuIpcOpenMemHandle_v2` (what CUDA 11 and later headers call `cuIpcOpenMemHandle`).
///
/// # Safety
/// As the driver's: `dptr` null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuIpcOpenMemHandle_v2(dptr: *mut u64, handle: IpcMemHandle, flags: c_uint) -> CuResult {
    let real = driver().and_then(|d| d.ipc_open_mem_handle_v2);
    // SAFETY: passed on from the caller.
    unsafe { open("cuIpcOpenMemHandle_v2", real, dptr, handle, flags) }
}

/// `cuIpcOpenMemHandle`, as callers built for CUDA 10 reach it.
///
/// # Safety
/// As the driver's: `dptr` null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuIpcOpenMemHandle(dptr: *mut u64, handle: IpcMemHandle, flags: c_uint) -> CuResult {
    let real = driver().and_then(|d| d.ipc_open_mem_handle);
    // SAFETY: passed on from the caller.
    unsafe { open("cuIpcOpenMemHandle", real, dptr, handle, flags) }
}

/// A handle of tiermem's mapped here, or anything else given to the driver.
///
/// # Safety
/// `dptr` null or valid for a write.
unsafe fn open(
    call: &str,
    real: Option<IpcOpenMemHandleFn>,
    dptr: *mut u64,
    handle: IpcMemHandle,
    flags: c_uint,
) -> CuResult {
    let Some(real) = real else { return CUDA_ERROR_NOT_INITIALIZED };
    let name = Name::decode(&handle);
    let Some(name) = name.filter(|_| !inside() && !dptr.is_null()) else {
        // SAFETY: the caller's arguments, as the driver takes them.
        return to_driver(|| unsafe { real(dptr, handle, flags) });
    };
    guard(call, || match import(call, name) {
        Ok(base) => {
            // SAFETY: checked non-null; the caller's out-pointer.
            unsafe { dptr.write(base) };
            CUDA_SUCCESS
        }
        Err(why) => {
            log(call, &format!("a handle of pid {}'s: {why}", name.pid), "answering CUDA_ERROR_INVALID_VALUE");
            CUDA_ERROR_INVALID_VALUE
        }
    })
}

/// Closes one open of the import at `dptr`; the last unmaps it once the GPU is done with it.
/// `None`: not an import of tiermem's.
fn close(dptr: u64) -> Option<Result<(), String>> {
    let mut imports = lock(&IMPORTS);
    let import = imports.get_mut(&dptr)?;
    import.opened -= 1;
    if import.opened > 0 {
        return Some(Ok(()));
    }
    let import = imports.remove(&dptr)?;
    drop(imports);
    let device = process::lock().gpus.get(&import.ordinal).and_then(|gpu| gpu.device.clone());
    let Some(device) = device else { return Some(Err(format!("GPU {} is gone from tiermem's books", import.ordinal))) };
    // Work already enqueued may still read it (as before a free, process.rs).
    if let Some(sync) = driver().and_then(|d| d.ctx_synchronize) {
        // SAFETY: the driver's cuCtxSynchronize on the calling thread's context.
        unsafe { sync() };
    }
    let failed = unmap(device.as_ref(), dptr, &import.layout, import.handles.len(), &import.handles);
    Some(failed.map_or(Ok(()), |why| Err(format!("unmapping it failed ({why}); its VA stays held"))))
}

/// `cuIpcCloseMemHandle`: an import of tiermem's closed, anything else given to the driver.
///
/// # Safety
/// As the driver's.
#[no_mangle]
pub unsafe extern "C" fn cuIpcCloseMemHandle(dptr: u64) -> CuResult {
    let Some(real) = driver().and_then(|d| d.ipc_close_mem_handle) else { return CUDA_ERROR_NOT_INITIALIZED };
    // SAFETY: the caller's argument, as the driver takes it.
    let to_real = || to_driver(|| unsafe { real(dptr) });
    if inside() {
        return to_real();
    }
    guard("cuIpcCloseMemHandle", || match close(dptr) {
        None => to_real(),
        Some(Ok(())) => CUDA_SUCCESS,
        Some(Err(why)) => {
            log("cuIpcCloseMemHandle", &format!("0x{dptr:x}: {why}"), "answering CUDA_ERROR_INVALID_VALUE");
            CUDA_ERROR_INVALID_VALUE
        }
    })
}
