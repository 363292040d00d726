//! The running server: its state, the control socket's requests (status, limits, cap, stop),
//! the stop signals, and stopping: everything undone in reverse.

use super::process::wait_for_stop_signal;
use super::stores::{OpenedStore, StoreControl};
use super::{log, ServeConfig};
use crate::control::{self, DeviceStatus, ProcessReport, Request, RunDir, State, StatusReport};
use crate::fuse_server::{DeviceFile, FuseServer, IoStats, KernelTerms};
use crate::system;
use serde_json::{json, Value};
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub(super) struct Server {
    pub(super) config: ServeConfig,
    pub(super) run: RunDir,
    pub(super) _lock: File,
    pub(super) devices: Vec<DeviceFile>,
    pub(super) store: Mutex<Option<OpenedStore>>,
    pub(super) control: Arc<dyn StoreControl>,
    pub(super) fuse: Mutex<Option<FuseServer>>,
    pub(super) stats: Mutex<Option<Arc<IoStats>>>,
    pub(super) terms: Mutex<KernelTerms>,
    pub(super) state: Mutex<State>,
    pub(super) process: Mutex<ProcessReport>,
    pub(super) started: Instant,
    pub(super) stopping: Mutex<()>,
}

impl Server {
    pub(super) fn save(&self, change: impl FnOnce(&mut State)) {
        let mut state = self.state.lock().unwrap();
        change(&mut state);
        if let Err(e) = self.run.write_state(&state) {
            log(&format!("WARNING: writing {}: {e}", self.run.state().display()));
        }
    }

    /// Serves the control socket and the stop signals until stopped; never returns otherwise.
    pub(super) fn run(self: Arc<Self>, listener: UnixListener) -> Result<(), String> {
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
    pub(super) fn stop(&self, progress: &mut dyn FnMut(&str)) -> Result<(), String> {
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
