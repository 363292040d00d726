//! Helpers of the daemon's socket tests: an in-process daemon, raw protocol clients.

#![allow(dead_code)] // each test file uses some of these

use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tiermem_daemon::Config;
use tiermem_protocol::*;

/// A daemon on a socket of its own (and, with `metrics`, Prometheus metrics on a free local
/// port, returned), served by a runtime on a background thread.
pub fn start_daemon(name: &str, metrics: bool) -> (PathBuf, Option<std::net::SocketAddr>) {
    let dir = std::env::temp_dir().join(format!("tiermemd-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let path = dir.join("d.sock");
    let config = Config::parse("[[gpu]]\nindex = 0\nhbm = \"64MiB\"", "test").unwrap();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let socket = path.clone();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            let listener = tiermem_daemon::bind(&socket, &config).unwrap();
            let metrics = match metrics {
                true => Some(tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap()),
                false => None,
            };
            ready_tx.send(metrics.as_ref().map(|m| m.local_addr().unwrap())).unwrap();
            tiermem_daemon::serve_with_metrics(listener, metrics, config, std::future::pending()).await;
        });
    });
    let address = ready_rx.recv_timeout(Duration::from_secs(10)).unwrap();
    (path, address)
}

pub fn connect(path: &PathBuf) -> (UnixStream, FrameReader<UnixStream>) {
    let stream = UnixStream::connect(path).unwrap();
    stream.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    let reader = FrameReader::new(stream.try_clone().unwrap());
    (stream, reader)
}

pub fn deadline() -> Instant {
    Instant::now() + Duration::from_secs(10)
}

/// Reads until an error message arrives, then expects the connection to close.
pub fn expect_error_and_close(reader: &mut FrameReader<UnixStream>) -> ErrorKind {
    let kind = loop {
        match reader.wait::<DaemonMessage>(deadline()).unwrap() {
            DaemonMessage::Error { kind, .. } => break kind,
            _ => continue,
        }
    };
    let closed = loop {
        match reader.wait::<DaemonMessage>(deadline()) {
            Err(ProtocolError::Closed) => break true,
            Err(ProtocolError::Timeout) => break false,
            _ => continue,
        }
    };
    assert!(closed, "the daemon closes after an error");
    kind
}

pub fn hello(stream: &mut UnixStream, reader: &mut FrameReader<UnixStream>) {
    write_message(stream, &ClientMessage::Hello { version: PROTOCOL_VERSION, client: "test".into() }).unwrap();
    check_welcome(reader.wait(deadline()).unwrap()).unwrap();
}

pub fn register(stream: &mut UnixStream, reader: &mut FrameReader<UnixStream>) -> (u64, u64) {
    hello(stream, reader);
    let gpu = GpuId { index: 0, uuid: None, total_bytes: 1 << 30, simulated: true };
    let register = ClientMessage::Register {
        pid: 1,
        label: None,
        gpu,
        chunk_bytes: 2 << 20,
        wants: vec![],
        held: vec![],
        lent_slab_bytes: None,
        waits: false,
        job: None,
    };
    write_message(stream, &register).unwrap();
    let DaemonMessage::Registered { tenant, .. } = reader.wait(deadline()).unwrap() else { panic!("registered") };
    let DaemonMessage::Budget { tiers, .. } = reader.wait(deadline()).unwrap() else { panic!("a budget") };
    (tenant, tiers[0].bytes)
}
