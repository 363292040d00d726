//! `TIERMEM_TRACE=FILE`: a timeline of what transparent mode did, one JSON object a line, for
//! finding where a step's time goes (docs/transparent.md). Each line has `t_ms` (since the
//! trace opened) and `event`:
//! - `opened`, first: the process (`pid`) and the wall-clock time it opened (`unix_s`), so
//!   that the traces of programs sharing a GPU can be laid side by side;
//! - `sync`: the program synchronized (`call`); `pause`: tiermem paused before launch `call`
//!   because the program had not synchronized for a while (migrate.rs);
//! - `plan`: a cycle planned (cycle.rs): the budget in bytes, which chunks were in HBM and their
//!   sizes, each launch's chunks, and the segments (first launch, chunks up, chunks down);
//!   `plan_moves`: the same plan's segments with the chunks each moves, by index;
//! - `allocated`: an allocation tiermem served (`va`, `bytes`, of which on the `host`);
//!   `given_back`: kept frees unmapped for an allocation that did not fit (deferred.rs: `frees`,
//!   the `hbm` they held, the bytes the allocation `need`ed);
//! - `moves`: a segment boundary's or quiesce point's moves (`call`, chunks `up` and `down`
//!   planned and `moved`, `ms` in all, and the time in each phase of remap.rs);
//! - `launch_on_host`: a launch that passed a pointer into a chunk on the host (`launch`, the
//!   launches scanned so far; `kernel`, its name where the driver says it; `host_pointers`);
//! - `diverged`: the cycle being followed stopped matching its recording at `launch` (of
//!   `recorded`), or ended at another count (cycle.rs);
//! - `budget`: the node daemon granted GPU `gpu` a budget of `bytes` (lease.rs); `shed`: tiermem's
//!   own pause sent `down` chunks to the host to meet it, in `ms` (migrate.rs);
//! - `turn`: the daemon told GPU `gpu`'s program to `wait` for its turn, or no longer, and
//!   `turn_waited`: a launch (`call`) waited `ms` for it (turns.rs); `others_wait`: told that
//!   another program waits for its turn's end, or no longer (spares.rs).
//!
//! Off unless asked for; writing a line takes a lock and a write, so it is meant for
//! diagnosis, not for production runs. A trace that cannot be opened is said once, on stderr.

use std::fs::File;
use std::io::{LineWriter, Write};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

use crate::boundary::log;

struct Trace {
    started: Instant,
    out: Mutex<LineWriter<File>>,
}

fn trace() -> Option<&'static Trace> {
    static TRACE: OnceLock<Option<Trace>> = OnceLock::new();
    TRACE
        .get_or_init(|| {
            let path = std::env::var_os("TIERMEM_TRACE").filter(|p| !p.is_empty())?;
            match File::create(&path) {
                Ok(file) => {
                    let mut out = LineWriter::new(file);
                    let unix_s = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0.0, |since| since.as_secs_f64());
                    let pid = std::process::id();
                    let opened = format!(
                        "{{\"t_ms\": 0.000, \"event\": \"opened\", \"pid\": {pid}, \"unix_s\": {unix_s:.3}}}\n"
                    );
                    let _ = out.write_all(opened.as_bytes());
                    Some(Trace { started: Instant::now(), out: Mutex::new(out) })
                }
                Err(e) => {
                    log("TIERMEM_TRACE", &format!("cannot create {}: {e}", path.to_string_lossy()), "no trace");
                    None
                }
            }
        })
        .as_ref()
}

/// Whether a trace is being written.
pub fn on() -> bool {
    trace().is_some()
}

/// Writes one event: `fields` is the JSON object's members after `t_ms` and `event`
/// (`"key": value, …`, or empty).
pub fn event(event: &str, fields: impl FnOnce() -> String) {
    let Some(trace) = trace() else { return };
    let fields = fields();
    let t_ms = trace.started.elapsed().as_secs_f64() * 1e3;
    let sep = if fields.is_empty() { "" } else { ", " };
    let line = format!("{{\"t_ms\": {t_ms:.3}, \"event\": \"{event}\"{sep}{fields}}}\n");
    // A poisoned lock only means another thread panicked mid-write: the file is still usable.
    let mut out = trace.out.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let _ = out.write_all(line.as_bytes());
}

/// `text` as a JSON string (quotes and control characters escaped).
pub fn quoted(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::quoted;

    #[test]
    fn strings_are_escaped_for_json() {
        assert_eq!(quoted("a\"b\\c\n"), "\"a\\\"b\\\\c\\u000a\"");
        let parsed: String = serde_json::from_str(&quoted("k<\t>\"x\"")).unwrap();
        assert_eq!(parsed, "k<\t>\"x\"");
    }
}
