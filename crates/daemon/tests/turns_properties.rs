//! The registry under the default sharing (`hbm_sharing = "auto"`), driven by random sequences
//! of programs and engines coming to two GPUs, reporting, meeting their cuts and leaving while
//! time passes: whatever the sequence, a GPU is in turns exactly while every tenant of it is a
//! program of a job of its own with no tenant on the other GPU, only then is anyone of it
//! waiting or held (and only programs are held), its budgets never add up to more than it
//! has, and while anyone of it waits someone of it has the GPU; and, everyone working on,
//! every program is let go within a few turns for each (none is passed over for ever). The
//! same with explicit `working-sets` (engines and programs in turns together), where a GPU is
//! in turns once two tenants share it.

mod registry_support;

use proptest::prelude::*;
use registry_support::*;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use tiermem_daemon::config::Config;
use tiermem_daemon::registry::{Joining, Outbox, Registry, TenantId};
use tiermem_protocol::{GpuId, Tier};

#[derive(Debug, Clone)]
enum Op {
    /// A program under `tiermem run` of job `job` (none: run without it), or an engine, on GPU
    /// `gpu`, working over `mib`.
    Come {
        program: bool,
        job: Option<u32>,
        gpu: u32,
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
        (any::<bool>(), prop::option::of(0u32..3), 0u32..2, 20u64..700).prop_map(|(program, job, gpu, mib)| Op::Come {
            program,
            job,
            gpu,
            mib
        }),
        (any::<usize>(), 20u64..700).prop_map(|(which, mib)| Op::Report { which, mib }),
        Just(Op::MeetCuts),
        (50u64..1500).prop_map(|ms| Op::Wait { ms }),
        any::<usize>().prop_map(|which| Op::Leave { which }),
    ]
}

/// A tenant still here: whether it is a program, its job (its own process when none), its GPU.
struct Here {
    id: TenantId,
    program: bool,
    job: Result<u32, TenantId>,
    gpu: u32,
    acquires: u64,
    /// Its last reported demand, MiB.
    mib: u64,
}

/// Whether `gpu` should be in turns: shared by two tenants or more, every one a program, each
/// of a job of its own with no tenant on the other GPU.
fn expect_turns(here: &[Here], gpu: u32) -> bool {
    let of_job = |job| here.iter().filter(|h| h.job == job).count();
    let on_gpu: Vec<_> = here.iter().filter(|h| h.gpu == gpu).collect();
    on_gpu.len() >= 2 && on_gpu.iter().all(|h| h.program && of_job(h.job) == 1)
}

/// The rules after each step; `auto`: the default sharing (else explicit `working-sets`, where
/// a GPU shared by two or more is in turns whoever its tenants are).
fn check(r: &Registry, here: &[Here], now: Instant, auto: bool) -> Result<(), TestCaseError> {
    let status = r.status(0, None, now);
    let program = |id: TenantId| here.iter().find(|h| h.id == id).is_some_and(|h| h.program);
    for pool in status.pools.iter().filter(|p| p.tier == Tier::Hbm) {
        let gpu = pool.gpu.expect("a GPU's HBM");
        prop_assert!(pool.budgeted <= pool.capacity, "GPU {gpu}: budgets add up to {} MiB", pool.budgeted / MIB);
        let shared = here.iter().filter(|h| h.gpu == gpu).count() >= 2;
        let expected = if auto { expect_turns(here, gpu) } else { shared };
        prop_assert_eq!(pool.in_turns, expected, "GPU {} in turns", gpu);
        let of_gpu: Vec<_> = status.tenants.iter().filter(|t| t.gpu == gpu).collect();
        for t in &of_gpu {
            prop_assert!(!t.held || (program(t.tenant) && pool.in_turns), "tenant {} held", t.tenant);
            prop_assert!(!t.waiting || pool.in_turns, "tenant {} waits under fair share", t.tenant);
        }
        if of_gpu.iter().any(|t| t.waiting) {
            prop_assert!(of_gpu.iter().any(|t| !t.waiting), "GPU {gpu}: all wait, none has it");
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4096))]
    #[test]
    fn turns_by_default_keep_their_rules_under_any_sequence(ops in prop::collection::vec(op(), 1..40)) {
        run(ops, "")?;
    }

    #[test]
    fn explicit_working_sets_keep_their_rules_under_any_sequence(ops in prop::collection::vec(op(), 1..40)) {
        run(ops, "hbm_sharing = \"working-sets\"\n")?;
    }
}

/// Drives a registry of `sharing` (a line of its config; empty: the default) through `ops`,
/// checking the rules after each, then lets everyone work on.
fn run(ops: Vec<Op>, sharing: &str) -> Result<(), TestCaseError> {
    let text =
        format!("{sharing}turn_ms = 1000\nramp_ms = 300\nidle_after_ms = 0\n[[gpu]]\nindex = 0\nhbm = \"600MiB\"\n");
    let auto = sharing.is_empty();
    let t0 = Instant::now();
    let mut r = Registry::new(Config::parse(&text, "test").unwrap(), t0, 0);
    let (mut now, mut here, mut pending): (Instant, Vec<Here>, Outbox) = (t0, Vec::new(), Vec::new());
    let mut uid = 0;
    for op in ops {
        match op {
            Op::Come { program, job, gpu: index, mib } => {
                uid += 1;
                let job = job.filter(|_| program);
                let gpu = GpuId { index, ..gpu() };
                let joining = Joining { gpu, chunk_bytes: CHUNK, wants: &[], held: &[], waits: program, job };
                let (id, _, outbox) = r.register(who(uid, None), joining, now);
                pending.extend(outbox);
                here.push(Here { id, program, job: job.ok_or(id), gpu: index, acquires: 1, mib });
                acquiring(&mut r, id, 1, now);
                pending.extend(r.usage(id, demand(mib * MIB), now));
            }
            Op::Report { which, mib } if !here.is_empty() => {
                let n = here.len();
                let h = &mut here[which % n];
                (h.acquires, h.mib) = (h.acquires + 1, mib);
                acquiring(&mut r, h.id, h.acquires, now);
                pending.extend(r.usage(h.id, demand(mib * MIB), now));
            }
            Op::MeetCuts => meet_cuts(&mut r, &here, &mut pending, now),
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
        check(&r, &here, now, auto)?;
    }
    // Then everyone works on, reporting and meeting its cuts: every program is let go at
    // least once (none passed over for ever). Within four turns for each and two more —
    // a tenant served a turn and a long wait ahead of the others waits while each of them
    // catches up.
    let mut ran: BTreeMap<TenantId, bool> = here.iter().map(|h| (h.id, false)).collect();
    for _ in 0..16 * (here.len() + 2) {
        now += Duration::from_millis(250);
        for h in &mut here {
            h.acquires += 1;
            acquiring(&mut r, h.id, h.acquires, now);
            pending.extend(r.usage(h.id, demand(h.mib * MIB), now));
        }
        pending.extend(r.expire_deadlines(now).1);
        for _ in 0..4 {
            meet_cuts(&mut r, &here, &mut pending, now);
        }
        check(&r, &here, now, auto)?;
        for t in r.status(0, None, now).tenants.iter().filter(|t| !t.held) {
            ran.insert(t.tenant, true);
        }
    }
    let never: Vec<_> = ran.iter().filter(|(_, &ran)| !ran).map(|(id, _)| *id).collect();
    prop_assert!(never.is_empty(), "held all along: {:?}", never);
    Ok(())
}

/// Every budget sent so far is met (the last sent to each tenant still here).
fn meet_cuts(r: &mut Registry, here: &[Here], pending: &mut Outbox, now: Instant) {
    let mut last: BTreeMap<TenantId, u64> = BTreeMap::new();
    for (id, seq, _, _) in budgets(&std::mem::take(pending)) {
        last.insert(id, seq);
    }
    for (id, seq) in last {
        if here.iter().any(|h| h.id == id) {
            pending.extend(r.budget_met(id, seq, now));
        }
    }
}
