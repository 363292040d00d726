//! A shareable allocation of the simulated device handed to a real second process: the parent
//! writes bytes, exports the allocation and starts this same program again as the child, which
//! inherits the descriptor, imports the allocation on a simulated device of its own, checks the
//! parent's bytes and writes its own answer; the parent then reads the answer through its
//! mapping.
//!
//! This file is its own test harness (`harness = false` in Cargo.toml), so the child is plain
//! `main` with the descriptor's number in its environment rather than a test that does nothing
//! in every other run.

mod locations_common;

use locations_common::{bytes, read};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::Command;
use tiermem_mechanism::sim::{SimDevice, SIM_GRANULARITY as G};
use tiermem_mechanism::{ChunkLocation, Device};

/// The child's environment: the inherited descriptor.
const CHILD_FD: &str = "TIERMEM_TEST_SHARED_FD";
const SIZE: usize = 3 * G;
const PARENT_SEED: u64 = 7;
const CHILD_SEED: u64 = 8;

fn main() {
    if std::env::args().any(|arg| arg == "--list") {
        println!("sharing_process: test"); // as libtest lists its tests, for tools that ask
        return;
    }
    match std::env::var(CHILD_FD) {
        Ok(fd) => child(fd.parse().expect("the descriptor's number")),
        Err(_) => parent(),
    }
}

fn parent() {
    let dev = SimDevice::node(2, 4 * G).expect("simulated node").pop().expect("GPU 1");
    let chunk = dev.create_shareable_chunks_at(ChunkLocation::Gpu(1), SIZE / G).unwrap();
    let va = dev.reserve(SIZE).unwrap();
    dev.map_sized(va, chunk, SIZE).unwrap();
    dev.set_access(va, SIZE).unwrap();
    dev.write(va, &bytes(PARENT_SEED, SIZE)).unwrap();

    let fd = dev.export_chunk(chunk).unwrap();
    let raw = fd.as_raw_fd();
    let keep_open_across_exec = move || {
        // SAFETY: fcntl is async-signal-safe, and clearing close-on-exec in the child's own
        // descriptor table leaves the parent's untouched.
        match unsafe { libc::fcntl(raw, libc::F_SETFD, 0) } {
            0 => Ok(()),
            _ => Err(std::io::Error::last_os_error()),
        }
    };
    let mut command = Command::new(std::env::current_exe().expect("this test's program"));
    command.env(CHILD_FD, raw.to_string());
    // SAFETY: the hook only calls fcntl (see above): nothing that allocates or takes locks
    // between fork and exec.
    unsafe { command.pre_exec(keep_open_across_exec) };
    let out = command.output().expect("the child process starts");
    drop(fd);
    assert!(out.status.success(), "child {}: {}", out.status, String::from_utf8_lossy(&out.stderr));

    assert!(read(&dev, va, SIZE) == bytes(CHILD_SEED, SIZE), "the parent reads what the child wrote");
    dev.unmap(va, SIZE).unwrap();
    dev.release_chunk(chunk).unwrap();
    dev.unreserve(va, SIZE).unwrap();
    assert!(dev.live().is_empty(), "still held: {:?}", dev.live());
    println!("sharing_process: the child read the parent's bytes and the parent the child's: ok");
}

fn child(fd: RawFd) {
    // SAFETY: the parent left this descriptor open across exec for this process alone, and
    // nothing else here owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let dev = SimDevice::new(4 * G).expect("simulated device");
    let chunk = dev.import_chunk(fd.as_fd(), SIZE).unwrap();
    drop(fd);
    let va = dev.reserve(SIZE).unwrap();
    dev.map_sized(va, chunk, SIZE).unwrap();
    dev.set_access(va, SIZE).unwrap();
    assert!(read(&dev, va, SIZE) == bytes(PARENT_SEED, SIZE), "the child reads what the parent wrote");
    dev.write(va, &bytes(CHILD_SEED, SIZE)).unwrap();
    dev.unmap(va, SIZE).unwrap();
    dev.release_chunk(chunk).unwrap();
    dev.unreserve(va, SIZE).unwrap();
    assert!(dev.live().is_empty(), "still held: {:?}", dev.live());
}
