//! The operations of the property model (property_model.rs) and how proptest draws them.

use super::support::CHUNK;
use super::{HBM_CHUNKS, PEER_CHUNKS};
use proptest::prelude::*;

#[derive(Debug, Clone)]
pub enum Op {
    Alloc {
        quarters: usize,
        extra: usize,
        read_only: bool,
        priority: i32,
    },
    Write {
        buf: usize,
        at: usize,
        len: usize,
        seed: u64,
    },
    KernelWrite {
        buf: usize,
        at: usize,
        len: usize,
        seed: u64,
    },
    KernelRead {
        buf: usize,
        at: usize,
        len: usize,
    },
    Check {
        buf: usize,
    },
    Hold {
        buf: usize,
        at: usize,
        len: usize,
        write: bool,
    },
    Unhold {
        index: usize,
    },
    Prefetch {
        buf: usize,
    },
    PageOut {
        buf: Option<usize>,
    },
    PageOutStart {
        buf: usize,
    },
    Finish,
    PageIn {
        buf: usize,
    },
    Exchange {
        out: usize,
        inn: usize,
    },
    PageOutToFile {
        buf: usize,
    },
    Free {
        buf: usize,
    },
    Discard {
        buf: usize,
    },
    /// A schedule of the live buffers, rotated by `rotate`, one or two per step (or none: cleared).
    Schedule {
        rotate: usize,
        pairs: bool,
        clear: bool,
    },
    Advance {
        step: usize,
        chunks: usize,
    },
    /// The HBM budget becomes `chunks` chunks (also while chunks are held).
    SetBudget {
        chunks: usize,
    },
    /// Neighbour GPU `gpu` lends `chunks` chunks to the peer tier (where there is one).
    SetPeerLending {
        gpu: usize,
        chunks: usize,
    },
}

pub fn op() -> impl Strategy<Value = Op> {
    let span = (any::<usize>(), any::<usize>(), 1usize..(3 * CHUNK / 2));
    prop_oneof![
        2 => (1usize..=20, 0usize..4096, prop::bool::weighted(0.2), -2i32..3)
            .prop_map(|(quarters, extra, read_only, priority)| Op::Alloc { quarters, extra, read_only, priority }),
        4 => (span.clone(), any::<u64>()).prop_map(|((buf, at, len), seed)| Op::Write { buf, at, len, seed }),
        3 => (span.clone(), any::<u64>()).prop_map(|((buf, at, len), seed)| Op::KernelWrite { buf, at, len, seed }),
        3 => span.clone().prop_map(|(buf, at, len)| Op::KernelRead { buf, at, len }),
        2 => any::<usize>().prop_map(|buf| Op::Check { buf }),
        2 => (span, any::<bool>()).prop_map(|((buf, at, len), write)| Op::Hold { buf, at, len, write }),
        2 => any::<usize>().prop_map(|index| Op::Unhold { index }),
        2 => any::<usize>().prop_map(|buf| Op::Prefetch { buf }),
        2 => prop::option::weighted(0.8, any::<usize>()).prop_map(|buf| Op::PageOut { buf }),
        1 => any::<usize>().prop_map(|buf| Op::PageOutStart { buf }),
        1 => Just(Op::Finish),
        2 => any::<usize>().prop_map(|buf| Op::PageIn { buf }),
        1 => (any::<usize>(), any::<usize>()).prop_map(|(out, inn)| Op::Exchange { out, inn }),
        1 => any::<usize>().prop_map(|buf| Op::PageOutToFile { buf }),
        1 => any::<usize>().prop_map(|buf| Op::Free { buf }),
        1 => any::<usize>().prop_map(|buf| Op::Discard { buf }),
        1 => (any::<usize>(), any::<bool>(), prop::bool::weighted(0.2))
            .prop_map(|(rotate, pairs, clear)| Op::Schedule { rotate, pairs, clear }),
        3 => (any::<usize>(), 0usize..6).prop_map(|(step, chunks)| Op::Advance { step, chunks }),
        1 => (1usize..=HBM_CHUNKS).prop_map(|chunks| Op::SetBudget { chunks }),
        1 => (1usize..=2, 0usize..=PEER_CHUNKS).prop_map(|(gpu, chunks)| Op::SetPeerLending { gpu, chunks }),
    ]
}
