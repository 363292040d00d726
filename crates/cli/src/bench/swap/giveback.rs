//! The give-back part of `bench swap`: with the VRAM device still full of fio's blocks, its
//! HBM cap forced to 0 (`tiermem swap cap 0 --json`) — the bytes moved out and the seconds it
//! took — and then the random verify pass's blocks checked again, now read from the spill file.

use super::fio_phase::outcome_json;
use super::report::Record;
use super::Bench;
use crate::bench::swap_fio::{self, IoEngine, Job, Verify};
use crate::bench::swap_sys::{self as sys, VramSwap};
use serde_json::json;
use std::path::Path;
use std::time::Duration;

/// The check of the VRAM device's blocks after give-back.
pub(super) const VERIFY_AFTER_GIVEBACK: &str = "fio_verify_vram_after_giveback";

/// Forces the VRAM device's HBM cap to 0 while it holds fio's blocks; then checks the
/// random verify pass's blocks again (now served from the spill file).
pub(super) fn giveback(
    bench: &Bench,
    record: &mut Record,
    fio: &Path,
    engine: IoEngine,
    v: &VramSwap,
    rand_verify: &Job,
    devices: &[String],
) {
    if sys::interrupted() {
        record.check(VERIFY_AFTER_GIVEBACK.into(), None);
        return;
    }
    eprintln!("bench swap: give-back: the VRAM device's HBM cap to 0");
    match v.set_cap(0) {
        Ok((seconds, bytes)) => {
            eprintln!("bench swap:   {:.2} GB moved out in {seconds:.2} s", bytes / 1e9);
            record.note(&["giveback"], json!({"seconds": seconds, "bytes": bytes}));
            record.set("giveback_s", seconds);
            if bytes <= 0.0 {
                record.fail("giveback_GBps", format!("tiermem swap cap 0 moved no bytes (in {seconds} s)"));
            } else {
                record.set("giveback_GBps", bytes / seconds.max(1e-9) / 1e9);
            }
        }
        Err(e) => record.fail("giveback_GBps", e),
    }
    let check = Job { name: "rand4k-verify-after-giveback", verify: Verify::CheckOnly, ..rand_verify.clone() };
    let limit = bench.limit(Duration::from_secs(60) + Duration::from_secs_f64(check.size as f64 / 5e6));
    let errors = match swap_fio::run(fio, engine, &check, devices, limit) {
        Ok(o) => {
            eprintln!("bench swap:   blocks checked after give-back: {} errors", o.errors);
            record.note(&["fio", "vram", check.name], outcome_json(&o));
            Some(o.errors)
        }
        Err(e) => {
            record.fail(VERIFY_AFTER_GIVEBACK, e);
            None
        }
    };
    record.record_verify(VERIFY_AFTER_GIVEBACK, errors);
}
