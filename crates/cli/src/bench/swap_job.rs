//! The swap-bound job of `bench swap` (`tiermem bench swap-job`, hidden): a CPU program whose
//! working set is twice its cgroup's `memory.max`, so that it pages heavily, with a fixed
//! amount of work (its time to completion is the metric) and a check of its own result.
//!
//! An array of `size` bytes of 64-bit words, each first set to a value of its index
//! (`initial`); then `passes × blocks` steps, each picking a block (`block` bytes) at random
//! and updating every word of it in place, `w ← a·w + c` with constants of the step. Random
//! blocks over twice the memory the job may keep: about every other step faults its block in
//! from swap and pushes another out. The check recomputes, independently of the array, the
//! composition of the updates each block received (replaying the steps' choices, nothing
//! else) and compares every word with it: a page lost, zeroed, stale or misplaced by the swap
//! device shows as mismatched words. Its time to completion (`seconds`) counts the fill, the
//! steps and the check (which reads every word back). Prints one JSON line.

use std::path::PathBuf;
use std::time::Instant;

#[derive(clap::Args)]
pub struct JobArgs {
    /// Bytes of the array (the working set).
    #[arg(long, value_parser = tiermem::parse_size)]
    pub size: usize,
    /// Steps, in passes: one pass updates as many blocks as the array has (at random).
    #[arg(long, default_value_t = 1.0)]
    pub passes: f64,
    /// Bytes updated by one step.
    #[arg(long, value_parser = tiermem::parse_size, default_value = "256KiB")]
    pub block: usize,
    /// Seed of the initial values and of the steps.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// A cgroup (v2) folder to move this process into before it allocates anything.
    #[arg(long)]
    pub cgroup: Option<PathBuf>,
}

/// SplitMix64's finaliser: a bijective mix of 64 bits.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The word at `index` before any step.
fn initial(seed: u64, index: usize) -> u64 {
    mix(seed ^ mix(index as u64))
}

/// Step `step`'s block and its update `w ← a·w + c` (`a` odd: the update is a bijection).
fn step_of(seed: u64, step: u64, blocks: usize) -> (usize, u64, u64) {
    let r = mix(seed.wrapping_mul(0xD6E8_FEB8_6659_FD93) ^ step);
    let block = ((u128::from(r) * blocks as u128) >> 64) as usize;
    (block, mix(r) | 1, mix(r ^ 0x5555_5555_5555_5555))
}

/// The job's shape: words per block, blocks, steps.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    pub seed: u64,
    pub words_per_block: usize,
    pub blocks: usize,
    pub steps: u64,
}

impl Shape {
    pub fn new(size: usize, block: usize, passes: f64, seed: u64) -> Result<Self, String> {
        let words_per_block = (block / 8).max(1);
        let blocks = size / 8 / words_per_block;
        if blocks == 0 {
            return Err(format!("swap-job: --size {size} is smaller than one --block of {block} bytes"));
        }
        Ok(Shape { seed, words_per_block, blocks, steps: (passes.max(0.0) * blocks as f64).round() as u64 })
    }

    pub fn words(&self) -> usize {
        self.words_per_block * self.blocks
    }
}

/// Sets every word to its initial value.
pub fn fill(shape: &Shape, data: &mut Vec<u64>) {
    data.clear();
    data.extend((0..shape.words()).map(|i| initial(shape.seed, i)));
}

/// The steps, in place.
pub fn work(shape: &Shape, data: &mut [u64]) {
    for step in 0..shape.steps {
        let (block, a, c) = step_of(shape.seed, step, shape.blocks);
        let start = block * shape.words_per_block;
        for w in &mut data[start..start + shape.words_per_block] {
            *w = w.wrapping_mul(a).wrapping_add(c);
        }
    }
}

/// Words that differ from what the steps must have made of them, found without the array's
/// history: each block's updates composed (`w ↦ A·w + C`) by replaying the steps' choices.
pub fn check(shape: &Shape, data: &[u64]) -> u64 {
    let mut composed = vec![(1u64, 0u64); shape.blocks];
    for step in 0..shape.steps {
        let (block, a, c) = step_of(shape.seed, step, shape.blocks);
        let (ma, mc) = composed[block];
        composed[block] = (a.wrapping_mul(ma), a.wrapping_mul(mc).wrapping_add(c));
    }
    let mut mismatches = 0;
    for (block, &(ma, mc)) in composed.iter().enumerate() {
        let start = block * shape.words_per_block;
        for (i, &w) in data[start..start + shape.words_per_block].iter().enumerate() {
            let expected = ma.wrapping_mul(initial(shape.seed, start + i)).wrapping_add(mc);
            mismatches += u64::from(w != expected);
        }
    }
    mismatches
}

fn rusage() -> (i64, i64) {
    // SAFETY: getrusage fills the struct we pass.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    (usage.ru_majflt, usage.ru_maxrss)
}

pub fn run(args: JobArgs) -> Result<(), String> {
    if let Some(cgroup) = &args.cgroup {
        let procs = cgroup.join("cgroup.procs");
        std::fs::write(&procs, std::process::id().to_string())
            .map_err(|e| format!("swap-job: join the cgroup {}: {e}", procs.display()))?;
    }
    let shape = Shape::new(args.size, args.block, args.passes, args.seed)?;
    let started = Instant::now();
    let mut data = Vec::new();
    data.try_reserve_exact(shape.words()).map_err(|e| format!("swap-job: {e}"))?;
    fill(&shape, &mut data);
    let filled = started.elapsed().as_secs_f64();
    work(&shape, &mut data);
    let worked = started.elapsed().as_secs_f64();
    let mismatches = check(&shape, &data);
    let checksum = data.iter().fold(0u64, |acc, &w| acc.rotate_left(1) ^ w);
    // Time to completion: the check (which reads every word back) is part of the job.
    let seconds = started.elapsed().as_secs_f64();
    let (major_faults, max_rss_kib) = rusage();
    let line = serde_json::json!({
        "bytes": shape.words() * 8,
        "block_bytes": shape.words_per_block * 8,
        "steps": shape.steps,
        "seed": shape.seed,
        "fill_s": filled,
        "work_s": worked - filled,
        "check_s": seconds - worked,
        "seconds": seconds,
        "mismatched_words": mismatches,
        "ok": mismatches == 0,
        "checksum": format!("{checksum:016x}"),
        "major_faults": major_faults,
        "max_rss_kib": max_rss_kib,
    });
    println!("{line}");
    match mismatches {
        0 => Ok(()),
        n => Err(format!("swap-job: {n} words differ from what the steps made of them")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> Shape {
        Shape::new(1 << 20, 4096, 3.0, 7).unwrap()
    }

    #[test]
    fn the_job_checks_out_and_is_deterministic() {
        let shape = small();
        assert_eq!((shape.blocks, shape.steps), (256, 768));
        let mut data = Vec::new();
        fill(&shape, &mut data);
        work(&shape, &mut data);
        assert_eq!(check(&shape, &data), 0);
        let mut again = Vec::new();
        fill(&shape, &mut again);
        work(&shape, &mut again);
        assert_eq!(data, again);
        // The steps did change the words (a check that passes on the initial array would be no check).
        let mut untouched = Vec::new();
        fill(&shape, &mut untouched);
        assert!(check(&shape, &untouched) > 0);
    }

    #[test]
    fn lost_zeroed_stale_and_swapped_pages_are_found() {
        let shape = small();
        let mut data = Vec::new();
        fill(&shape, &mut data);
        let before = data.clone();
        work(&shape, &mut data);
        let page = 512; // words in 4 KiB
        let mut zeroed = data.clone();
        zeroed[3 * page..4 * page].fill(0);
        assert_eq!(check(&shape, &zeroed), page as u64);
        // A page written back as it was before the steps (a stale copy): one the steps changed.
        let changed = (0..shape.blocks).find(|&b| data[b * page] != before[b * page]).unwrap();
        let mut stale = data.clone();
        stale[changed * page..(changed + 1) * page].copy_from_slice(&before[changed * page..(changed + 1) * page]);
        assert_eq!(check(&shape, &stale), page as u64);
        let mut swapped = data.clone();
        swapped.swap(5, 5 + page);
        assert_eq!(check(&shape, &swapped), 2);
        let mut flipped = data;
        flipped[12345] ^= 1 << 40;
        assert_eq!(check(&shape, &flipped), 1);
    }

    #[test]
    fn steps_spread_over_all_blocks() {
        let shape = Shape::new(64 << 20, 256 << 10, 4.0, 1).unwrap();
        let mut hits = vec![0u32; shape.blocks];
        for s in 0..shape.steps {
            hits[step_of(shape.seed, s, shape.blocks).0] += 1;
        }
        assert!(hits.iter().filter(|&&h| h == 0).count() < shape.blocks / 10, "{hits:?}");
    }

    #[test]
    fn sizes_smaller_than_a_block_are_refused() {
        assert!(Shape::new(1000, 4096, 1.0, 1).is_err());
    }
}
