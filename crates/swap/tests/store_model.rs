//! Random sequences of reads, writes and discards at sector and page granularity, spanning
//! areas, against a reference `Vec<u8>`, with an HBM budget of a few chunks so that areas
//! spill through the host staging tier to the file, and grants that shrink and restore the
//! budget in the middle of the sequence. Every read is compared byte for byte, the whole
//! device at the end, and the present bytes and live areas against the model.

mod support;

use proptest::prelude::*;
use support::{assert_device_holds, config, open, pattern, Model, CHUNK};
use tiermem_swap::{Blocks, PAGE};

const SECTOR: u64 = 512;
/// 12 areas of one chunk, over 4 chunks of HBM, 2 of host staging and 16 of file.
const SIZE: u64 = 12 * CHUNK;

#[derive(Debug, Clone)]
enum Op {
    Write {
        offset: u64,
        len: u64,
        seed: u64,
    },
    Read {
        offset: u64,
        len: u64,
    },
    Discard {
        offset: u64,
        len: u64,
    },
    /// The node daemon's grant, in chunks (`None`: no grant).
    Grant(Option<u64>),
}

/// Where a range starts: anywhere, or (half the time) in a window of 64 pages around the
/// first area boundary, so that requests meet on the same pages and areas (a write over a
/// discarded page, a discard that empties an area) and span two areas.
fn start() -> impl Strategy<Value = u64> {
    let hot = CHUNK - 32 * PAGE;
    prop_oneof![0..SIZE / SECTOR, hot / SECTOR..(hot + 64 * PAGE) / SECTOR].prop_map(|sector| sector * SECTOR)
}

/// A range: mostly whole pages (as swap sends them), sometimes any sectors, sometimes across
/// several areas.
fn range() -> impl Strategy<Value = (u64, u64)> {
    prop_oneof![
        5 => (start(), 1..=8u64).prop_map(|(at, pages)| (at / PAGE * PAGE, pages * PAGE)),
        3 => (start(), 1..=24u64).prop_map(|(at, sectors)| (at, sectors * SECTOR)),
        1 => (start(), 1..=3 * CHUNK / SECTOR).prop_map(|(at, sectors)| (at, sectors * SECTOR)),
    ]
    .prop_map(|(offset, len)| (offset, len.min(SIZE - offset)))
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (range(), any::<u64>()).prop_map(|((offset, len), seed)| Op::Write { offset, len, seed }),
        4 => range().prop_map(|(offset, len)| Op::Read { offset, len }),
        3 => range().prop_map(|(offset, len)| Op::Discard { offset, len }),
        1 => prop_oneof![Just(None), (2..=3u64).prop_map(Some)].prop_map(Op::Grant),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn the_device_reads_back_what_the_model_holds(ops in prop::collection::vec(op(), 1..40)) {
        let store = open(config("model", SIZE, 4, 2, 16));
        let mut model = Model::new(SIZE);
        for op in &ops {
            match *op {
                Op::Write { offset, len, seed } => {
                    let data = pattern(seed, len as usize);
                    store.write(offset, &data).unwrap();
                    model.write(offset, &data);
                }
                Op::Read { offset, len } => {
                    let mut out = vec![0xA5; len as usize];
                    store.read(offset, &mut out).unwrap();
                    let want = &model.bytes[offset as usize..(offset + len) as usize];
                    prop_assert!(out == want, "{op:?} read other bytes than the model holds");
                }
                Op::Discard { offset, len } => {
                    store.discard(offset, len).unwrap();
                    model.discard(offset, len);
                }
                Op::Grant(chunks) => {
                    let applied = store.set_external_cap(chunks.map(|c| c * CHUNK)).unwrap();
                    prop_assert_eq!(applied.decision.budget, chunks.unwrap_or(4) * CHUNK);
                    prop_assert!(store.hbm_held() <= applied.decision.budget, "the grant is met on return");
                }
            }
            let stats = store.stats();
            prop_assert_eq!(stats.bytes_present, model.bytes_present(), "after {:?}", op);
            prop_assert_eq!(stats.areas_live, model.areas_live(CHUNK), "after {:?}", op);
        }
        assert_device_holds(&store, &model.bytes);
        let stats = store.stats();
        prop_assert_eq!(stats.requests.errors, 0);
        prop_assert!(stats.hbm_bytes <= stats.hbm_budget);
    }
}

/// More data than HBM and the host tier hold together: the rest must be in the file, and it
/// comes back intact after the budget shrinks to its least and grows again.
#[test]
fn a_device_larger_than_hbm_spills_to_the_file_and_comes_back() {
    let store = open(config("spill", SIZE, 4, 2, 16));
    let bytes = pattern(7, SIZE as usize);
    for (i, piece) in bytes.chunks(256 << 10).enumerate() {
        store.write(i as u64 * (256 << 10), piece).unwrap();
    }
    let stats = store.stats();
    assert_eq!(stats.bytes_present, SIZE);
    assert!(stats.file_bytes >= 6 * CHUNK, "12 chunks over 4 of HBM and 2 of host: {stats}");
    assert!(store.engine().stats().transfers.file_writes > 0);
    let applied = store.set_external_cap(Some(0)).unwrap();
    assert_eq!(applied.decision.budget, 2 * CHUNK, "a grant of nothing is raised to the least budget");
    assert_device_holds(&store, &bytes);
    store.set_external_cap(None).unwrap();
    assert_device_holds(&store, &bytes);
    assert!(store.engine().stats().transfers.file_reads > 0);
}
