//! The peer tier's bookkeeping on a simulated node.

use super::*;
use tiermem_mechanism::sim::SimDevice;

const G: usize = 2 << 20;

#[test]
fn slots_come_from_lenders_round_robin_up_to_their_caps_and_go_back_when_drained() {
    let node = SimDevice::node(3, 64 * G).unwrap();
    let me = &node[0];
    let mut tier = PeerTier::new(G, 0, &[(1, 8 * G), (2, 8 * G)]);
    assert_eq!(tier.cap(), 16);
    let a = tier.alloc_up_to(me, 10);
    assert_eq!(a.len(), 10);
    assert_eq!(tier.borrowed_from(1), 8 * G);
    assert_eq!(tier.borrowed_from(2), 8 * G);
    let b = tier.alloc_up_to(me, 10);
    assert_eq!(b.len(), 6, "only what the lenders lend");
    assert_eq!(tier.alloc_up_to(me, 1).len(), 0);
    // Every slot is a distinct, mapped device address this GPU may copy into.
    let mut addrs: Vec<u64> = a.iter().chain(&b).map(|&s| tier.addr(s)).collect();
    addrs.sort_unstable();
    addrs.dedup();
    assert_eq!(addrs.len(), 16);
    me.write(addrs[3], &[7u8; 64]).unwrap();
    // GPU 2 stops lending: its slab drains, is released once its slots are freed.
    assert!(tier.set_cap(2, 0));
    let kept: Vec<PeerSlot> = a
        .iter()
        .chain(&b)
        .copied()
        .filter(|&s| tier.lenders[tier.slabs[tier.slab(s)].as_ref().unwrap().lender].gpu == 1)
        .collect();
    assert_eq!(kept.len(), 8);
    for s in a.iter().chain(&b).copied().filter(|s| !kept.contains(s)) {
        assert!(tier.is_draining(s));
        tier.free(s);
    }
    assert_eq!(tier.release_drained(me).unwrap(), 8 * G);
    assert_eq!(tier.borrowed_from(1) + tier.borrowed_from(2), 8 * G);
    assert_eq!(node[2].mem_info().unwrap().0, 64 * G, "GPU 2 has its memory back");
    for s in kept {
        tier.free(s);
    }
    tier.release_all(me).unwrap();
    assert!(me.live().is_empty(), "{:?}", me.live());
}

#[test]
fn lowering_a_cap_again_before_the_slabs_go_back_drains_no_more_than_it_says() {
    let node = SimDevice::node(3, 16 * G).unwrap();
    // Slabs of 4 chunks: GPU 2 lends two.
    let mut tier = PeerTier::new(G, 0, &[(1, 4 * G), (2, 8 * G)]);
    let slots = tier.alloc_up_to(&node[0], 12);
    assert_eq!(tier.borrowed_from(2), 8 * G);
    assert!(tier.set_cap(2, 4 * G));
    let draining = |t: &PeerTier| t.slabs.iter().flatten().filter(|s| s.draining).count();
    assert_eq!(draining(&tier), 1);
    tier.set_cap(2, 4 * G);
    assert_eq!(draining(&tier), 1, "the slab already draining counts");
    slots.into_iter().for_each(|s| tier.free(s));
    assert_eq!(tier.release_drained(&node[0]).unwrap(), 4 * G);
    assert_eq!(tier.borrowed_from(2), 4 * G);
    tier.release_all(&node[0]).unwrap();
    assert!(node[0].live().is_empty());
}

#[test]
fn a_lender_that_cannot_make_a_slab_is_capped_and_its_memory_left_as_it_was() {
    let node = SimDevice::node(3, 12 * G).unwrap();
    // GPU 2 is said to lend 16 chunks but has 12: its second slab fails half made.
    let mut tier = PeerTier::new(G, 0, &[(1, 8 * G), (2, 16 * G)]);
    let got = tier.alloc_up_to(&node[0], 24);
    assert_eq!(got.len(), 16, "one slab of each");
    assert!(tier.lenders()[1].refused.is_some());
    assert_eq!(node[2].mem_info().unwrap().0, 4 * G, "the half-made slab was undone");
    got.into_iter().for_each(|s| tier.free(s));
    tier.release_all(&node[0]).unwrap();
    assert!(node[0].live().is_empty());
}

#[test]
fn slabs_readable_in_place_that_fail_half_made_leave_nothing_behind() {
    for seed in 0..64 {
        let node = SimDevice::node(3, 16 * G).unwrap();
        let mut tier = PeerTier::new(G, 0, &[(1, 8 * G), (2, 8 * G)]).with_slots_readable_in_place(true);
        // Creating, mapping, giving access and every unmap of a rollback fail at random.
        node[0].inject_errors(Some(5), seed);
        let got = tier.alloc_up_to(&node[0], 16);
        node[0].inject_errors(None, 0);
        assert!(got.iter().all(|&s| tier.part(s).is_some()));
        got.into_iter().for_each(|s| tier.free(s));
        tier.release_all(&node[0]).unwrap();
        assert!(node[0].live().is_empty(), "seed {seed}: {:?}", node[0].live());
        assert_eq!(node[1].mem_info().unwrap().0, 16 * G, "seed {seed}: GPU 1's memory is back");
    }
}
