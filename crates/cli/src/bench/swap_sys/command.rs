//! Commands that `bench swap` runs (swapon, losetup, modprobe, fio, `tiermem swap …`), each
//! with a time limit, their output kept in files rather than pipes; and finding a program.

use super::{interrupted, PREFIX};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// What a finished command said.
#[derive(Debug)]
pub struct Output {
    pub ok: bool,
    pub stdout: String,
    pub stderr: String,
}

impl Output {
    /// The last lines of stderr (else stdout), for a failure's reason.
    pub fn tail(&self) -> String {
        let text = if self.stderr.trim().is_empty() { &self.stdout } else { &self.stderr };
        let lines: Vec<&str> = text.trim().lines().collect();
        lines[lines.len().saturating_sub(4)..].join(" | ")
    }
}

/// Runs `program` with `args`, killed after `limit`. Its output goes to
/// files, not pipes, so that a server it leaves running cannot hold us on a pipe.
pub fn run_for(program: &str, args: &[&str], limit: Duration) -> Result<Output, String> {
    run_command(Command::new(program).args(args), limit).map_err(|e| format!("{program} {}: {e}", args.join(" ")))
}

/// [`run_for`] of a prepared command. A signal to us does not stop it (undoing a setup must
/// finish); only `limit` does.
pub fn run_command(command: &mut Command, limit: Duration) -> Result<Output, String> {
    run_inner(command, limit, false)
}

/// [`run_command`] that a signal to us also stops (a measurement).
pub fn run_interruptible(command: &mut Command, limit: Duration) -> Result<Output, String> {
    run_inner(command, limit, true)
}

fn run_inner(command: &mut Command, limit: Duration, interruptible: bool) -> Result<Output, String> {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let base = std::env::temp_dir().join(format!("{PREFIX}out-{}-{n}", std::process::id()));
    let (out_path, err_path) = (base.with_extension("stdout"), base.with_extension("stderr"));
    let open = |p: &Path| File::create(p).map_err(|e| format!("create {}: {e}", p.display()));
    let (out, err) = (open(&out_path)?, open(&err_path)?);
    let result = (|| {
        let mut child =
            command.stdin(Stdio::null()).stdout(out).stderr(err).spawn().map_err(|e| format!("cannot start: {e}"))?;
        let started = Instant::now();
        loop {
            match child.try_wait() {
                Ok(Some(status)) => return Ok(status.success()),
                Ok(None) if started.elapsed() > limit || (interruptible && interrupted()) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    let why = if started.elapsed() > limit { "timed out" } else { "interrupted" };
                    return Err(format!("{why} after {:.0} s", started.elapsed().as_secs_f64()));
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(10)),
                Err(e) => return Err(format!("wait: {e}")),
            }
        }
    })();
    let read = |p: &Path| String::from_utf8_lossy(&std::fs::read(p).unwrap_or_default()).into_owned();
    let output = result.map(|ok| Output { ok, stdout: read(&out_path), stderr: read(&err_path) });
    let _ = std::fs::remove_file(&out_path);
    let _ = std::fs::remove_file(&err_path);
    output
}

/// Runs a command that must succeed: its stdout, or why not.
pub fn must(program: &str, args: &[&str], limit: Duration) -> Result<String, String> {
    let out = run_for(program, args, limit)?;
    if out.ok {
        Ok(out.stdout)
    } else {
        Err(format!("{program} {} failed: {}", args.join(" "), out.tail()))
    }
}

/// Whether `program` can be found on PATH (or is a path to a file).
pub fn which(program: &str) -> Option<PathBuf> {
    if program.contains('/') {
        return Path::new(program).is_file().then(|| PathBuf::from(program));
    }
    std::env::split_paths(&std::env::var_os("PATH")?).map(|d| d.join(program)).find(|p| p.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_time_out_and_report_their_output() {
        let out = run_for("sh", &["-c", "echo out; echo err >&2; exit 3"], Duration::from_secs(10)).unwrap();
        assert!(!out.ok);
        assert_eq!(out.stdout.trim(), "out");
        assert_eq!(out.tail(), "err");
        let slow = run_for("sleep", &["5"], Duration::from_millis(100));
        assert!(slow.unwrap_err().contains("timed out"));
        assert!(run_for("/nonexistent/program", &[], Duration::from_secs(1)).is_err());
    }
}
