//! Physical allocations shared between processes as POSIX file descriptors: an allocation made
//! with `requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR` is exported with
//! `cuMemExportToShareableHandle` (which writes an `int` fd), sent to another process over a
//! Unix socket, and imported there with `cuMemImportFromShareableHandle` (whose `osHandle`
//! argument is the fd's value cast to a pointer) into a handle of that process, mapped like
//! any chunk. The driver frees the memory once every process has released its handle and
//! unmapped it; the descriptors only name the allocation and may be closed at any time.
//!
//! The driver cannot say how large an imported allocation is: the size the caller gives is
//! checked to be whole granules here and against the allocation by `cuMemMap`.

use std::ffi::{c_int, c_void};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use cudarc::driver::sys;

use super::driver::check;
use super::CudaDevice;
use crate::{ChunkLocation, DeviceError, PhysHandle, Result};

const POSIX_FD: sys::CUmemAllocationHandleType =
    sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;

/// An error if the loaded driver lacks `call` (a fake or very old `libcuda`): cudarc would panic.
fn present(call: &'static str) -> Result<()> {
    match super::driver::has_symbol(call) {
        true => Ok(()),
        false => Err(DeviceError::Unsupported(format!(
            "the loaded libcuda lacks {call}: no memory shared between processes"
        ))),
    }
}

impl CudaDevice {
    /// `Device::create_shareable_chunks_at`.
    pub(super) fn create_shareable(&self, location: ChunkLocation, granules: usize) -> Result<PhysHandle> {
        let mut prop = super::locations::chunk_prop(self, location)?;
        prop.requestedHandleTypes = POSIX_FD;
        self.create_allocation(&prop, location, granules)
    }

    /// `Device::export_chunk`.
    pub(super) fn export(&self, chunk: PhysHandle) -> Result<OwnedFd> {
        present("cuMemExportToShareableHandle")?;
        let _ctx = self.bind()?;
        let mut fd: c_int = -1;
        // SAFETY: for CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR the out-parameter is an `int`,
        // which `fd` is; the driver validates the handle and that it was made shareable so.
        let r = unsafe { sys::cuMemExportToShareableHandle((&raw mut fd).cast(), chunk.0, POSIX_FD, 0) };
        check("cuMemExportToShareableHandle", r, || format!("handle=0x{:x} as a POSIX fd", chunk.0))?;
        if fd < 0 {
            return Err(DeviceError::Driver {
                call: "cuMemExportToShareableHandle",
                code: "CUDA_SUCCESS".into(),
                detail: format!("handle=0x{:x}: the driver returned fd {fd}", chunk.0),
            });
        }
        // SAFETY: the driver made this descriptor for the caller, who owns it from here on.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// `Device::import_chunk`.
    pub(super) fn import(&self, fd: BorrowedFd<'_>, size: usize) -> Result<PhysHandle> {
        let raw = fd.as_raw_fd();
        if size == 0 || !size.is_multiple_of(self.granularity) {
            return Err(DeviceError::Driver {
                call: "cuMemImportFromShareableHandle",
                code: "CUDA_ERROR_INVALID_VALUE".into(),
                detail: format!("fd {raw}: size={size} is not whole granules of {} B", self.granularity),
            });
        }
        present("cuMemImportFromShareableHandle")?;
        let _ctx = self.bind()?;
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: valid out-pointer; for a POSIX fd the driver takes the descriptor's value in
        // place of a pointer, and only reads the descriptor, which the caller keeps open.
        let r = unsafe { sys::cuMemImportFromShareableHandle(&mut handle, raw as usize as *mut c_void, POSIX_FD) };
        check("cuMemImportFromShareableHandle", r, || format!("fd {raw} ({size} bytes) as a POSIX fd"))?;
        Ok(PhysHandle(handle))
    }
}
