//! Forwarding `Device` calls to the device an adaptor wraps (`self.inner`), for the calls the
//! adaptor adds nothing to: the adaptors (counting.rs, timing.rs) each spell out only their one
//! concern.

/// Implements each listed `Device` method as the same call on `self.inner`.
macro_rules! forward_to_inner {
    ($(fn $name:ident(&self $(, $arg:ident: $ty:ty)*) -> $ret:ty;)*) => {
        $(fn $name(&self $(, $arg: $ty)*) -> $ret {
            self.inner.$name($($arg),*)
        })*
    };
}

/// Implements the two asynchronous host copies as the same calls on `self.inner`; their
/// safety contract passes through unchanged.
macro_rules! forward_host_copies_to_inner {
    () => {
        unsafe fn copy_to_device_async(
            &self,
            dst: DevicePtr,
            src: HostPtr,
            len: usize,
            stream: StreamHandle,
        ) -> Result<()> {
            // SAFETY: the caller's guarantees are passed on unchanged.
            unsafe { self.inner.copy_to_device_async(dst, src, len, stream) }
        }
        unsafe fn copy_to_host_async(
            &self,
            dst: HostPtr,
            src: DevicePtr,
            len: usize,
            stream: StreamHandle,
        ) -> Result<()> {
            // SAFETY: the caller's guarantees are passed on unchanged.
            unsafe { self.inner.copy_to_host_async(dst, src, len, stream) }
        }
    };
}

pub(crate) use {forward_host_copies_to_inner, forward_to_inner};
