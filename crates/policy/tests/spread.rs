//! The planned resident set (spread.rs): its properties on random schedules.

use proptest::prelude::*;
use tiermem_policy::{spread_resident, Scheduled};

fn schedules() -> impl Strategy<Value = Vec<Scheduled>> {
    prop::collection::vec((1usize..40, prop_oneof![4 => Just(1usize), 1 => 2usize..30]), 1..60)
        .prop_map(|v| v.into_iter().map(|(chunks, uses)| Scheduled { chunks, uses }).collect())
}

proptest! {
    #[test]
    fn never_more_than_the_room(buffers in schedules(), room in 0usize..800, window in 0usize..64) {
        let keep = spread_resident(&buffers, room, window);
        let kept: usize = buffers.iter().zip(&keep).filter(|(_, &k)| k).map(|(b, _)| b.chunks).sum();
        prop_assert!(kept <= room);
        let total: usize = buffers.iter().map(|b| b.chunks).sum();
        if room >= total {
            prop_assert!(keep.iter().all(|&k| k), "room for all keeps all");
        }
        prop_assert_eq!(keep, spread_resident(&buffers, room, window), "deterministic");
    }

    /// Single-use buffers within the window: the room is used up to less than one buffer, and
    /// after every prefix of the schedule the kept chunks are within one buffer of the room's
    /// share of the chunks walked.
    #[test]
    fn spread_evenly_along_the_pass(sizes in prop::collection::vec(1usize..40, 1..60), share in 0.0f64..1.0) {
        let buffers: Vec<Scheduled> = sizes.iter().map(|&chunks| Scheduled { chunks, uses: 1 }).collect();
        let total: usize = sizes.iter().sum();
        let largest = *sizes.iter().max().unwrap();
        let room = (total as f64 * share) as usize;
        let keep = spread_resident(&buffers, room, largest);
        let (mut walked, mut kept) = (0usize, 0usize);
        for (b, &k) in buffers.iter().zip(&keep) {
            walked += b.chunks;
            kept += if k { b.chunks } else { 0 };
            let target = walked as f64 * room as f64 / total as f64;
            prop_assert!((kept as f64 - target).abs() <= largest as f64, "after {walked} of {total}: kept {kept}, share {target:.1}");
        }
        prop_assert!(kept + largest > room, "kept {kept} of room {room}");
    }

    /// A buffer used more than once a pass is kept before any used once, as long as it fits.
    #[test]
    fn shared_buffers_before_single_ones(buffers in schedules(), room in 0usize..800) {
        let keep = spread_resident(&buffers, room, 64);
        let kept: usize = buffers.iter().zip(&keep).filter(|(_, &k)| k).map(|(b, _)| b.chunks).sum();
        for (b, &k) in buffers.iter().zip(&keep) {
            if b.uses > 1 && !k {
                // Left out only for want of room once shared ones before it were kept.
                let shared_kept: usize = buffers.iter().zip(&keep).filter(|(c, &k)| k && c.uses > 1).map(|(c, _)| c.chunks).sum();
                prop_assert!(shared_kept + b.chunks > room, "{b:?} left out with {shared_kept} of {room} ({kept} kept)");
            }
        }
    }
}
