//! The fallback I/O path: a small pool of threads doing blocking `pread`/`pwrite` on the
//! `O_DIRECT` file descriptor, one slot per job, computing each slot's crc32c where the bytes
//! are (so checksums are computed in parallel too). Calls from several threads share the
//! pool and run concurrently.

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;

use super::align::{errno, Alignment};
use super::io::{crc_of, next, transient, Dir, Next, Op, Outcome, RETRIES};

struct Job {
    dir: Dir,
    fd: RawFd,
    al: Alignment,
    index: usize,
    op: Op,
    /// Set by the first job of a call that fails: the call's later jobs are not started.
    abort: Arc<AtomicBool>,
    reply: mpsc::Sender<(usize, Outcome)>,
}

// SAFETY: the only non-Send field is the raw buffer pointer in `op`. `run`'s caller guarantees
// the buffer stays valid and untouched by others until `run` returns, and `run` does not
// return before every job it sent has replied or been dropped unstarted.
unsafe impl Send for Job {}

pub(super) struct Pool {
    tx: Option<mpsc::Sender<Job>>,
    workers: Vec<JoinHandle<()>>,
    fd: RawFd,
    al: Alignment,
}

impl Pool {
    /// Starts `threads` workers on `fd`, which must stay open until the pool is dropped.
    pub fn new(fd: RawFd, al: Alignment, threads: usize) -> std::io::Result<Self> {
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        let mut pool = Pool { tx: Some(tx), workers: Vec::new(), fd, al };
        for i in 0..threads.max(1) {
            let rx = Arc::clone(&rx);
            let handle = std::thread::Builder::new().name(format!("tiermem-fs-io-{i}")).spawn(move || worker(&rx))?;
            pool.workers.push(handle);
        }
        Ok(pool)
    }

    /// Runs every op and returns their outcomes, in order, once no job touches a buffer.
    ///
    /// # Safety
    /// Each op's buffer must be valid for `len` bytes (readable for writes, writable for
    /// reads) and not be accessed by anyone else until this returns.
    pub unsafe fn run(&self, dir: Dir, ops: &[Op]) -> Vec<Outcome> {
        let gone =
            Outcome::Errno { call: "file store I/O thread (exited)", errno: libc::EIO, done: 0, injected: false };
        let mut outcomes = vec![gone; ops.len()];
        let Some(tx) = &self.tx else {
            return outcomes;
        };
        let (reply, replies) = mpsc::channel();
        let abort = Arc::new(AtomicBool::new(false));
        let mut sent = 0;
        for (index, op) in ops.iter().enumerate() {
            let job =
                Job { dir, fd: self.fd, al: self.al, index, op: *op, abort: Arc::clone(&abort), reply: reply.clone() };
            if tx.send(job).is_err() {
                break; // every worker is gone; the job came back and was dropped unstarted
            }
            sent += 1;
        }
        drop(reply);
        for _ in 0..sent {
            match replies.recv() {
                Ok((i, outcome)) => outcomes[i] = outcome,
                // Every remaining job was dropped without running (its worker died before
                // taking it, or all workers are gone): none touches a buffer any more.
                Err(_) => break,
            }
        }
        outcomes
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.tx = None; // workers see the channel close and exit
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

fn worker(rx: &Mutex<mpsc::Receiver<Job>>) {
    loop {
        let job = {
            let rx = rx.lock().unwrap_or_else(|e| e.into_inner());
            rx.recv()
        };
        let Ok(job) = job else { return };
        let outcome = if job.abort.load(Ordering::Acquire) {
            Outcome::NotAttempted
        } else {
            // SAFETY: `Pool::run`'s caller guarantees the buffer, and `run` waits for this reply.
            unsafe { transfer(&job) }
        };
        if outcome.failed() {
            job.abort.store(true, Ordering::Release);
        }
        let _ = job.reply.send((job.index, outcome));
    }
}

/// One slot, with short transfers resumed and transient errors retried.
///
/// # Safety
/// As [`Pool::run`].
unsafe fn transfer(job: &Job) -> Outcome {
    let op = &job.op;
    let call = match job.dir {
        Dir::Read => "pread",
        Dir::Write => "pwrite",
    };
    let mut done = 0usize;
    let mut retries = 0;
    loop {
        // SAFETY: `done < op.len`, so the pointer stays inside the caller's buffer.
        let p = unsafe { op.buf.add(done) };
        let len = op.len - done;
        let off = (op.offset + done as u64) as libc::off_t;
        let r = match job.dir {
            // SAFETY: `p..p+len` is writable caller memory nobody else touches (see `run`).
            Dir::Read => unsafe { libc::pread(job.fd, p.cast(), len, off) },
            // SAFETY: `p..p+len` is readable caller memory nobody writes (see `run`).
            Dir::Write => unsafe { libc::pwrite(job.fd, p.cast_const().cast(), len, off) },
        };
        if r < 0 {
            let e = errno();
            if transient(e) && retries < RETRIES {
                retries += 1;
                continue;
            }
            return Outcome::Errno { call, errno: e, done, injected: false };
        }
        let n = r as usize;
        done += n;
        match next(op, job.al, n, done) {
            // SAFETY: the transfer is over; the buffer is valid and ours until `run` returns.
            Next::Complete => return Outcome::Done(unsafe { crc_of(op) }),
            Next::Short => return Outcome::Short { done },
            Next::Resubmit => {}
        }
    }
}
