//! The registry under the default sharing (`hbm_sharing = "auto"`), driven by random sequences
//! of programs and engines coming, reporting, meeting their cuts and leaving while time passes:
//! whatever the sequence, the GPU is in turns exactly while every tenant of it is a program of
//! a job of its own, only then is anyone waiting or held (and only programs are held), budgets
//! never add up to more than the GPU, and while anyone waits someone has the GPU.

mod registry_support;

use proptest::prelude::*;
use registry_support::*;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use tiermem_daemon::config::Config;
use tiermem_daemon::registry::{Joining, Outbox, Registry, TenantId};
use tiermem_protocol::TransferCounters;

const CAPACITY: u64 = 600 * MIB;

#[derive(Debug, Clone)]
enum Op {
    /// A program under `tiermem run` of job `job` (none: run without it), or an engine.
    Come {
        program: bool,
        job: Option<u32>,
        mib: u64,
    },
    /// The `which`-th tenant still here (modulo their count) reports a demand.
    Report {
        which: usize,
        mib: u64,
    },
    /// Every budget sent so far is met.
    MeetCuts,
    /// Time passes (turns run out, ramps end).
    Wait {
        ms: u64,
    },
    Leave {
        which: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (any::<bool>(), prop::option::of(0u32..3), 20u64..700).prop_map(|(program, job, mib)| Op::Come {
            program,
            job,
            mib
        }),
        (any::<usize>(), 20u64..700).prop_map(|(which, mib)| Op::Report { which, mib }),
        Just(Op::MeetCuts),
        (50u64..1500).prop_map(|ms| Op::Wait { ms }),
        any::<usize>().prop_map(|which| Op::Leave { which }),
    ]
}

/// A tenant still here: whether it is a program, and its job.
struct Here {
    id: TenantId,
    program: bool,
    job: Option<u32>,
    acquires: u64,
}

/// Whether the GPU should be in turns: every tenant a program, no two of one job.
fn expect_turns(here: &[Here]) -> bool {
    let mut jobs: Vec<u32> = here.iter().filter_map(|h| h.job).collect();
    let count = jobs.len();
    jobs.sort_unstable();
    jobs.dedup();
    here.iter().all(|h| h.program) && jobs.len() == count
}

fn check(r: &Registry, here: &[Here], now: Instant) -> Result<(), TestCaseError> {
    let status = r.status(0, None, now);
    let Some(pool) = status.pools.iter().find(|p| p.gpu == Some(0)) else { return Ok(()) };
    prop_assert!(pool.budgeted <= CAPACITY, "budgets add up to {} MiB", pool.budgeted / MIB);
    prop_assert_eq!(pool.in_turns, expect_turns(here), "in turns, with {} tenants", here.len());
    let program = |id: TenantId| here.iter().find(|h| h.id == id).is_some_and(|h| h.program);
    for t in &status.tenants {
        prop_assert!(!t.held || (program(t.tenant) && pool.in_turns), "tenant {} held", t.tenant);
        prop_assert!(!t.waiting || pool.in_turns, "tenant {} waits under fair share", t.tenant);
    }
    if status.tenants.iter().any(|t| t.waiting) {
        prop_assert!(status.tenants.iter().any(|t| !t.waiting), "all wait, none has the GPU");
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]
    #[test]
    fn turns_by_default_keep_their_rules_under_any_sequence(ops in prop::collection::vec(op(), 1..40)) {
        let text = "turn_ms = 1000\nramp_ms = 300\nidle_after_ms = 0\n[[gpu]]\nindex = 0\nhbm = \"600MiB\"\n";
        let t0 = Instant::now();
        let mut r = Registry::new(Config::parse(text, "test").unwrap(), t0, 0);
        let (mut now, mut here, mut pending): (Instant, Vec<Here>, Outbox) = (t0, Vec::new(), Vec::new());
        let mut uid = 0;
        for op in ops {
            match op {
                Op::Come { program, job, mib } => {
                    uid += 1;
                    let joining = Joining { gpu: gpu(), chunk_bytes: CHUNK, wants: &[], held: &[], waits: program, job };
                    let (id, _, outbox) = r.register(who(uid, None), joining, now);
                    pending.extend(outbox);
                    here.push(Here { id, program, job: job.filter(|_| program), acquires: 1 });
                    r.record_transfers(id, TransferCounters { acquires: 1, largest_acquire_bytes: 20 * MIB, ..Default::default() }, now);
                    pending.extend(r.usage(id, demand(mib * MIB), now));
                }
                Op::Report { which, mib } if !here.is_empty() => {
                    let n = here.len();
                    let h = &mut here[which % n];
                    h.acquires += 1;
                    let counters = TransferCounters { acquires: h.acquires, largest_acquire_bytes: 20 * MIB, ..Default::default() };
                    r.record_transfers(h.id, counters, now);
                    pending.extend(r.usage(h.id, demand(mib * MIB), now));
                }
                Op::MeetCuts => {
                    let mut last: BTreeMap<TenantId, u64> = BTreeMap::new();
                    for (id, seq, _, _) in budgets(&std::mem::take(&mut pending)) {
                        last.insert(id, seq);
                    }
                    for (id, seq) in last {
                        if here.iter().any(|h| h.id == id) {
                            pending.extend(r.budget_met(id, seq, now));
                        }
                    }
                }
                Op::Wait { ms } => {
                    now += Duration::from_millis(ms);
                    pending.extend(r.expire_deadlines(now).1);
                }
                Op::Leave { which } if !here.is_empty() => {
                    let h = here.remove(which % here.len());
                    pending.extend(r.disconnect(h.id, now));
                }
                _ => {}
            }
            check(&r, &here, now)?;
        }
    }
}
