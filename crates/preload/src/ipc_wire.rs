//! How a legacy IPC handle of tiermem's reaches the memory it names: the 64 bytes of the handle,
//! and the exporting process's socket that hands the chunks' file descriptors to an importer.
//!
//! A handle is 64 opaque bytes the program copies to another process (PyTorch pickles them).
//! tiermem's say: `tiermem` and a version byte (so no handle of the driver's is mistaken for
//! one), the exporter's pid, a random nonce of the exporting process (a pid can be reused), the
//! allocation's address and the export's serial number (an address can be reused after a free).
//!
//! The exporter listens on an abstract Unix socket named after its pid and nonce (no file to
//! clean up; gone when the process is). An importer connects, sends the address and serial,
//! and reads a header — status, chunk count, bytes reserved, bytes per chunk — then frames of
//! four bytes, each carrying up to [`MAX_FDS`] of the chunks' descriptors (`SCM_RIGHTS`), in
//! order. Only a peer of the exporter's own user (or root) gets descriptors: the socket is
//! reachable by any process of the network namespace. A thread of tiermem's own serves the
//! socket; it makes no driver call (the descriptors were exported when the handle was made).

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::sync::OnceLock;
use std::time::Duration;

use tiermem_protocol::fd_passing::{send_with_fds, FdQueue, MAX_FDS};

/// `CUipcMemHandle`: 64 opaque bytes, passed by value to `cuIpcOpenMemHandle`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IpcMemHandle {
    pub reserved: [u8; 64],
}

const MAGIC: &[u8; 8] = b"tiermem\x01";
/// How long an importer waits for the exporter, and the exporter for a request.
const PATIENCE: Duration = Duration::from_secs(10);

/// What one of tiermem's handles names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Name {
    pub pid: u32,
    pub nonce: u64,
    pub va: u64,
    pub serial: u64,
}

impl Name {
    pub fn encode(&self) -> IpcMemHandle {
        let mut bytes = [0u8; 64];
        bytes[..8].copy_from_slice(MAGIC);
        bytes[8..12].copy_from_slice(&self.pid.to_le_bytes());
        bytes[16..24].copy_from_slice(&self.nonce.to_le_bytes());
        bytes[24..32].copy_from_slice(&self.va.to_le_bytes());
        bytes[32..40].copy_from_slice(&self.serial.to_le_bytes());
        IpcMemHandle { reserved: bytes }
    }

    /// The name in `handle`, or `None`: not one of tiermem's (the driver's own, or garbage).
    pub fn decode(handle: &IpcMemHandle) -> Option<Name> {
        let b = &handle.reserved;
        let word = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"));
        (b[..8] == *MAGIC && b[12..16] == [0; 4] && b[40..].iter().all(|&x| x == 0)).then(|| Name {
            pid: u32::from_le_bytes(b[8..12].try_into().expect("4 bytes")),
            nonce: word(16),
            va: word(24),
            serial: word(32),
        })
    }
}

/// What an exporter sends for a name it knows: the allocation's shape, then its chunks' descriptors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub reserved: u64,
    pub chunk: u64,
    pub count: u32,
}

const OK: u32 = 0;
const UNKNOWN: u32 = 1;
const REFUSED: u32 = 2;

/// This process's nonce (random, drawn once).
pub fn nonce() -> u64 {
    static NONCE: OnceLock<u64> = OnceLock::new();
    *NONCE.get_or_init(|| {
        let mut hasher = RandomState::new().build_hasher();
        hasher.write_u32(std::process::id());
        hasher.finish()
    })
}

fn socket_address(pid: u32, nonce: u64) -> std::io::Result<SocketAddr> {
    SocketAddr::from_abstract_name(format!("tiermem-ipc-{pid}-{nonce:016x}"))
}

/// What the server asks the exports for: the layout and duplicated descriptors of `va`'s export
/// `serial`, or `None` (freed, or never exported).
pub type Lookup = fn(u64, u64) -> Option<(Layout, Vec<OwnedFd>)>;

/// Starts this process's socket and its thread, once; the error says why there is none.
pub fn serve(lookup: Lookup) -> Result<(), String> {
    static SERVING: OnceLock<Result<(), String>> = OnceLock::new();
    SERVING
        .get_or_init(|| {
            let address = socket_address(std::process::id(), nonce()).map_err(|e| e.to_string())?;
            let listener = UnixListener::bind_addr(&address).map_err(|e| format!("the IPC socket: {e}"))?;
            std::thread::Builder::new()
                .name("tiermem-ipc".into())
                .spawn(move || {
                    for stream in listener.incoming().flatten() {
                        // A peer that misbehaves loses its connection; the server goes on.
                        let _ = answer(stream, lookup);
                    }
                })
                .map(drop)
                .map_err(|e| format!("the IPC thread: {e}"))
        })
        .clone()
}

/// Whether the peer of `stream` may have this process's memory: its own user, or root.
fn permitted(stream: &UnixStream) -> bool {
    let mut cred = libc::ucred { pid: 0, uid: u32::MAX, gid: 0 };
    let mut len = size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: SO_PEERCRED writes a `ucred` of `len` bytes into valid memory.
    let got = unsafe {
        libc::getsockopt(
            std::os::fd::AsRawFd::as_raw_fd(stream),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&raw mut cred).cast(),
            &mut len,
        )
    };
    // SAFETY: geteuid cannot fail.
    got == 0 && (cred.uid == 0 || cred.uid == unsafe { libc::geteuid() })
}

fn answer(mut stream: UnixStream, lookup: Lookup) -> std::io::Result<()> {
    stream.set_read_timeout(Some(PATIENCE))?;
    stream.set_write_timeout(Some(PATIENCE))?;
    let mut request = [0u8; 16];
    stream.read_exact(&mut request)?;
    let va = u64::from_le_bytes(request[..8].try_into().expect("8 bytes"));
    let serial = u64::from_le_bytes(request[8..].try_into().expect("8 bytes"));
    let found = if permitted(&stream) { lookup(va, serial).ok_or(UNKNOWN) } else { Err(REFUSED) };
    let (status, layout, fds) = match found {
        Ok((layout, fds)) => (OK, layout, fds),
        Err(status) => (status, Layout { reserved: 0, chunk: 0, count: 0 }, Vec::new()),
    };
    let mut header = [0u8; 24];
    header[..4].copy_from_slice(&status.to_le_bytes());
    header[4..8].copy_from_slice(&layout.count.to_le_bytes());
    header[8..16].copy_from_slice(&layout.reserved.to_le_bytes());
    header[16..].copy_from_slice(&layout.chunk.to_le_bytes());
    stream.write_all(&header)?;
    for batch in fds.chunks(MAX_FDS) {
        let borrowed: Vec<_> = batch.iter().map(|fd| fd.as_fd()).collect();
        let frame = (batch.len() as u32).to_le_bytes();
        if send_with_fds(stream.as_fd(), &frame, &borrowed)? != frame.len() {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
    }
    Ok(())
}

/// Reads exactly `buffer.len()` bytes, queueing the descriptors that come with them.
fn recv_exact(stream: &UnixStream, queue: &mut FdQueue, buffer: &mut [u8]) -> std::io::Result<()> {
    let mut filled = 0;
    while filled < buffer.len() {
        match queue.recv(stream.as_fd(), &mut buffer[filled..])? {
            0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            n => filled += n,
        }
    }
    Ok(())
}

/// Asks the process that made `name` for its layout and descriptors; the error says why not.
pub fn fetch(name: &Name) -> Result<(Layout, Vec<OwnedFd>), String> {
    let gone = |e: std::io::Error| {
        format!("the exporting process (pid {}) does not answer ({e}): it exited, or runs without tiermem", name.pid)
    };
    let address = socket_address(name.pid, name.nonce).map_err(|e| e.to_string())?;
    let mut stream = UnixStream::connect_addr(&address).map_err(gone)?;
    stream.set_read_timeout(Some(PATIENCE)).map_err(gone)?;
    let mut request = [0u8; 16];
    request[..8].copy_from_slice(&name.va.to_le_bytes());
    request[8..].copy_from_slice(&name.serial.to_le_bytes());
    stream.write_all(&request).map_err(gone)?;
    let (mut queue, mut header) = (FdQueue::new(), [0u8; 24]);
    recv_exact(&stream, &mut queue, &mut header).map_err(gone)?;
    let field = |at: usize, len: usize| {
        let mut b = [0u8; 8];
        b[..len].copy_from_slice(&header[at..at + len]);
        u64::from_le_bytes(b)
    };
    match field(0, 4) as u32 {
        OK => {}
        UNKNOWN => return Err(format!("pid {} freed the allocation 0x{:x} (or never shared it)", name.pid, name.va)),
        _ => return Err(format!("pid {} shares its memory only with its own user", name.pid)),
    }
    let layout = Layout { count: field(4, 4) as u32, reserved: field(8, 8), chunk: field(16, 8) };
    let mut fds = Vec::with_capacity(layout.count as usize);
    while fds.len() < layout.count as usize {
        let mut frame = [0u8; 4];
        recv_exact(&stream, &mut queue, &mut frame).map_err(gone)?;
        let n = u32::from_le_bytes(frame) as usize;
        fds.extend(queue.take(n, "a frame of descriptors").map_err(|e| e.to_string())?);
    }
    Ok((layout, fds))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_survives_its_handle_and_nothing_else_reads_as_one() {
        let name = Name { pid: 4242, nonce: 0xdead_beef_0bad_f00d, va: 0x7f00_0020_0000, serial: 7 };
        assert_eq!(Name::decode(&name.encode()), Some(name));
        assert_eq!(Name::decode(&IpcMemHandle { reserved: [0; 64] }), None, "zeros");
        let mut driver = name.encode();
        driver.reserved[7] = 0;
        assert_eq!(Name::decode(&driver), None, "another magic");
        let mut tail = name.encode();
        tail.reserved[63] = 1;
        assert_eq!(Name::decode(&tail), None, "bytes tiermem never writes");
    }

    #[test]
    fn descriptors_travel_in_frames_to_an_importer_of_the_same_user() {
        fn lookup(va: u64, serial: u64) -> Option<(Layout, Vec<OwnedFd>)> {
            (va == 0x1000 && serial == 3).then(|| {
                let fds = (0..(MAX_FDS + 3)).map(|_| std::fs::File::open("/dev/null").unwrap().into()).collect();
                (Layout { reserved: 1 << 30, chunk: 2 << 20, count: (MAX_FDS + 3) as u32 }, fds)
            })
        }
        serve(lookup).expect("a socket of this process's");
        let name = Name { pid: std::process::id(), nonce: nonce(), va: 0x1000, serial: 3 };
        let (layout, fds) = fetch(&name).expect("the descriptors");
        assert_eq!((layout.count as usize, fds.len(), layout.chunk), (MAX_FDS + 3, MAX_FDS + 3, 2 << 20));
        let stale = fetch(&Name { serial: 4, ..name }).expect_err("another serial is a freed allocation");
        assert!(stale.contains("freed"), "{stale}");
        let gone = fetch(&Name { nonce: nonce() ^ 1, ..name }).expect_err("no such process");
        assert!(gone.contains("does not answer"), "{gone}");
    }
}
