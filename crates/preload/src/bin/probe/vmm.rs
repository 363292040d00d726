//! The probe's check of the program's own VMM memory (`vmm`), under a budget of 16 MiB: chunks
//! it makes with `cuMemCreate` in the GPU's HBM are counted against the budget, one beyond it
//! is made on the host, every one maps, opens and keeps its bytes, and `cuMemRelease` gives the
//! budget back — also when it asks for a GPUDirect RDMA capable chunk, which host memory cannot
//! be made as (the fake refuses it, as the H200's driver does). With `TIERMEM_FAKE_HOST_CHUNKS=0` (`vmm-no-host`), the one beyond the budget is
//! made in HBM as asked (so with `TIERMEM_PROGRAM_VMM=hbm`); with `off` (`vmm-off`) chunks
//! pass through uncounted. `vmm-room`: with tiermem's own allocation filling the budget, a
//! chunk of the program's gets HBM, tiermem's coldest chunks going to the host for it.

use std::ffi::{c_int, c_void};

use super::{Census, Code, Cuda, MIB};

/// `CUmemAllocationProp` for pinned memory of GPU 0.
#[repr(C)]
struct Prop {
    kind: c_int,
    handle_types: c_int,
    location_type: c_int,
    location_id: c_int,
    win32: *mut c_void,
    flags: [u8; 8],
}

/// `CUmemAccessDesc`: read-write from GPU 0.
#[repr(C)]
struct Access {
    location_type: c_int,
    location_id: c_int,
    flags: c_int,
}

type Create = unsafe extern "C" fn(*mut u64, usize, *const Prop, u64) -> Code;
type Release = unsafe extern "C" fn(u64) -> Code;
type Reserve = unsafe extern "C" fn(*mut u64, usize, usize, u64, u64) -> Code;
type AddressFree = unsafe extern "C" fn(u64, usize) -> Code;
type Map = unsafe extern "C" fn(u64, usize, usize, u64, u64) -> Code;
type Unmap = unsafe extern "C" fn(u64, usize) -> Code;
type SetAccess = unsafe extern "C" fn(u64, usize, *const Access, usize) -> Code;

/// A chunk of `size` bytes of the program's own in GPU 0's HBM, mapped read-write at an address
/// it reserved: the address and the chunk's handle.
pub fn own_chunk(cuda: &Cuda, size: usize) -> (u64, u64) {
    let create: Create = cuda.get(c"cuMemCreate", 0);
    let reserve: Reserve = cuda.get(c"cuMemAddressReserve", 0);
    let map: Map = cuda.get(c"cuMemMap", 0);
    let set_access: SetAccess = cuda.get(c"cuMemSetAccess", 0);
    let prop =
        Prop { kind: 1, handle_types: 0, location_type: 1, location_id: 0, win32: std::ptr::null_mut(), flags: [0; 8] };
    let access = Access { location_type: 1, location_id: 0, flags: 3 };
    let (mut va, mut handle) = (0u64, 0u64);
    // SAFETY: valid out-pointers and descriptions; the handle and address the driver gave.
    unsafe {
        assert_eq!(create(&mut handle, size, &prop, 0), 0, "cuMemCreate");
        assert_eq!(reserve(&mut va, size, 0, 0, 0), 0, "cuMemAddressReserve");
        assert_eq!(map(va, size, 0, handle, 0), 0, "cuMemMap");
        assert_eq!(set_access(va, size, &access, 1), 0, "cuMemSetAccess");
    }
    (va, handle)
}

/// Unmaps, releases and frees what [`own_chunk`] made.
pub fn drop_own_chunk(cuda: &Cuda, (va, handle): (u64, u64), size: usize) {
    let release: Release = cuda.get(c"cuMemRelease", 0);
    let address_free: AddressFree = cuda.get(c"cuMemAddressFree", 0);
    let unmap: Unmap = cuda.get(c"cuMemUnmap", 0);
    // SAFETY: what own_chunk made, undone once.
    unsafe {
        assert_eq!(unmap(va, size), 0);
        assert_eq!(release(handle), 0);
        assert_eq!(address_free(va, size), 0);
    }
}

pub fn vmm(host_chunks: bool) {
    let cuda = Cuda::load();
    cuda.start();
    let before = cuda.census();
    let create: Create = cuda.get(c"cuMemCreate", 0);
    let release: Release = cuda.get(c"cuMemRelease", 0);
    let reserve: Reserve = cuda.get(c"cuMemAddressReserve", 0);
    let address_free: AddressFree = cuda.get(c"cuMemAddressFree", 0);
    let map: Map = cuda.get(c"cuMemMap", 0);
    let unmap: Unmap = cuda.get(c"cuMemUnmap", 0);
    let set_access: SetAccess = cuda.get(c"cuMemSetAccess", 0);
    // GPUDirect RDMA capable, as PyTorch's expandable segments ask where the GPU supports it.
    let mut flags = [0; 8];
    flags[1] = 1;
    let prop = Prop { kind: 1, handle_types: 0, location_type: 1, location_id: 0, win32: std::ptr::null_mut(), flags };
    let access = Access { location_type: 1, location_id: 0, flags: 3 };
    let sizes = [8 * MIB, 8 * MIB, 4 * MIB];
    let total: usize = sizes.iter().sum();
    let (mut va, mut handles) = (0u64, [0u64; 3]);
    let held = |cuda: &Cuda| {
        let Census { gpu_chunks, host_chunks, .. } = cuda.census();
        (gpu_chunks, host_chunks)
    };
    // SAFETY: valid out-pointers and descriptions, handles and addresses the driver gave.
    unsafe {
        assert_eq!(create(&mut handles[0], sizes[0], &prop, 0), 0, "cuMemCreate");
        assert_eq!(cuda.mem_info(), (8 * MIB, 16 * MIB), "counted against the budget");
        assert_eq!(create(&mut handles[1], sizes[1], &prop, 0), 0);
        assert_eq!(cuda.mem_info(), (0, 16 * MIB), "the budget is full");
        assert_eq!(create(&mut handles[2], sizes[2], &prop, 0), 0, "beyond the budget");
        match host_chunks {
            true => assert_eq!(held(&cuda), (2, 1), "made on the host"),
            false => assert_eq!(held(&cuda), (3, 0), "no host chunks: in HBM as asked"),
        }
        assert_eq!(reserve(&mut va, total, 0, 0, 0), 0, "cuMemAddressReserve");
        let mut offset = 0;
        for (&handle, &size) in handles.iter().zip(&sizes) {
            assert_eq!(map(va + offset as u64, size, 0, handle, 0), 0, "cuMemMap");
            offset += size;
        }
        assert_eq!(set_access(va, total, &access, 1), 0, "cuMemSetAccess");
        cuda.write_and_verify(va, total, 41);
        assert_eq!(unmap(va, sizes[0]), 0);
        assert_eq!(release(handles[0]), 0, "cuMemRelease");
        // 20 MiB counted without host chunks (4 beyond the budget), 16 with.
        assert_eq!(cuda.mem_info().0, if host_chunks { 8 * MIB } else { 4 * MIB }, "its HBM is the budget's again");
        // The pattern repeats every MiB: the rest reads as written.
        cuda.verify(va + sizes[0] as u64, total - sizes[0], 41);
        assert_eq!(unmap(va + sizes[0] as u64, sizes[1]), 0);
        assert_eq!(unmap(va + (sizes[0] + sizes[1]) as u64, sizes[2]), 0);
        assert_eq!(release(handles[1]), 0);
        assert_eq!(release(handles[2]), 0);
        assert_eq!(release(handles[2]), 1, "a second release: the driver's CUDA_ERROR_INVALID_VALUE");
        // Bad input gets the driver's own answers, and counts nothing.
        let mut handle = 0u64;
        assert_eq!(create(&mut handle, 2 * MIB, std::ptr::null(), 0), 1, "no properties");
        assert_eq!(create(std::ptr::null_mut(), 2 * MIB, &prop, 0), 1, "a null out-pointer");
        assert_eq!(create(&mut handle, 2 * MIB, &prop, 1), 1, "flags the driver does not know");
        let elsewhere = Prop { location_id: 7, ..prop };
        assert_eq!(
            create(&mut handle, 2 * MIB, &elsewhere, 0),
            101,
            "a GPU that is not there: CUDA_ERROR_INVALID_DEVICE"
        );
        assert_eq!(address_free(va, total), 0);
    }
    assert_eq!(cuda.mem_info(), (16 * MIB, 16 * MIB), "the whole budget is free again");
    assert_eq!(cuda.census().held(), before.held(), "leak");
    println!("vmm: ok");
}

/// `vmm-room`: A, tiermem's (`cuMemAlloc`), fills the 16 MiB budget; a 4 MiB chunk of the
/// program's is then made in HBM, two of A's chunks going to the host, every byte of A intact;
/// one that A cannot make room for (20 MiB) is made on the host.
pub fn room() {
    let cuda = Cuda::load();
    cuda.start();
    let before = cuda.census();
    let create: Create = cuda.get(c"cuMemCreate", 0);
    let release: Release = cuda.get(c"cuMemRelease", 0);
    let alloc: super::Alloc = cuda.get(c"cuMemAlloc", 0);
    let free: super::Free = cuda.get(c"cuMemFree", 0);
    let prop =
        Prop { kind: 1, handle_types: 0, location_type: 1, location_id: 0, win32: std::ptr::null_mut(), flags: [0; 8] };
    let held = |cuda: &Cuda| {
        let Census { gpu_chunks, host_chunks, .. } = cuda.census();
        (gpu_chunks, host_chunks)
    };
    let (mut a, mut handle, mut big) = (0u64, 0u64, 0u64);
    // SAFETY: valid out-pointers and description, the pointer and handles the driver gave.
    unsafe {
        assert_eq!(alloc(&mut a, 16 * MIB), 0);
        cuda.write(a, 16 * MIB, 51);
        assert_eq!(held(&cuda), (8, 0), "A fills the budget");
        assert_eq!(create(&mut handle, 4 * MIB, &prop, 0), 0, "cuMemCreate");
        assert_eq!(held(&cuda), (7, 2), "the program's chunk in HBM, two of A's chunks on the host for it");
        assert_eq!(cuda.mem_info(), (0, 16 * MIB), "the budget is full, not over");
        cuda.verify(a, 16 * MIB, 51);
        assert_eq!(create(&mut big, 20 * MIB, &prop, 0), 0, "more than A holds in HBM");
        assert_eq!(held(&cuda), (7, 3), "made on the host: A's chunks stay");
        assert_eq!(release(big), 0);
        assert_eq!(release(handle), 0);
        assert_eq!(free(a), 0);
    }
    assert_eq!(cuda.mem_info(), (16 * MIB, 16 * MIB), "the whole budget is free again");
    assert_eq!(cuda.census().held(), before.held(), "leak");
    println!("vmm-room: ok");
}

/// `vmm-off`: with `TIERMEM_PROGRAM_VMM=off` the program's chunks leave the budget alone.
pub fn off() {
    let cuda = Cuda::load();
    cuda.start();
    let create: Create = cuda.get(c"cuMemCreate", 0);
    let release: Release = cuda.get(c"cuMemRelease", 0);
    let prop =
        Prop { kind: 1, handle_types: 0, location_type: 1, location_id: 0, win32: std::ptr::null_mut(), flags: [0; 8] };
    let mut handle = 0u64;
    // SAFETY: valid out-pointer and description, the handle the driver gave.
    unsafe {
        assert_eq!(create(&mut handle, 24 * MIB, &prop, 0), 0);
        assert_eq!(cuda.mem_info(), (16 * MIB, 16 * MIB), "not counted");
        assert_eq!(release(handle), 0);
    }
    println!("vmm-off: ok");
}
