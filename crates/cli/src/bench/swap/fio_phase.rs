//! The fio part of `bench swap`: fio found and its engine probed, then on each device in turn
//! (the disk's loop device, zram, the VRAM device) the jobs of [`fio_jobs`] timed and checked,
//! their numbers turned into the metrics; on the VRAM device under the hung-task watch, and
//! followed by the give-back (`giveback.rs`).

use super::giveback::VERIFY_AFTER_GIVEBACK;
use super::report::Record;
use super::{Bench, Kind, GIB, MIB};
use crate::bench::swap_fio::{self, IoEngine, Job, Verify};
use crate::bench::swap_sys::{self as sys, HungWatch};
use serde_json::{json, Value};
use std::path::Path;
use std::time::Duration;

/// fio on each device in turn (the disk's, zram, the VRAM device with its give-back).
pub(super) fn fio_all(bench: &Bench, record: &mut Record) {
    let found = match &bench.setup.fio {
        Some(given) => given.is_file().then(|| given.clone()).ok_or(format!("--fio {}: no such file", given.display())),
        None => sys::which("fio").ok_or_else(|| "no fio on PATH (and no --fio)".to_string()),
    };
    let fio = match found {
        Ok(f) => f,
        Err(why) => {
            record.fail("fio", format!("{why}: no device measurements"));
            for kind in [Kind::Vram, Kind::Disk, Kind::Zram] {
                record.check(format!("fio_verify_{}", kind.name()), None);
            }
            record.check(VERIFY_AFTER_GIVEBACK.into(), None);
            return;
        }
    };
    let (engine, why) = swap_fio::probe_engine(&fio, &bench.file("probe"));
    eprintln!(
        "bench swap: fio {} with {}{}",
        fio.display(),
        engine.name(),
        why.as_ref().map_or(String::new(), |w| format!(" ({w})"))
    );
    record.note(&["fio", "binary"], json!(fio.display().to_string()));
    record.note(&["fio", "engine"], json!(engine.name()));
    record.note(&["fio", "engine_why"], json!(why));
    record.note(
        &["fio", "queue_depth_32_by"],
        json!(match engine {
            IoEngine::IoUring => "io_uring, iodepth 32",
            IoEngine::Pvsync2 => "pvsync2, 32 threads of one request each (numjobs), each on its own slice",
        }),
    );
    for kind in [Kind::Disk, Kind::Zram, Kind::Vram] {
        if bench.may_begin(record, &format!("fio_{}", kind.name())) {
            fio_device(bench, record, &fio, engine, kind);
        } else {
            fio_checks_not_run(record, kind);
        }
        record.save(bench, true);
    }
}

fn fio_device(bench: &Bench, record: &mut Record, fio: &Path, engine: IoEngine, kind: Kind) {
    let target = match super::targets::fio_target(bench, record, kind) {
        Ok(t) => t,
        Err(e) => {
            record.fail(&format!("fio_{}", kind.name()), format!("setting up the device: {e}"));
            fio_checks_not_run(record, kind);
            return;
        }
    };
    let (devices, area) = (&target.devices, bench.fio_area());
    eprintln!("bench swap: fio on {} ({})", kind.name(), devices.join(", "));
    record.note(&["fio", kind.name(), "devices"], json!(devices));
    let watch = (kind == Kind::Vram).then(HungWatch::start);
    let rand_verify_size = match (engine, bench.setup.quick) {
        (IoEngine::IoUring, false) => 256 * MIB,
        _ => 64 * MIB,
    };
    let (jobs, rand_verify) = fio_jobs(area, if bench.setup.quick { 1000 } else { 3000 }, rand_verify_size);
    let p = kind.prefix();
    let mut verify_errors: Option<u64> = Some(0);
    for job in &jobs {
        if sys::interrupted() {
            verify_errors = None;
            break;
        }
        // Size-based jobs: at least 20 MB/s, or they count as stuck.
        let limit = Duration::from_secs(60) + Duration::from_secs_f64(job.size as f64 / 20e6);
        let limit = bench.limit(job.runtime_ms.map_or(limit, |ms| Duration::from_millis(ms + 60_000)));
        let outcome = swap_fio::run(fio, engine, job, devices, limit);
        let key = format!("{p}{}", job.name);
        match outcome {
            Err(e) => {
                record.fail(&format!("fio_{key}"), e);
                if job.verify != Verify::No {
                    verify_errors = None;
                }
            }
            Ok(o) => {
                eprintln!(
                    "bench swap:   {:<26} read {:>9.0} IOPS {:>6.2} GB/s {:>8.1} µs | write {:>9.0} IOPS {:>6.2} GB/s | errors {}",
                    job.name,
                    o.read.iops,
                    o.read.bw_bytes / 1e9,
                    o.read.lat_mean_us,
                    o.write.iops,
                    o.write.bw_bytes / 1e9,
                    o.errors
                );
                record.note(&["fio", kind.name(), job.name], outcome_json(&o));
                if job.verify != Verify::No {
                    verify_errors = verify_errors.map(|e| e + o.errors);
                } else if o.errors > 0 {
                    record.fail(
                        &format!("fio_{key}"),
                        format!("fio reported {} errors, codes {:?}", o.errors, o.error_codes),
                    );
                    continue;
                }
                fio_metrics(record, p, job.name, &o);
            }
        }
    }
    record.record_verify(&format!("fio_verify_{}", kind.name()), verify_errors);
    if let Some(v) = &target.vram {
        record.note(&["vram_status", "after_fio"], v.status());
        super::giveback::giveback(bench, record, fio, engine, v, &rand_verify, devices);
        record.note(&["vram_status", "after_giveback"], v.status());
    }
    if let Some(w) = watch {
        record.add_hung(w.finish(), "fio_vram");
    }
}

/// The metrics of one job's outcome on the device of prefix `p`.
fn fio_metrics(record: &mut Record, p: &str, job: &str, o: &swap_fio::Outcome) {
    let (r, w) = (&o.read, &o.write);
    let opt = |v: Option<f64>| v.unwrap_or(f64::NAN);
    let mut set = |name: &str, value: f64| record.set(&format!("{p}{name}"), value);
    match job {
        "seq-write" => set("seq_write_GBps", w.bw_bytes / 1e9),
        "seq-read" => set("seq_read_GBps", r.bw_bytes / 1e9),
        "rand4k-read-qd1" => {
            set("rand4k_read_iops_qd1", r.iops);
            set("rand4k_read_lat_us_qd1", r.lat_mean_us);
            set("rand4k_read_lat_us_qd1_p50", opt(r.lat_p50_us));
            set("rand4k_read_lat_us_qd1_p99", opt(r.lat_p99_us));
        }
        "rand4k-read-qd32" => set("rand4k_read_iops_qd32", r.iops),
        "rand4k-write-qd1" => {
            set("rand4k_write_iops_qd1", w.iops);
            set("rand4k_write_lat_us_qd1", w.lat_mean_us);
        }
        "rand4k-write-qd32" => set("rand4k_write_iops_qd32", w.iops),
        "rand32k-read-qd1" => {
            set("rand32k_read_iops_qd1", r.iops);
            set("rand32k_read_lat_us_qd1", r.lat_mean_us);
            set("rand32k_read_lat_us_qd1_p50", opt(r.lat_p50_us));
            set("rand32k_read_lat_us_qd1_p99", opt(r.lat_p99_us));
        }
        "seq-write-verify" => set("seq_write_verify_GBps", w.bw_bytes / 1e9),
        "rand4k-write-verify-qd32" => set("rand4k_write_verify_iops_qd32", w.iops),
        _ => {}
    }
}

/// Records the device's verifications as not run (and the VRAM device's after give-back).
fn fio_checks_not_run(record: &mut Record, kind: Kind) {
    record.check(format!("fio_verify_{}", kind.name()), None);
    if kind == Kind::Vram {
        record.check(VERIFY_AFTER_GIVEBACK.into(), None);
    }
}

/// The fio jobs run on each device, in order, and the random verify pass (the last of them,
/// checked again after give-back). `area`: bytes over all the device's files.
fn fio_jobs(area: u64, runtime_ms: u64, rand_verify_size: u64) -> (Vec<Job>, Job) {
    let timed =
        |name, rw, bs, depth| Job { name, rw, bs, depth, size: area, runtime_ms: Some(runtime_ms), verify: Verify::No };
    let rand_verify = Job {
        name: "rand4k-write-verify-qd32",
        rw: "randwrite",
        bs: 4096,
        depth: 32,
        size: rand_verify_size,
        runtime_ms: None,
        verify: Verify::WriteThenCheck,
    };
    let jobs = vec![
        // Also fills the region, so that every later read finds written blocks.
        Job { name: "seq-write", rw: "write", bs: MIB, depth: 16, size: area, runtime_ms: None, verify: Verify::No },
        timed("seq-read", "read", MIB, 16),
        timed("rand4k-read-qd1", "randread", 4096, 1),
        timed("rand4k-read-qd32", "randread", 4096, 32),
        timed("rand4k-write-qd1", "randwrite", 4096, 1),
        timed("rand4k-write-qd32", "randwrite", 4096, 32),
        timed("rand32k-read-qd1", "randread", 32 << 10, 1),
        Job {
            name: "seq-write-verify",
            rw: "write",
            bs: MIB,
            depth: 16,
            size: area.min(GIB),
            runtime_ms: None,
            verify: Verify::WriteThenCheck,
        },
        rand_verify.clone(),
    ];
    (jobs, rand_verify)
}

/// One fio job's outcome, for the detail.
pub(super) fn outcome_json(o: &swap_fio::Outcome) -> Value {
    let side = |s: &swap_fio::Side| {
        json!({
            "iops": s.iops, "GBps": s.bw_bytes / 1e9, "bytes": s.io_bytes,
            "lat_mean_us": s.lat_mean_us, "lat_p50_us": s.lat_p50_us, "lat_p99_us": s.lat_p99_us,
        })
    };
    json!({"read": side(&o.read), "write": side(&o.write), "errors": o.errors, "error_codes": o.error_codes})
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    /// The jobs as run on each device, over two plain files standing in for two loop devices,
    /// with both engines; then the check after give-back. Skipped without fio (TIERMEM_FIO or
    /// fio on PATH).
    #[test]
    fn the_fio_jobs_run_and_verify_on_plain_files() {
        let Some(fio) = std::env::var_os("TIERMEM_FIO").map(PathBuf::from).or_else(|| sys::which("fio")) else {
            eprintln!("skipped: no fio (set TIERMEM_FIO)");
            return;
        };
        let dir = std::env::var_os("TIERMEM_TEST_FILE_DIR").map_or_else(std::env::temp_dir, Into::into);
        let files: Vec<String> = (0..2)
            .map(|k| dir.join(format!("tiermem-fio-jobs-{}-{k}", std::process::id())).display().to_string())
            .collect();
        for engine in [IoEngine::IoUring, IoEngine::Pvsync2] {
            let (jobs, rand_verify) = fio_jobs(64 * MIB, 200, 8 * MIB);
            for job in jobs.iter().chain([&Job { verify: Verify::CheckOnly, ..rand_verify.clone() }]) {
                let o = swap_fio::run(&fio, engine, job, &files, Duration::from_secs(60))
                    .unwrap_or_else(|e| panic!("{engine:?} {}: {e}", job.name));
                assert_eq!(o.errors, 0, "{engine:?} {}: {o:?}", job.name);
                let moved = if job.rw.contains("read") { o.read.io_bytes } else { o.write.io_bytes };
                assert!(moved > 0.0, "{engine:?} {}: {o:?}", job.name);
                if job.runtime_ms.is_none() && job.verify == Verify::No {
                    assert_eq!(o.write.io_bytes as u64, job.size, "{engine:?} {} writes its region once", job.name);
                }
            }
        }
        for f in &files {
            let _ = std::fs::remove_file(f);
        }
    }
}
