//! File descriptors beside frames: they arrive with the frame, in order, whatever pieces the
//! bytes come in; a message claiming more than arrived is an error.

use std::io::{Read, Seek, Write};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use tiermem_protocol::fd_passing::{send_with_fds, FdQueue};
use tiermem_protocol::{encode, DaemonMessage, FrameDecoder};

fn temp_file(text: &str) -> std::fs::File {
    let mut file = tempfile_in_tmp();
    file.write_all(text.as_bytes()).unwrap();
    file
}

fn tempfile_in_tmp() -> std::fs::File {
    let path = std::env::temp_dir().join(format!("tiermem-fd-test-{}-{}", std::process::id(), next_suffix()));
    let file = std::fs::OpenOptions::new().read(true).write(true).create_new(true).open(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    file
}

fn next_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

#[test]
fn descriptors_arrive_with_their_frame_in_order() {
    let (a, b) = UnixStream::pair().unwrap();
    let files = [temp_file("first"), temp_file("second")];
    let message = DaemonMessage::Lent { gpu: 1, slab_bytes: 64 << 20, ids: vec![7, 8] };
    let frame = encode(&message).unwrap();
    let fds: Vec<_> = files.iter().map(|f| f.as_fd()).collect();
    let sent = send_with_fds(a.as_fd(), &frame, &fds).unwrap();
    (&a).write_all(&frame[sent..]).unwrap();

    let mut queue = FdQueue::new();
    let mut decoder = FrameDecoder::new();
    let mut buffer = [0u8; 7]; // small pieces: the descriptors come with the first
    let got: DaemonMessage = loop {
        if let Some(m) = decoder.next_message().unwrap() {
            break m;
        }
        let n = queue.recv(b.as_fd(), &mut buffer).unwrap();
        decoder.extend(&buffer[..n]);
    };
    assert_eq!(got, message);
    let received = queue.take(2, "lent").unwrap();
    for (fd, text) in received.into_iter().zip(["first", "second"]) {
        let mut file = std::fs::File::from(fd);
        file.rewind().unwrap();
        let mut read = String::new();
        file.read_to_string(&mut read).unwrap();
        assert_eq!(read, text, "the same open file, not a copy");
    }
    assert!(queue.take(1, "lent").is_err(), "more than arrived");
}
