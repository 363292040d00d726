//! Starting the server: the run directory and its lock, the store, the state file, the FUSE
//! mount, the loop devices and swap areas; undone again if any step fails. Then the control
//! socket, and the ready message for the starter.

use super::process::{lock_memory, protect_process};
use super::server::Server;
use super::stores::open_store;
use super::{log, ServeConfig, StoreKind};
use crate::control::{State, StateDevice};
use crate::fuse_server::{split_devices, FuseOptions, FuseServer, KernelTerms};
use crate::system;
use serde_json::{json, Value};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime};

/// Sets the server up, or says why not after undoing what it did.
pub(super) fn start(config: &ServeConfig) -> Result<Arc<Server>, String> {
    // Before anything else: nothing of this process may ever be swapped out or reclaimed.
    // TIERMEM_SWAP_MLOCK=after-open locks once the store is open instead (a fallback, should
    // the GPU driver's start not bear MCL_FUTURE); nothing is swapped to the device before.
    let lock_after_open = std::env::var("TIERMEM_SWAP_MLOCK").is_ok_and(|v| v == "after-open");
    let mut process = protect_process(lock_after_open)?;

    let run = config.run_dir.clone();
    run.create().map_err(|e| format!("{}: {e}", run.path().display()))?;
    let lock = run.take_server_lock()?;
    if let Some(old) = run.read_state() {
        return Err(format!(
            "a server that died (pid {}) left swap areas, loop devices or a mount behind ({}): run `tiermem swap \
             off` first",
            old.pid,
            run.state().display()
        ));
    }
    let mountpoint = run.mountpoint();
    if system::mount_type(&mountpoint).is_some() {
        return Err(format!(
            "{} is still mounted (a server that died?): run `tiermem swap off` first",
            mountpoint.display()
        ));
    }
    let devices = split_devices(config.size, config.devices)?;
    let size = devices.iter().map(|d| d.size).sum();
    let spill = (config.store == StoreKind::Engine && config.spill_size > 0).then(|| config.spill.clone());
    if let Some(spill) = &spill {
        if let Some(dir) = spill.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| format!("spill directory {}: {e}", dir.display()))?;
        }
        system::check_spill_location(spill)?;
        // The file is the engine's, removed with it: never take over a file someone else has.
        if spill.exists() {
            return Err(format!(
                "the spill file {} exists already: remove it, or give another --spill",
                spill.display()
            ));
        }
    }
    let store = open_store(config, size).map_err(|e| format!("opening the store: {e}"))?;
    log(&format!("store: {}", store.control.report().backend));
    if lock_after_open {
        lock_memory()?;
        log("memory locked");
    }

    let state = State {
        pid: std::process::id(),
        started_unix: SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default().as_secs(),
        size_bytes: size,
        priority: config.priority,
        phase: "starting".into(),
        mountpoint: mountpoint.clone(),
        mounted: false,
        devices: devices
            .iter()
            .map(|d| StateDevice { file: mountpoint.join(&d.name), size_bytes: d.size, ..Default::default() })
            .collect(),
        spill,
    };
    run.write_state(&state).map_err(|e| format!("{}: {e}", run.state().display()))?;
    process.fuse_threads = config.threads;
    let server = Arc::new(Server {
        config: config.clone(),
        run,
        _lock: lock,
        devices,
        control: store.control.clone(),
        store: Mutex::new(Some(store)),
        fuse: Mutex::new(None),
        stats: Mutex::new(None),
        terms: Mutex::new(KernelTerms::default()),
        state: Mutex::new(state),
        process: Mutex::new(process),
        started: Instant::now(),
        stopping: Mutex::new(()),
    });
    if let Err(error) = server.set_up() {
        log(&format!("setting up failed: {error}; undoing what was done"));
        if let Err(undo) = server.stop(&mut |line| log(line)) {
            return Err(format!("{error}; undoing it failed too: {undo} (see `tiermem swap off`)"));
        }
        return Err(error);
    }
    Ok(server)
}

impl Server {
    pub(super) fn set_up(&self) -> Result<(), String> {
        let mountpoint = self.run.mountpoint();
        std::fs::create_dir_all(&mountpoint).map_err(|e| format!("{}: {e}", mountpoint.display()))?;
        let blocks = self.store.lock().unwrap().as_ref().map(|s| s.blocks.clone()).ok_or("no store")?;
        let options = FuseOptions { threads: self.config.threads, ..FuseOptions::default() };
        let fuse = FuseServer::mount(&mountpoint, blocks, &self.devices, &options)
            .map_err(|e| format!("mounting the FUSE server at {}: {e}", mountpoint.display()))?;
        *self.stats.lock().unwrap() = Some(fuse.stats());
        *self.terms.lock().unwrap() = fuse.kernel_terms();
        let files = fuse.files().to_vec();
        *self.fuse.lock().unwrap() = Some(fuse);
        self.save(|s| s.mounted = true);
        log(&format!(
            "mounted {} ({} files); FUSE: {:?}",
            mountpoint.display(),
            files.len(),
            self.terms.lock().unwrap()
        ));
        if !self.config.attach_loops {
            return Ok(());
        }
        for (i, file) in files.iter().enumerate() {
            let device = system::attach_loop(file)?;
            log(&format!("{device} over {}", file.display()));
            self.save(|s| s.devices[i].loop_device = Some(device.clone()));
            if self.config.enable {
                system::make_swap(&device, &format!("tiermem-swap{i}"))?;
                self.save(|s| s.devices[i].swap = true);
                system::swap_on(&device, self.config.priority)?;
                log(&format!("swapon {device} at priority {}", self.config.priority));
            }
        }
        Ok(())
    }

    pub(super) fn ready_message(&self) -> Value {
        let state = self.state.lock().unwrap().clone();
        json!({
            "ok": true,
            "pid": state.pid,
            "loop_devices": state.devices.iter().filter_map(|d| d.loop_device.clone()).collect::<Vec<_>>(),
            "files": state.devices.iter().map(|d| d.file.clone()).collect::<Vec<_>>(),
            "size_bytes": state.size_bytes,
            "swap_enabled": self.config.enable && self.config.attach_loops,
            "priority": self.config.priority,
            "backend": self.control.report().backend,
            "log": self.run.log(),
        })
    }

    /// The control socket, root's only (mode 0600 in a 0700 directory).
    pub(super) fn listen(&self) -> Result<UnixListener, String> {
        let socket = self.run.socket();
        let _ = std::fs::remove_file(&socket);
        let listener = UnixListener::bind(&socket).map_err(|e| format!("{}: {e}", socket.display()))?;
        std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| format!("{}: {e}", socket.display()))?;
        Ok(listener)
    }
}
