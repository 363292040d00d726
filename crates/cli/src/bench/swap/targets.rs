//! The device of each kind that a part of `bench swap` measures, set up for it and undone after
//! it: for fio a bare block device (a loop device over a file on the disk, zram, the VRAM
//! device not enabled as swap); for the jobs the only swap switched on (a swap file, zram, the
//! VRAM device).

use super::report::Record;
use super::{Bench, Kind, GIB, MIB};
use crate::bench::swap_sys::{self as sys, Loop, SwapOn, TempFile, VramSwap, Zram};
use serde_json::json;

/// A device set up for one part, with all it rests on, undone when dropped. Field order is
/// drop order: the VRAM server goes first, then its spill file; swap is switched off before
/// its device goes, a loop device before the file under it.
pub(super) struct Target {
    /// The block devices for fio (empty for a swap target).
    pub devices: Vec<String>,
    pub vram: Option<VramSwap>,
    _spill: TempFile,
    swap: Option<SwapOn>,
    zram: Option<Zram>,
    device: Option<Loop>,
    file: Option<TempFile>,
}

fn empty_target(bench: &Bench) -> Target {
    Target {
        devices: Vec::new(),
        vram: None,
        // Removed after the server is gone (also when it did not start).
        _spill: TempFile(bench.file("spill")),
        swap: None,
        zram: None,
        device: None,
        file: None,
    }
}

/// The device of `kind` for fio: a loop device over a file of fio's area, zram, or the
/// VRAM device (not enabled as swap).
pub(super) fn fio_target(bench: &Bench, record: &mut Record, kind: Kind) -> Result<Target, String> {
    let area = bench.fio_area();
    let mut target = empty_target(bench);
    match kind {
        Kind::Disk => {
            let file = TempFile::allocated(bench.file("fio-disk"), area)?;
            let lp = Loop::attach(&file.0)?;
            record.note(&["fio", "disk", "loop_direct_io"], json!(lp.dio));
            target.devices = vec![lp.device.clone()];
            (target.device, target.file) = (Some(lp), Some(file));
        }
        Kind::Zram => {
            let z = Zram::create(area + 64 * MIB, &bench.setup.dir)?;
            record.note(&["fio", "zram", "algorithm"], json!(z.algorithm));
            target.devices = vec![z.device.clone()];
            target.zram = Some(z);
        }
        Kind::Vram => {
            let v = VramSwap::on(&bench.exe, bench.swap_size(), &bench.file("spill"), false, &bench.setup.swap_args)?;
            target.devices = v.devices.clone();
            target.vram = Some(v);
        }
    }
    Ok(target)
}

/// `kind` switched on as swap, of the jobs' swap size: a swap file on the disk (or, where
/// the file system refuses swap files, a loop device over the file), zram, or the VRAM
/// device.
pub(super) fn swap_target(bench: &Bench, record: &mut Record, kind: Kind) -> Result<Target, String> {
    let size = bench.swap_size();
    let mut target = empty_target(bench);
    match kind {
        Kind::Disk => {
            let dir = &bench.setup.dir;
            if sys::free_bytes(dir) < size + GIB {
                return Err(format!("{} has less than {} GiB free for the swap file", dir.display(), size / GIB + 1));
            }
            let file = TempFile::allocated(bench.file("swapfile"), size)?;
            let path = file.0.display().to_string();
            match SwapOn::enable(&path, 10) {
                Ok(on) => {
                    record.note(&["jobs", "disk_swap"], json!(format!("swap file {path}")));
                    target.swap = Some(on);
                }
                Err(e) => {
                    // File systems that refuse swap files: a loop device over the file.
                    let lp = Loop::attach(&file.0)?;
                    let on = SwapOn::enable(&lp.device, 10)?;
                    record.note(
                        &["jobs", "disk_swap"],
                        json!(format!(
                            "loop device {} (direct I/O {}) over {path}; a swap file was refused: {e}",
                            lp.device, lp.dio
                        )),
                    );
                    (target.swap, target.device) = (Some(on), Some(lp));
                }
            }
            target.file = Some(file);
        }
        Kind::Zram => {
            let z = Zram::create(size, &bench.setup.dir)?;
            record.note(&["jobs", "zram_algorithm"], json!(z.algorithm));
            target.swap = Some(SwapOn::enable(&z.device, 10)?);
            target.zram = Some(z);
        }
        Kind::Vram => {
            let v = VramSwap::on(&bench.exe, size, &bench.file("spill"), true, &bench.setup.swap_args)?;
            record.note(&["jobs", "vram_devices"], json!(v.devices));
            target.vram = Some(v);
        }
    }
    Ok(target)
}
