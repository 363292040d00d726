"""tiermem: tiered GPU memory — buffers larger than HBM at stable device addresses.

Everything here comes from the Rust extension ``tiermem._tiermem``; this file only re-exports
it. Without a GPU (or with ``backend="sim"``) a Pool runs on the simulated device.
"""

from ._tiermem import (
    Acquisition,
    Buffer,
    BufferStateError,
    DeviceError,
    FileTierError,
    InvalidArgumentError,
    OutOfMemoryError,
    Pool,
    TiermemError,
    WouldNeverFitError,
)

__all__ = [
    "Acquisition",
    "Buffer",
    "BufferStateError",
    "DeviceError",
    "FileTierError",
    "InvalidArgumentError",
    "OutOfMemoryError",
    "Pool",
    "TiermemError",
    "WouldNeverFitError",
]
