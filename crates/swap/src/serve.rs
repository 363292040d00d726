//! The server process (`tiermem swap serve`, started detached by `tiermem swap on`).
//!
//! In order: lock all memory (`mlockall`), try `PR_SET_IO_FLUSHER`, leave memory-limited
//! cgroups, take the run directory's lock, open the store, mount the FUSE files, attach a
//! loop device with direct I/O to each, `mkswap` and `swapon` them at one priority, answer on
//! the control socket, and tell the starter it is ready (or why not, after undoing what it
//! did). It then serves until `stop` or SIGTERM/SIGINT: `swapoff` (the kernel reads every
//! page back first), detach the loop devices, unmount, exit. A `swapoff` that fails (not
//! enough RAM to take the pages back) leaves everything on and the server serving.

use crate::control::{
    self, DeviceStatus, ProcessReport, Request, RunDir, State, StateDevice, StatusReport, StoreReport,
};
use crate::fuse_server::{split_devices, DeviceFile, FuseOptions, FuseServer, IoStats, KernelTerms};
use crate::mem_blocks::MemBlocks;
use crate::{system, Blocks, Limits, StoreConfig, VramStore};
use serde_json::{json, Value};
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::FromRawFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

/// Which store serves the bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreKind {
    /// The tiermem engine: HBM, spilling to the file tier.
    Engine,
    /// Host memory ([`MemBlocks`]): for tests of the server and the CLI, never for swap.
    Memory,
}

/// Everything the server is told.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub size: u64,
    pub gpu: usize,
    pub priority: i32,
    pub spill: PathBuf,
    pub spill_size: u64,
    pub devices: usize,
    pub soft_limit: Option<u64>,
    pub hard_limit: Option<u64>,
    /// `swapon` the devices (`--no-enable`: serve the block devices only).
    pub enable: bool,
    /// Attach loop devices (off: serve the FUSE files only; for tests).
    pub attach_loops: bool,
    pub threads: usize,
    pub store: StoreKind,
    pub run_dir: RunDir,
    /// A descriptor to write one JSON line to when ready or failed, then close.
    pub notify_fd: Option<i32>,
}

/// What the server asks of a store beyond [`Blocks`]: its report, its limits, a forced cap.
pub trait StoreControl: Send + Sync {
    fn report(&self) -> StoreReport;
    /// Changes the limits given (`None`: unchanged): the free VRAM below which the store takes
    /// no more (soft) and gives back (hard).
    fn set_limits(&self, soft: Option<u64>, hard: Option<u64>) -> Result<(), String>;
    /// Forces HBM down to `cap` (`None`: lifts it) and returns when it is met, with
    /// `cap_bytes`, `seconds` (taken), `moved_bytes` and `hbm_bytes` (held after).
    fn set_cap(&self, cap: Option<u64>) -> Result<Value, String>;
}

/// A store and its control.
pub struct OpenedStore {
    pub blocks: Arc<dyn Blocks>,
    pub control: Arc<dyn StoreControl>,
}

/// The limits a server starts with: those given, the store's defaults for the others, the
/// hard one never above the soft one.
pub fn limits_for(soft: Option<u64>, hard: Option<u64>) -> Result<Limits, String> {
    let default = Limits::default();
    let limits = Limits {
        soft_free: soft.unwrap_or(default.soft_free.max(hard.unwrap_or(0))),
        hard_free: hard.unwrap_or(default.hard_free.min(soft.unwrap_or(u64::MAX))),
        ..default
    };
    limits.check()?;
    Ok(limits)
}

/// Opens the store the server serves: `size` bytes (the devices' total).
pub fn open_store(config: &ServeConfig, size: u64) -> Result<OpenedStore, String> {
    match config.store {
        StoreKind::Memory => Ok(memory_store(config, size)),
        StoreKind::Engine => {
            let spill = (config.spill_size > 0).then(|| config.spill.clone());
            let mut store_config = StoreConfig::new(size, spill);
            store_config.engine.device = config.gpu;
            store_config.engine.file_limit = if config.spill_size > 0 { config.spill_size as usize } else { 0 };
            // TIERMEM_BACKEND=cuda insists on the GPU, =sim asks for the simulated device.
            if let Some(backend) = std::env::var("TIERMEM_BACKEND").ok().filter(|v| !v.trim().is_empty()) {
                store_config.engine.backend = backend.parse().map_err(|e| format!("TIERMEM_BACKEND={backend}: {e}"))?;
            }
            store_config.limits = limits_for(config.soft_limit, config.hard_limit)?;
            let store = Arc::new(VramStore::open(store_config).map_err(|e| e.to_string())?);
            let engine = store.engine();
            let info = engine.device_info();
            let backend = match (info.backend, engine.fallback_reason()) {
                (tiermem::mechanism::BackendKind::Cuda, _) => format!(
                    "CUDA GPU {} ({}, {}), chunks of {}",
                    info.ordinal,
                    info.name,
                    tiermem::format_size(info.total_bytes),
                    tiermem::format_size(engine.chunk_size())
                ),
                (_, why) => format!(
                    "the simulated device (host memory standing in for VRAM: tests only, never swap to it){}",
                    why.map(|why| format!(", because {why}")).unwrap_or_else(|| " (TIERMEM_BACKEND=sim)".into())
                ),
            };
            let control = Arc::new(EngineControl { store: store.clone(), backend });
            Ok(OpenedStore { blocks: store, control })
        }
    }
}

/// [`StoreControl`] for the engine's [`VramStore`].
struct EngineControl {
    store: Arc<VramStore>,
    backend: String,
}

impl StoreControl for EngineControl {
    fn report(&self) -> StoreReport {
        let stats = self.store.stats();
        StoreReport {
            backend: self.backend.clone(),
            size_bytes: stats.size,
            present_bytes: stats.bytes_present,
            hbm_bytes: stats.hbm_bytes,
            host_bytes: stats.host_bytes,
            file_bytes: stats.file_bytes,
            soft_limit_bytes: Some(stats.limits.soft_free),
            hard_limit_bytes: Some(stats.limits.hard_free),
            cap_bytes: stats.external_cap,
            give_backs: stats.give_backs.count,
            given_back_bytes: stats.give_backs.bytes,
            detail: serde_json::to_value(&stats).unwrap_or(Value::Null),
        }
    }

    fn set_limits(&self, soft: Option<u64>, hard: Option<u64>) -> Result<(), String> {
        let mut limits = self.store.stats().limits;
        limits.soft_free = soft.unwrap_or(limits.soft_free);
        limits.hard_free = hard.unwrap_or(limits.hard_free);
        limits.check()?;
        self.store.set_limits(limits).map(|_| ()).map_err(|e| e.to_string())
    }

    fn set_cap(&self, cap: Option<u64>) -> Result<Value, String> {
        let started = Instant::now();
        let applied = self.store.set_external_cap(cap).map_err(|e| e.to_string())?;
        let seconds = started.elapsed().as_secs_f64();
        let give_back = applied.give_back;
        Ok(json!({
            "cap_bytes": cap,
            "seconds": give_back.map_or(seconds, |g| g.seconds),
            "moved_bytes": give_back.map_or(0, |g| g.bytes()),
            "hbm_bytes": self.store.hbm_held(),
            "budget_bytes": applied.decision.budget,
            "give_back": give_back,
        }))
    }
}

fn memory_store(config: &ServeConfig, size: u64) -> OpenedStore {
    let blocks = Arc::new(MemBlocks::new(size));
    let limits = (config.soft_limit, config.hard_limit);
    let control = Arc::new(MemControl { blocks: blocks.clone(), limits: Mutex::new((limits.0, limits.1, None)) });
    OpenedStore { blocks, control }
}

/// [`StoreControl`] for [`MemBlocks`]: it holds no HBM, so limits and caps are met at once.
struct MemControl {
    blocks: Arc<MemBlocks>,
    limits: Mutex<(Option<u64>, Option<u64>, Option<u64>)>,
}

impl StoreControl for MemControl {
    fn report(&self) -> StoreReport {
        let (soft, hard, cap) = *self.limits.lock().unwrap();
        StoreReport {
            backend: "host memory (tests only: not VRAM, never swap to it)".into(),
            size_bytes: self.blocks.size(),
            present_bytes: self.blocks.present_bytes(),
            host_bytes: self.blocks.present_bytes(),
            soft_limit_bytes: soft,
            hard_limit_bytes: hard,
            cap_bytes: cap,
            ..Default::default()
        }
    }

    fn set_limits(&self, soft: Option<u64>, hard: Option<u64>) -> Result<(), String> {
        let mut limits = self.limits.lock().unwrap();
        let (soft, hard) = (soft.or(limits.0), hard.or(limits.1));
        if let (Some(soft), Some(hard)) = (soft, hard) {
            if hard > soft {
                return Err(format!("the hard limit ({hard} bytes free) must not exceed the soft limit ({soft})"));
            }
        }
        (limits.0, limits.1) = (soft, hard);
        Ok(())
    }

    fn set_cap(&self, cap: Option<u64>) -> Result<Value, String> {
        self.limits.lock().unwrap().2 = cap;
        Ok(json!({"cap_bytes": cap, "seconds": 0.0, "moved_bytes": 0, "hbm_bytes": 0}))
    }
}

fn log(message: &str) {
    let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    eprintln!("[{}.{:03}] tiermem swap serve: {message}", now.as_secs(), now.subsec_millis());
}

/// Runs the server: returns when it has stopped, or with why it could not start.
pub fn serve(config: ServeConfig) -> Result<(), String> {
    // Threads' stacks are locked whole (MCL_FUTURE): keep them small. Read once, at the first
    // thread; none has started yet.
    if std::env::var_os("RUST_MIN_STACK").is_none() {
        std::env::set_var("RUST_MIN_STACK", (1 << 20).to_string());
    }
    // SAFETY: the descriptor was opened by our starter for us alone (or is not given).
    let mut notify = config.notify_fd.filter(|fd| *fd > 2).map(|fd| unsafe { File::from_raw_fd(fd) });
    block_stop_signals();
    let started = start(&config).and_then(|server| match server.listen() {
        Ok(listener) => Ok((server, listener)),
        Err(error) => match server.stop(&mut |line| log(line)) {
            Ok(()) => Err(error),
            Err(undo) => Err(format!("{error}; undoing the set-up failed too: {undo} (see `tiermem swap off`)")),
        },
    });
    match started {
        Err(error) => {
            log(&format!("failed: {error}"));
            if let Some(file) = notify.as_mut() {
                let _ = writeln!(file, "{}", json!({"ok": false, "error": error}));
            }
            Err(error)
        }
        Ok((server, listener)) => {
            server.save(|s| s.phase = "ready".into());
            let ready = server.ready_message();
            log(&format!("ready: {ready}"));
            if let Some(mut file) = notify.take() {
                let _ = writeln!(file, "{ready}");
            }
            server.run(listener)
        }
    }
}

/// SIGTERM and SIGINT are taken by one thread (sigwait) and stop the server cleanly.
fn block_stop_signals() {
    // SAFETY: a sigset on the stack, initialised by sigemptyset before use; only this thread
    // exists, so every later thread inherits the mask.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
}

fn wait_for_stop_signal() -> i32 {
    // SAFETY: as in block_stop_signals; sigwait writes the signal number into `signal`.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        let mut signal = 0;
        libc::sigwait(&set, &mut signal);
        signal
    }
}

struct Server {
    config: ServeConfig,
    run: RunDir,
    _lock: File,
    devices: Vec<DeviceFile>,
    store: Mutex<Option<OpenedStore>>,
    control: Arc<dyn StoreControl>,
    fuse: Mutex<Option<FuseServer>>,
    stats: Mutex<Option<Arc<IoStats>>>,
    terms: Mutex<KernelTerms>,
    state: Mutex<State>,
    process: Mutex<ProcessReport>,
    started: Instant,
    stopping: Mutex<()>,
}

fn start(config: &ServeConfig) -> Result<Arc<Server>, String> {
    // Before anything else: nothing of this process may ever be swapped out or reclaimed.
    // TIERMEM_SWAP_MLOCK=after-open locks once the store is open instead (a fallback, should
    // the GPU driver's start not bear MCL_FUTURE); nothing is swapped to the device before.
    let lock_after_open = std::env::var("TIERMEM_SWAP_MLOCK").is_ok_and(|v| v == "after-open");
    let lock_memory =
        || system::lock_memory().map_err(|e| format!("mlockall(MCL_CURRENT|MCL_FUTURE): {e} (run as root)"));
    if !lock_after_open {
        lock_memory()?;
    }
    let io_flusher = match system::set_io_flusher() {
        Ok(()) => "ok".into(),
        Err(e) => format!("not set: {e}"),
    };
    let mut process = ProcessReport { io_flusher, ..Default::default() };
    log(&format!(
        "memory {}; PR_SET_IO_FLUSHER: {}",
        if lock_after_open { "to be locked once the store is open" } else { "locked" },
        process.io_flusher
    ));
    process.oom_score_adj = match system::protect_from_oom() {
        Ok(()) => "-1000".into(),
        Err(e) => format!("unchanged: {e}"),
    };
    process.cgroup = match system::leave_memory_limited_cgroup() {
        Ok(cgroup) => cgroup,
        Err(e) => {
            log(&format!("WARNING: cgroup: {e}"));
            format!("{} (WARNING: {e})", system::own_cgroup().unwrap_or_default())
        }
    };
    log(&format!("cgroup {}, oom_score_adj {}", process.cgroup, process.oom_score_adj));

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
    fn save(&self, change: impl FnOnce(&mut State)) {
        let mut state = self.state.lock().unwrap();
        change(&mut state);
        if let Err(e) = self.run.write_state(&state) {
            log(&format!("WARNING: writing {}: {e}", self.run.state().display()));
        }
    }

    fn set_up(&self) -> Result<(), String> {
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

    fn ready_message(&self) -> Value {
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
    fn listen(&self) -> Result<UnixListener, String> {
        let socket = self.run.socket();
        let _ = std::fs::remove_file(&socket);
        let listener = UnixListener::bind(&socket).map_err(|e| format!("{}: {e}", socket.display()))?;
        std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| format!("{}: {e}", socket.display()))?;
        Ok(listener)
    }

    /// Serves the control socket and the stop signals until stopped; never returns otherwise.
    fn run(self: Arc<Self>, listener: UnixListener) -> Result<(), String> {
        let signals = self.clone();
        std::thread::Builder::new()
            .name("stop-signals".into())
            .spawn(move || loop {
                let signal = wait_for_stop_signal();
                log(&format!("signal {signal}: stopping"));
                match signals.stop(&mut |line| log(line)) {
                    Ok(()) => {
                        log("stopped");
                        std::process::exit(0)
                    }
                    Err(e) => log(&format!("could not stop: {e}; still serving")),
                }
            })
            .map_err(|e| e.to_string())?;
        for stream in listener.incoming() {
            let Ok(stream) = stream else { continue };
            let server = self.clone();
            let spawned = std::thread::Builder::new().name("control".into()).spawn(move || server.answer(stream));
            if let Err(e) = spawned {
                log(&format!("control connection dropped: {e}"));
            }
        }
        Ok(())
    }

    fn answer(&self, stream: UnixStream) {
        let mut writer = match stream.try_clone() {
            Ok(w) => w,
            Err(_) => return,
        };
        let reader = BufReader::new(stream);
        for line in reader.lines() {
            let Ok(line) = line else { return };
            if line.trim().is_empty() {
                continue;
            }
            let mut send = |value: Value| writeln!(writer, "{value}").is_ok();
            let request: Request = match serde_json::from_str(&line) {
                Ok(r) => r,
                Err(e) => {
                    send(json!({"ok": false, "error": format!("bad request {line:?}: {e}")}));
                    continue;
                }
            };
            let reply = match request {
                Request::Status => json!({"ok": true, "status": self.status()}),
                Request::SetLimits { soft_bytes, hard_bytes } => {
                    match self.control.set_limits(soft_bytes, hard_bytes) {
                        Ok(()) => {
                            let now = self.control.report();
                            log(&format!("limits: soft {:?}, hard {:?}", now.soft_limit_bytes, now.hard_limit_bytes));
                            json!({"ok": true, "soft_bytes": now.soft_limit_bytes, "hard_bytes": now.hard_limit_bytes})
                        }
                        Err(e) => json!({"ok": false, "error": e}),
                    }
                }
                Request::SetCap { bytes } => match self.control.set_cap(bytes) {
                    Ok(mut outcome) => {
                        log(&format!("cap {bytes:?}: {outcome}"));
                        outcome["ok"] = json!(true);
                        outcome
                    }
                    Err(e) => json!({"ok": false, "error": e}),
                },
                Request::Stop => {
                    log("stop requested");
                    let result = self.stop(&mut |line| {
                        log(line);
                        send(json!({"ok": true, "progress": line}));
                    });
                    match result {
                        Ok(()) => {
                            log("stopped");
                            send(json!({"ok": true, "stopped": true}));
                            std::process::exit(0)
                        }
                        Err(e) => {
                            log(&format!("could not stop: {e}; still serving"));
                            json!({"ok": false, "error": e})
                        }
                    }
                }
            };
            if !send(reply) {
                return;
            }
        }
    }

    fn status(&self) -> StatusReport {
        let state = self.state.lock().unwrap().clone();
        let areas = system::swap_areas();
        let devices = self
            .devices
            .iter()
            .zip(&state.devices)
            .map(|(d, s)| DeviceStatus {
                file: s.file.clone(),
                offset_bytes: d.offset,
                size_bytes: d.size,
                loop_device: s.loop_device.clone(),
                swap: s.loop_device.as_ref().and_then(|l| areas.iter().find(|a| &a.filename == l).cloned()),
            })
            .collect();
        let mut process = self.process.lock().unwrap().clone();
        process.locked_bytes = system::locked_bytes();
        StatusReport {
            pid: state.pid,
            uptime_s: self.started.elapsed().as_secs_f64(),
            size_bytes: state.size_bytes,
            priority: state.priority,
            swap_enabled: self.config.enable && self.config.attach_loops,
            mountpoint: state.mountpoint.clone(),
            devices,
            store: self.control.report(),
            requests: self.stats.lock().unwrap().as_ref().map(|s| s.report()),
            fuse: self.terms.lock().unwrap().clone(),
            process,
        }
    }

    /// Undoes everything, in reverse: swap areas, loop devices, the mount, the store. Stops at
    /// a swap area or loop device that will not go, leaving the rest serving it.
    fn stop(&self, progress: &mut dyn FnMut(&str)) -> Result<(), String> {
        let _one_at_a_time = self.stopping.lock().unwrap_or_else(|e| e.into_inner());
        let phase = self.state.lock().unwrap().phase.clone();
        self.save(|s| s.phase = "stopping".into());
        let devices = self.state.lock().unwrap().devices.clone();
        for (i, device) in devices.iter().enumerate() {
            let Some(loop_device) = device.loop_device.as_deref().filter(|_| device.swap) else { continue };
            if system::swap_area(loop_device).is_some() {
                progress(&format!("swapoff {loop_device}"));
                if let Err(e) = control::swap_off_with_progress(loop_device, progress) {
                    self.save(|s| s.phase = phase);
                    return Err(format!("{e}: the swap area stays on, and the server keeps serving it"));
                }
            }
            self.save(|s| s.devices[i].swap = false);
        }
        for (i, device) in devices.iter().enumerate() {
            let Some(loop_device) = device.loop_device.as_deref() else { continue };
            progress(&format!("losetup -d {loop_device}"));
            if let Err(e) = system::detach_loop(loop_device) {
                self.save(|s| s.phase = phase);
                return Err(format!("{e}: the server keeps serving"));
            }
            self.save(|s| s.devices[i].loop_device = None);
        }
        if let Some(fuse) = self.fuse.lock().unwrap().take() {
            progress(&format!("umount {}", fuse.mountpoint().display()));
            if let Err(e) = fuse.unmount(Duration::from_secs(10)) {
                progress(&format!("WARNING: {e}"));
            }
        }
        self.save(|s| s.mounted = false);
        // Dropping the store ends the engine, which removes its file tier's file.
        drop(self.store.lock().unwrap().take());
        let spill = self.state.lock().unwrap().spill.clone();
        if let Some(spill) = spill.filter(|s| s.exists()) {
            let _ = std::fs::remove_file(spill);
        }
        self.run.remove_state();
        Ok(())
    }
}
