//! The probe's legacy IPC checks (`ipc`; `ipc-open` is the child it runs): a tiermem
//! allocation handed to another process by `cuIpcGetMemHandle`, opened there with
//! `cuIpcOpenMemHandle`, written on both sides. Under a budget of 16 MiB, B (8 MiB, hot, on the
//! host) is shared before a synchronization that would bring it up: shared, it stays where it
//! is, so that bytes the exporter writes later reach a process that opens the handle later.

use std::ffi::c_uint;

use super::migration::{self, locations, Kernels, Sync};
use super::{Alloc, Cuda, Free, MIB};

type GetHandle = unsafe extern "C" fn(*mut Handle, u64) -> u32;
type OpenHandle = unsafe extern "C" fn(*mut u64, Handle, c_uint) -> u32;
type CloseHandle = unsafe extern "C" fn(u64) -> u32;
/// `cudaIpcMemLazyEnablePeerAccess`, what PyTorch passes.
const LAZY_PEER_ACCESS: c_uint = 1;
const INVALID_VALUE: u32 = 1;

#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Handle([u8; 64]);

fn hex(handle: &Handle) -> String {
    handle.0.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Handle {
    let mut out = [0u8; 64];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).expect("a handle in hex");
    }
    Handle(out)
}

/// Runs this probe as `ipc-open HANDLE LEN EXPECT [WRITE]` (inheriting the preload).
fn child(handle: &Handle, len: usize, expect: &str, write: Option<u8>) {
    let exe = std::env::current_exe().expect("the probe's path");
    let mut command = std::process::Command::new(exe);
    command.args(["ipc-open", &hex(handle), &len.to_string(), expect]);
    if let Some(seed) = write {
        command.arg(seed.to_string());
    }
    let status = command.status().expect("the child runs");
    assert!(status.success(), "ipc-open {expect} failed ({status})");
}

pub fn ipc() {
    let cuda = Cuda::load();
    cuda.start();
    let before = cuda.census();
    let kernels = Kernels::register(&cuda);
    let sync: Sync = cuda.get(c"cuCtxSynchronize", 0);
    let (a, b) = migration::hot_b(&cuda, &kernels);
    let get: GetHandle = cuda.get(c"cuIpcGetMemHandle", 0);
    let (mut handle, mut again, mut inner, mut stray) =
        (Handle([0; 64]), Handle([0; 64]), Handle([0; 64]), Handle([0; 64]));
    // SAFETY: valid out-pointers; B is an allocation of this process's.
    unsafe {
        assert_eq!(get(&mut handle, b), 0, "cuIpcGetMemHandle on tiermem memory");
        assert_eq!(get(&mut again, b), 0, "again");
        assert_eq!(get(&mut inner, b + 3 * MIB as u64), 0, "on a pointer inside B");
        assert_eq!(get(&mut stray, 0xdead_0000), INVALID_VALUE, "a pointer of no one's: the driver's answer");
    }
    assert_eq!((handle, handle), (again, inner), "one handle names one allocation");
    // SAFETY: the driver's synchronization; B is hot, on the host, and would come up.
    assert_eq!(unsafe { sync() }, 0);
    assert_eq!(locations(&cuda, b, 8 * MIB), [2; 4], "B, shared, stays where it is");
    assert_eq!(locations(&cuda, a, 16 * MIB), [1; 8], "and A keeps the budget");

    child(&handle, 8 * MIB, "22", Some(33));
    cuda.verify(b, 8 * MIB, 33);
    cuda.write(b, 8 * MIB, 44);
    child(&handle, 8 * MIB, "44", Some(55));
    cuda.verify(b, 8 * MIB, 55);

    let free: Free = cuda.get(c"cuMemFree", 0);
    // SAFETY: a pointer the allocation gave.
    assert_eq!(unsafe { free(b) }, 0);
    child(&handle, 8 * MIB, "refused", None);
    let mut garbage = handle;
    garbage.0[7] ^= 0xff;
    child(&garbage, 8 * MIB, "refused", None);
    // SAFETY: as above.
    assert_eq!(unsafe { free(a) }, 0);
    assert_eq!(cuda.census().held(), before.held(), "leak: the shared chunks go with the free");
    let alloc: Alloc = cuda.get(c"cuMemAlloc", 0);
    let mut c = 0;
    // SAFETY: valid out-pointer.
    assert_eq!(unsafe { alloc(&mut c, 4 * MIB) }, 0);
    // SAFETY: valid out-pointer; C is tiermem's.
    assert_eq!(unsafe { get(&mut again, c) }, 0);
    assert_ne!(again, handle, "a new allocation, maybe at B's address, gets a new handle");
    // SAFETY: as above.
    assert_eq!(unsafe { free(c) }, 0);
    println!("ipc: ok");
}

/// `retain`: `cuMemRetainAllocationHandle` on tiermem's memory is refused as the driver refuses
/// it for `cuMemAlloc` memory, so no library takes a physical chunk tiermem may move (B, hot
/// on the host, still comes up at the next synchronization); on a VMM mapping of the program's
/// own it is the driver's answer, the chunk's handle.
pub fn retain() {
    type Retain = unsafe extern "C" fn(*mut u64, *mut std::ffi::c_void) -> u32;
    let cuda = Cuda::load();
    cuda.start();
    let kernels = Kernels::register(&cuda);
    let sync: Sync = cuda.get(c"cuCtxSynchronize", 0);
    let (a, b) = migration::hot_b(&cuda, &kernels);
    let retain: Retain = cuda.get(c"cuMemRetainAllocationHandle", 0);
    let mut handle = 0u64;
    // SAFETY: valid out-pointers and addresses; the driver's synchronization between.
    unsafe {
        assert_eq!(retain(&mut handle, (b + 3 * MIB as u64) as *mut _), INVALID_VALUE, "on B: refused");
        assert_eq!(retain(&mut handle, a as *mut _), INVALID_VALUE, "on A: refused");
        assert_eq!(sync(), 0);
    }
    assert_eq!(handle, 0, "nothing written");
    assert!(locations(&cuda, b, 8 * MIB).contains(&1), "B, hot, comes up as ever");
    cuda.verify(a, 16 * MIB, 11);
    cuda.verify(b, 8 * MIB, 22);
    let free: Free = cuda.get(c"cuMemFree", 0);
    for ptr in [a, b] {
        // SAFETY: pointers the allocation gave.
        assert_eq!(unsafe { free(ptr) }, 0);
    }
    // The program's own VMM memory: the driver's answer.
    let own = super::vmm::own_chunk(&cuda, 2 * MIB);
    // SAFETY: a valid out-pointer; an address the program mapped.
    assert_eq!(unsafe { retain(&mut handle, own.0 as *mut _) }, 0, "on the program's own mapping: the driver's");
    assert_eq!(handle, own.1, "its chunk's handle");
    // The fake counts no references: the retained handle needs no release of its own.
    super::vmm::drop_own_chunk(&cuda, own, 2 * MIB);
    println!("retain: ok");
}

/// The child: opens `handle`, checks the pattern of `expect` over `len` bytes and writes that
/// of `write`; or, with `expect` = `refused`, checks that the open fails and holds nothing.
pub fn open(handle: &str, len: usize, expect: &str, write: Option<u8>) {
    let cuda = Cuda::load();
    cuda.start();
    let before = cuda.census();
    let open: OpenHandle = cuda.get(c"cuIpcOpenMemHandle", 0);
    let close: CloseHandle = cuda.get(c"cuIpcCloseMemHandle", 0);
    let handle = unhex(handle);
    let (mut ptr, mut again) = (0u64, 0u64);
    if expect == "refused" {
        // SAFETY: a valid out-pointer; the handle by value.
        assert_eq!(unsafe { open(&mut ptr, handle, LAZY_PEER_ACCESS) }, INVALID_VALUE, "the open is refused");
        assert_eq!(cuda.census().held(), before.held(), "a refused open holds nothing");
        return;
    }
    // SAFETY: valid out-pointers; the handle by value.
    unsafe {
        assert_eq!(open(&mut ptr, handle, LAZY_PEER_ACCESS), 0, "cuIpcOpenMemHandle");
        assert_eq!(open(&mut again, handle, LAZY_PEER_ACCESS), 0, "opened twice");
    }
    assert_eq!(ptr, again, "one mapping per handle");
    cuda.verify(ptr, len, expect.parse().expect("a seed"));
    if let Some(seed) = write {
        cuda.write(ptr, len, seed);
    }
    // SAFETY: the pointer the open gave, closed as often as opened, then once more.
    unsafe {
        assert_eq!(close(ptr), 0, "the first close");
        cuda.verify(ptr, len, write.unwrap_or(0));
        assert_eq!(close(ptr), 0, "the last close");
        assert_eq!(close(ptr), INVALID_VALUE, "closed already: the driver's answer");
    }
    assert_eq!(cuda.census().held(), before.held(), "leak: the last close gives everything back");
}

type AddressRange = unsafe extern "C" fn(*mut u64, *mut usize, u64) -> u32;
type Attribute = unsafe extern "C" fn(*mut std::ffi::c_void, std::ffi::c_int, u64) -> u32;

/// `ranges`: what a pointer into a tiermem allocation says of its allocation — the allocation
/// the program made, from anywhere in it, not the physical chunk holding the pointer — and that
/// other pointers and attributes get the driver's answers.
pub fn ranges() {
    let cuda = Cuda::load();
    cuda.start();
    let alloc: Alloc = cuda.get(c"cuMemAlloc", 0);
    let range: AddressRange = cuda.get(c"cuMemGetAddressRange", 0);
    let attribute: Attribute = cuda.get(c"cuPointerGetAttribute", 0);
    let asked = 10 * MIB + 100;
    let (mut big, mut small) = (0u64, 0u64);
    // SAFETY: valid out-pointers.
    unsafe {
        assert_eq!(alloc(&mut big, asked), 0);
        assert_eq!(alloc(&mut small, 4096), 0, "a small one, the driver's");
    }
    let inside = big + 5 * MIB as u64 + 12;
    let (mut base, mut size) = (0u64, 0usize);
    let (mut start, mut bytes, mut ipc, mut ordinal) = (0u64, 0usize, 0i32, 0i32);
    // SAFETY: valid out-pointers of each attribute's type; null where the driver allows it.
    unsafe {
        assert_eq!(range(&mut base, &mut size, inside), 0, "cuMemGetAddressRange_v2");
        assert_eq!((base, size), (big, asked), "the allocation, not the chunk holding the pointer");
        assert_eq!(range(std::ptr::null_mut(), &mut size, big), 0, "no base wanted");
        assert_eq!(size, asked);
        assert_eq!(attribute((&raw mut start).cast(), 11, inside), 0, "RANGE_START_ADDR");
        assert_eq!(attribute((&raw mut bytes).cast(), 12, inside), 0, "RANGE_SIZE");
        assert_eq!(attribute((&raw mut ipc).cast(), 10, inside), 0, "IS_LEGACY_CUDA_IPC_CAPABLE");
        assert_eq!((start, bytes, ipc), (big, asked, 1), "as cuMemAlloc memory");
        assert_eq!(attribute((&raw mut ordinal).cast(), 9, inside), 801, "another attribute: the driver's answer");
        assert_eq!(range(&mut base, &mut size, small + 100), 0, "the driver's own allocation");
        assert_eq!((base, size), (small, 4096));
        assert_eq!(range(&mut base, &mut size, 0x10), INVALID_VALUE, "no one's pointer: the driver's answer");
    }
    let free: Free = cuda.get(c"cuMemFree", 0);
    // SAFETY: pointers the allocations gave.
    unsafe {
        assert_eq!(free(big), 0);
        assert_eq!(free(small), 0);
    }
    println!("ranges: ok");
}
