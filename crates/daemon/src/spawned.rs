//! A daemon on a thread of its own: for tests, and for programs that embed the node daemon
//! rather than run `tiermem daemon`. It serves until its handle is dropped, which stops it and
//! closes every connection, as a daemon that exits does.

use crate::{bind, serve, Config, DaemonError};
use std::path::Path;

/// A running daemon; dropping it stops the daemon and waits for its thread.
pub struct Spawned {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// Binds `socket` (errors such as a socket in use come back here) and serves `config` on it from
/// a new thread with a current-thread runtime.
pub fn spawn(socket: &Path, config: Config) -> Result<Spawned, DaemonError> {
    let failed = |source| DaemonError::Socket { path: socket.to_owned(), source };
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(failed)?;
    // Bound inside the runtime: the listener registers with its reactor.
    let listener = runtime.block_on(async { bind(socket, &config) })?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let thread = std::thread::Builder::new().name("tiermemd".into()).spawn(move || {
        runtime.block_on(serve(listener, config, async {
            let _ = stopped.await;
        }));
    });
    Ok(Spawned { stop: Some(stop), thread: Some(thread.map_err(failed)?) })
}

impl Drop for Spawned {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
