//! Where a chunk leaving HBM goes: one pure decision, so that a new tier (a neighbour GPU's
//! HBM, memHarvester's victim cache) is a new entry in an order, not new branches in the
//! engine's movement code.
//!
//! A chunk whose bytes a lower tier already holds (it is *clean*: read-only since it came up,
//! or paged out before) leaves by bookkeeping: its HBM is given back after its last use, and
//! the copy below is where it now lives (GDM's cheap clean eviction). A *dirty* chunk must be
//! copied first, into the fastest tier of the engine's order that has room; when none has, into
//! the slowest of the order, which makes room by spilling its own coldest chunks further down
//! (the host tier to the file).

use crate::Tier;

/// What happens to a chunk leaving HBM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Leave {
    /// Its bytes are already in `kept_in`: it leaves without a copy.
    Drop { kept_in: Tier },
    /// Its bytes must be copied into this tier first.
    CopyTo(Tier),
}

/// The decision for one chunk: `copy` is the fastest lower tier holding its bytes, if any;
/// `order` the tiers that take copies out of HBM, fastest first (never empty); `has_room`
/// whether a tier can take one more chunk now.
pub fn leave_hbm(copy: Option<Tier>, order: &[Tier], has_room: impl Fn(Tier) -> bool) -> Leave {
    if let Some(kept_in) = copy {
        return Leave::Drop { kept_in };
    }
    let last = *order.last().expect("at least one tier takes chunks out of HBM");
    Leave::CopyTo(order.iter().copied().find(|&tier| has_room(tier)).unwrap_or(last))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn tier() -> impl Strategy<Value = Tier> {
        prop::sample::select(Tier::ALL.to_vec())
    }

    proptest! {
        #[test]
        fn clean_chunks_drop_and_dirty_ones_go_to_the_fastest_tier_with_room(
            copy in prop::option::of(tier()),
            order in prop::sample::subsequence(vec![Tier::Peer, Tier::Host, Tier::File], 1..=3),
            room in prop::collection::vec(any::<bool>(), Tier::ALL.len()),
        ) {
            let has_room = |t: Tier| room[t as usize];
            match leave_hbm(copy, &order, has_room) {
                Leave::Drop { kept_in } => prop_assert_eq!(Some(kept_in), copy),
                Leave::CopyTo(to) => {
                    prop_assert!(copy.is_none(), "a chunk with a copy below is never copied again");
                    prop_assert!(order.contains(&to));
                    let faster = order.iter().take_while(|&&t| t != to);
                    prop_assert!(faster.clone().all(|&t| !has_room(t)), "a faster tier had room");
                    prop_assert!(has_room(to) || to == *order.last().unwrap(), "full and not the last resort");
                }
            }
        }
    }
}
