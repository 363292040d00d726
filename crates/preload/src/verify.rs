//! `TIERMEM_VERIFY_MOVES=on`: every move's bytes checked, for finding where a byte was lost
//! (docs/transparent.md, "When results differ"). Off by default: it reads each moved chunk
//! twice more through host memory, several times the move's own cost.
//!
//! A move copies a chunk into its new physical chunk (through the new chunk's shadow mapping),
//! then maps the new chunk at the chunk's address (remap.rs). Two checks bracket the remap:
//!
//! 1. **Copied**: once the round's copies are complete, the bytes at the chunk's address (the
//!    old chunk, still mapped there) must equal the new chunk's (its shadow). A copy that lost a
//!    byte, or work that wrote to the chunk while it was being copied — which the gate and the
//!    idle context should make impossible — shows here, and the move is not made: the old chunk
//!    stays, its bytes the program's.
//! 2. **Remapped**: after the remap the address shows the new chunk, so it must read as the
//!    shadow does; a mapping that went wrong is undone (the old chunk mapped back).
//!
//! Each difference is said on stderr with the chunk's address and the first differing offset,
//! and counted in `--stats`. A read that fails counts as a difference: what cannot be checked is
//! not made.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::OnceLock;

use tiermem_mechanism::Device;

use crate::boundary::log;
use crate::remap::Move;

static CHECKED: AtomicU64 = AtomicU64::new(0);
static DIFFERED: AtomicU64 = AtomicU64::new(0);

/// Whether moves are checked (`TIERMEM_VERIFY_MOVES`, read once).
pub fn on() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| crate::boundary::switch("TIERMEM_VERIFY_MOVES", false))
}

/// The indices of the moves still `ok` whose chunk address does not read as their new chunk's
/// shadow; `when` names the check in what is said ("copied", "remapped").
pub fn differing(call: &str, device: &dyn Device, moves: &[Move], ok: &[bool], when: &str) -> Vec<usize> {
    let (mut at_address, mut at_shadow) = (Vec::new(), Vec::new());
    let mut differing = Vec::new();
    for (i, m) in moves.iter().enumerate().filter(|&(i, _)| ok[i]) {
        at_address.resize(m.len, 0);
        at_shadow.resize(m.len, 0);
        CHECKED.fetch_add(1, Relaxed);
        let read = device.read(m.address, &mut at_address).and_then(|()| device.read(m.shadow, &mut at_shadow));
        let first = match read {
            Err(why) => Some(format!("could not be read ({why})")),
            Ok(()) => at_address
                .iter()
                .zip(&at_shadow)
                .position(|(a, b)| a != b)
                .map(|offset| format!("differs from its new chunk at +{offset}")),
        };
        if let Some(what) = first {
            DIFFERED.fetch_add(1, Relaxed);
            log(
                call,
                &format!(
                    "move check ({when}): chunk 0x{:x} ({} bytes, going {}) {what}",
                    m.address,
                    m.len,
                    direction(m)
                ),
                "the move is undone, the chunk's bytes stay where they were; please report it",
            );
            differing.push(i);
        }
    }
    differing
}

fn direction(m: &Move) -> &'static str {
    if m.up {
        "up"
    } else {
        "down"
    }
}

/// The `--stats` line, when moves were checked.
pub fn report() -> Option<String> {
    let (checked, differed) = (CHECKED.load(Relaxed), DIFFERED.load(Relaxed));
    on().then(|| format!("tiermem: stats: moves checked (TIERMEM_VERIFY_MOVES): {checked} checks, {differed} differed"))
}
