//! fio for `bench swap`: the jobs run on each block device, and what is read from fio's JSON
//! (`--output-format=json`).
//!
//! The queue depth comes from io_uring where fio's own io_uring engine works (it needs no
//! liburing); where io_uring is refused (a seccomp profile, `kernel.io_uring_disabled`),
//! from `pvsync2` with one thread per request in flight (`numjobs`, each on a slice of the
//! device), which the report says.

use super::swap_sys::{run_interruptible, Output};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoEngine {
    IoUring,
    Pvsync2,
}

impl IoEngine {
    pub fn name(self) -> &'static str {
        match self {
            IoEngine::IoUring => "io_uring",
            IoEngine::Pvsync2 => "pvsync2",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verify {
    /// A measurement: no checksums.
    No,
    /// Write the region with crc32c headers, then read it back and check every block.
    WriteThenCheck,
    /// Only read and check what a `WriteThenCheck` of the same job wrote earlier.
    CheckOnly,
}

/// One fio job over the devices (its size is spread over all of them).
#[derive(Clone, Debug)]
pub struct Job {
    pub name: &'static str,
    /// fio's `rw`: read, write, randread, randwrite.
    pub rw: &'static str,
    pub bs: u64,
    /// Requests in flight.
    pub depth: u32,
    /// Bytes of the region, over all devices.
    pub size: u64,
    /// Time-based for this long; else the region once.
    pub runtime_ms: Option<u64>,
    pub verify: Verify,
}

/// fio's command line for `job` on `files`.
pub fn args(engine: IoEngine, job: &Job, files: &[String]) -> Vec<String> {
    let nfiles = files.len().max(1) as u64;
    let mut a: Vec<String> = vec![
        format!("--name={}", job.name),
        format!("--filename={}", files.join(":")),
        format!("--ioengine={}", engine.name()),
        "--direct=1".into(),
        format!("--rw={}", job.rw),
        format!("--bs={}", job.bs),
        "--group_reporting".into(),
        "--output-format=json".into(),
        "--eta=never".into(),
        "--lat_percentiles=1".into(),
        "--percentile_list=50:99:99.9".into(),
    ];
    // pvsync2 has one request in flight per thread: `depth` threads, each on its own slice.
    let clones = if engine == IoEngine::Pvsync2 && job.verify == Verify::No { u64::from(job.depth.max(1)) } else { 1 };
    if clones > 1 {
        let per_file = (job.size / clones / nfiles / job.bs).max(1) * job.bs;
        a.push(format!("--numjobs={clones}"));
        a.push(format!("--size={}", per_file * nfiles));
        a.push(format!("--offset_increment={per_file}"));
    } else {
        let per_file = (job.size / nfiles / job.bs).max(1) * job.bs;
        a.push(format!("--size={}", per_file * nfiles));
    }
    if engine == IoEngine::IoUring {
        a.push(format!("--iodepth={}", job.depth.max(1)));
    }
    if let Some(ms) = job.runtime_ms {
        a.push("--time_based".into());
        a.push(format!("--runtime={ms}ms"));
        if job.rw.starts_with("rand") {
            a.push("--norandommap".into());
            a.push("--randrepeat=0".into());
        }
    }
    match job.verify {
        Verify::No => {}
        Verify::WriteThenCheck | Verify::CheckOnly => {
            a.extend(
                // No verify-state files left in the working directory.
                [
                    "--verify=crc32c",
                    "--do_verify=1",
                    "--verify_fatal=0",
                    "--continue_on_error=verify",
                    "--verify_state_save=0",
                ]
                .map(String::from),
            );
            if job.verify == Verify::CheckOnly {
                a.push("--verify_only=1".into());
            }
        }
    }
    a
}

/// One direction's results (fio's `read` or `write` of the job, clones summed).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Side {
    pub iops: f64,
    pub bw_bytes: f64,
    pub io_bytes: f64,
    /// Submission to completion, microseconds.
    pub lat_mean_us: f64,
    pub lat_p50_us: Option<f64>,
    pub lat_p99_us: Option<f64>,
}

/// What a fio run reported.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Outcome {
    pub read: Side,
    pub write: Side,
    /// Failed checks and failed requests (`total_err`, or 1 for a job that ended in an error).
    pub errors: u64,
    /// fio's error codes of the jobs that ended in one (84 = EILSEQ: a block failed its check).
    pub error_codes: Vec<i64>,
}

fn side(v: &serde_json::Value) -> Side {
    let f = |v: &serde_json::Value| v.as_f64();
    // `lat_ns` (submission to completion) has percentiles with --lat_percentiles; else `clat_ns`.
    let lat = &v["lat_ns"];
    let percentiles = if lat["percentile"].is_object() { &lat["percentile"] } else { &v["clat_ns"]["percentile"] };
    Side {
        iops: f(&v["iops"]).unwrap_or(0.0),
        bw_bytes: f(&v["bw_bytes"]).unwrap_or(0.0),
        io_bytes: f(&v["io_bytes"]).unwrap_or(0.0),
        lat_mean_us: f(&lat["mean"]).unwrap_or(0.0) / 1e3,
        lat_p50_us: f(&percentiles["50.000000"]).map(|ns| ns / 1e3),
        lat_p99_us: f(&percentiles["99.000000"]).map(|ns| ns / 1e3),
    }
}

/// Reads fio's JSON output (whatever fio printed before it is skipped).
pub fn parse(text: &str) -> Result<Outcome, String> {
    let start = text
        .match_indices('{')
        .map(|(i, _)| i)
        .find(|&i| i == 0 || text[..i].ends_with('\n'))
        .ok_or("no JSON in fio's output")?;
    let value: serde_json::Value = serde_json::Deserializer::from_str(&text[start..])
        .into_iter()
        .next()
        .ok_or("no JSON in fio's output")?
        .map_err(|e| format!("fio's JSON: {e}"))?;
    let jobs = value["jobs"].as_array().filter(|j| !j.is_empty()).ok_or("fio's JSON has no jobs")?;
    let mut outcome = Outcome::default();
    let mut lat_weight = [0.0f64; 2];
    for job in jobs {
        let error = job["error"].as_i64().unwrap_or(0);
        let total = job["total_err"].as_u64().unwrap_or(0);
        outcome.errors += if error != 0 { total.max(1) } else { total };
        if error != 0 {
            outcome.error_codes.push(error);
        }
        // With --group_reporting there is one entry; if not, sum the clones.
        for (k, (into, key)) in [(&mut outcome.read, "read"), (&mut outcome.write, "write")].into_iter().enumerate() {
            let s = side(&job[key]);
            let n = s.iops;
            if n > 0.0 {
                into.lat_mean_us = (into.lat_mean_us * lat_weight[k] + s.lat_mean_us * n) / (lat_weight[k] + n);
                lat_weight[k] += n;
            }
            into.iops += s.iops;
            into.bw_bytes += s.bw_bytes;
            into.io_bytes += s.io_bytes;
            into.lat_p50_us = into.lat_p50_us.or(s.lat_p50_us);
            into.lat_p99_us = into.lat_p99_us.or(s.lat_p99_us);
        }
    }
    Ok(outcome)
}

/// Runs one job; fio's own failures and failed checks come back in the outcome where fio
/// still reported, an error otherwise.
pub fn run(fio: &Path, engine: IoEngine, job: &Job, files: &[String], limit: Duration) -> Result<Outcome, String> {
    let out: Output = run_interruptible(Command::new(fio).args(args(engine, job, files)), limit)
        .map_err(|e| format!("fio {}: {e}", job.name))?;
    match parse(&out.stdout) {
        Ok(outcome) if out.ok || outcome.errors > 0 => Ok(outcome),
        Ok(_) => Err(format!("fio {} failed: {}", job.name, out.tail())),
        Err(e) => Err(format!("fio {}: {e}: {}", job.name, out.tail())),
    }
}

/// io_uring if fio's io_uring engine works on `file` (a file on the disk to be measured),
/// else pvsync2 and why.
pub fn probe_engine(fio: &Path, file: &Path) -> (IoEngine, Option<String>) {
    let job =
        Job { name: "probe", rw: "randread", bs: 4096, depth: 4, size: 4 << 20, runtime_ms: None, verify: Verify::No };
    let files = [file.display().to_string()];
    let outcome = run(fio, IoEngine::IoUring, &job, &files, Duration::from_secs(30));
    let _ = std::fs::remove_file(file);
    match outcome {
        Ok(o) if o.errors == 0 && o.read.iops > 0.0 => (IoEngine::IoUring, None),
        Ok(o) => (IoEngine::Pvsync2, Some(format!("io_uring: fio reported errors {:?}", o.error_codes))),
        Err(e) => (IoEngine::Pvsync2, Some(format!("io_uring unusable: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RANDREAD_QD1: &str = include_str!("testdata/fio-randread-qd1.json");
    const VERIFY_ERRORS: &str = include_str!("testdata/fio-verify-errors.json");
    const PVSYNC2_CLONES: &str = include_str!("testdata/fio-pvsync2-numjobs.json");

    fn job(rw: &'static str, depth: u32, verify: Verify) -> Job {
        Job { name: "t", rw, bs: 4096, depth, size: 1 << 30, runtime_ms: Some(2000), verify }
    }

    #[test]
    fn a_latency_run_gives_iops_and_percentiles() {
        let o = parse(RANDREAD_QD1).unwrap();
        assert_eq!(o.errors, 0);
        assert!(o.read.iops > 0.0, "{o:?}");
        assert!(o.read.lat_mean_us > 0.0);
        let (p50, p99) = (o.read.lat_p50_us.unwrap(), o.read.lat_p99_us.unwrap());
        assert!(p50 > 0.0 && p50 <= p99, "{o:?}");
        assert_eq!(o.write.iops, 0.0);
        assert!((o.read.bw_bytes / o.read.iops - 4096.0).abs() < 64.0, "4 KiB requests: {o:?}");
    }

    #[test]
    fn verify_failures_are_counted() {
        // Three blocks overwritten with garbage after fio wrote them, then --verify_only.
        let o = parse(VERIFY_ERRORS).unwrap();
        assert_eq!(o.errors, 3);
        assert_eq!(o.error_codes, vec![84]);
    }

    #[test]
    fn clones_reported_together_are_one_job() {
        let o = parse(PVSYNC2_CLONES).unwrap();
        assert_eq!(o.errors, 0);
        assert!(o.write.iops > 0.0 && o.read.iops == 0.0, "{o:?}");
    }

    #[test]
    fn text_before_the_json_and_no_json_at_all() {
        let noisy = format!("fio: note: both iodepth >= 1 and synchronous I/O engine are selected\n{RANDREAD_QD1}");
        assert_eq!(parse(&noisy).unwrap(), parse(RANDREAD_QD1).unwrap());
        assert!(parse("fio: failed to open /dev/loop9\n").is_err());
        assert!(parse("{\"jobs\": []}").is_err());
    }

    #[test]
    fn command_lines() {
        let files = ["/dev/loop3".to_string(), "/dev/loop4".to_string()];
        let a = args(IoEngine::IoUring, &job("randread", 32, Verify::No), &files);
        assert!(a.contains(&"--filename=/dev/loop3:/dev/loop4".to_string()));
        assert!(a.contains(&"--iodepth=32".to_string()) && a.contains(&"--norandommap".to_string()));
        assert!(a.contains(&"--runtime=2000ms".to_string()) && !a.iter().any(|x| x.starts_with("--numjobs")));
        let p = args(IoEngine::Pvsync2, &job("randread", 32, Verify::No), &files);
        assert!(p.contains(&"--numjobs=32".to_string()) && !p.iter().any(|x| x.starts_with("--iodepth")));
        // 1 GiB over 32 threads and 2 devices: 16 MiB slices.
        assert!(p.contains(&format!("--offset_increment={}", 16 << 20)), "{p:?}");
        let v = args(IoEngine::Pvsync2, &job("randwrite", 32, Verify::WriteThenCheck), &files);
        assert!(v.contains(&"--verify=crc32c".to_string()) && !v.iter().any(|x| x.starts_with("--numjobs")));
        let c = args(IoEngine::IoUring, &job("randwrite", 32, Verify::CheckOnly), &files);
        assert!(c.contains(&"--verify_only=1".to_string()));
    }

    /// Runs the fio that `bench swap` would use (TIERMEM_FIO, else fio on PATH) against a plain
    /// file; skipped where there is none.
    #[test]
    fn fio_runs_against_a_plain_file() {
        let Some(fio) = std::env::var_os("TIERMEM_FIO")
            .map(std::path::PathBuf::from)
            .or_else(|| super::super::swap_sys::which("fio"))
        else {
            eprintln!("skipped: no fio (set TIERMEM_FIO)");
            return;
        };
        let dir = std::env::var_os("TIERMEM_TEST_FILE_DIR").map_or_else(std::env::temp_dir, Into::into);
        let file = dir.join(format!("tiermem-fio-test-{}", std::process::id()));
        let (engine, why) = probe_engine(&fio, &file);
        eprintln!("engine {engine:?} {why:?}");
        let files = [file.display().to_string()];
        let mut write = job("randwrite", 8, Verify::WriteThenCheck);
        (write.size, write.runtime_ms) = (16 << 20, None);
        let written = run(&fio, engine, &write, &files, Duration::from_secs(60)).unwrap();
        assert_eq!(written.errors, 0, "{written:?}");
        let check =
            run(&fio, engine, &Job { verify: Verify::CheckOnly, ..write.clone() }, &files, Duration::from_secs(60));
        assert_eq!(check.unwrap().errors, 0);
        let mut read = job("randread", 4, Verify::No);
        (read.size, read.runtime_ms) = (16 << 20, Some(300));
        let r = run(&fio, engine, &read, &files, Duration::from_secs(60)).unwrap();
        assert!(r.read.iops > 0.0 && r.read.lat_p99_us.is_some(), "{r:?}");
        // The fallback for machines that refuse io_uring: 4 threads of one request each.
        let p = run(&fio, IoEngine::Pvsync2, &read, &files, Duration::from_secs(60)).unwrap();
        assert!(p.read.iops > 0.0 && p.errors == 0, "{p:?}");
        let _ = std::fs::remove_file(&file);
    }
}
