//! Which chunks move at a quiesce point: pure logic, no driver (migrate.rs carries it out).
//!
//! Given each chunk's heat this epoch (hotness.rs), where it is, whether it moved recently,
//! and how many chunks the budget has room for, the plan is:
//!
//! 1. **Fill the room**: the hottest host chunks (heat above zero) come up while the budget has
//!    room for them; when it has room for every host chunk, those of no heat come up too (a
//!    kernel may reach them through pointers tiermem never saw).
//! 2. **Swap**: then, pairing the hottest remaining host chunk with the coldest HBM chunk, one
//!    goes up and the other down while the host chunk is hotter by a margin:
//!    `host > hbm + hbm / 2 + 1`. The margin is the hysteresis: a pair swapped at one quiesce
//!    point cannot swap back at the next unless their heats have turned round by more than the
//!    margin, so nothing ping-pongs on noise, and with heats unchanged a second plan moves
//!    nothing (a property test checks it; the argument holds for any margin `f(hbm) >= hbm`
//!    that grows with `hbm`).
//! 3. **Bounds**: at most `batch` chunks go down per quiesce point, and up at most `batch` or,
//!    filling room the budget has free, `fill` (a move up into free room sends nothing down:
//!    it costs one copy and a remap of cheap HBM, and a budget grown by gigabytes fills at one
//!    quiesce point instead of at a batch a synchronization); chunks that moved in the last few
//!    quiesce points (`cooling`) stay where they are.
//!
//! The budget is never exceeded: ups − downs ≤ room. Ties break by the chunk's position, so the
//! plan is deterministic.
//!
//! A budget that shrank under the chunks in HBM (the node daemon lowered it) is met first, by
//! [`shed`]: the coldest HBM chunks go down, as many as it is over, cooling or not and whatever
//! the batch, and nothing comes up.

/// One chunk as the policy sees it. `id` is the caller's, returned in the plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate {
    pub id: usize,
    pub on_host: bool,
    pub heat: u64,
    pub cooling: bool,
}

/// The chunks to bring up to HBM and to send down to the host (ids).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Plan {
    pub up: Vec<usize>,
    pub down: Vec<usize>,
}

impl Plan {
    pub fn is_empty(&self) -> bool {
        self.up.is_empty() && self.down.is_empty()
    }
}

/// Whether a host chunk of heat `host` is worth swapping with an HBM chunk of heat `hbm`: hotter
/// by half as much again, plus one. Heats are launches per epoch (about a training step), small
/// numbers: an activation read three times a step must displace an optimizer state read once
/// (3 > 1 + 1), while 5 against 4 is noise.
fn worth_swapping(host: u64, hbm: u64) -> bool {
    host > hbm.saturating_add(hbm / 2).saturating_add(1)
}

/// The plan for `chunks`, with `room` chunks free in the budget, at most `batch` moves down and
/// at most `batch.max(fill)` up (`fill` bounds what fills free room).
pub fn plan(chunks: &[Candidate], room: usize, batch: usize, fill: usize) -> Plan {
    let ups = batch.max(fill);
    let everything_fits = chunks.iter().filter(|c| c.on_host && !c.cooling).count() <= room;
    let mut hot: Vec<&Candidate> =
        chunks.iter().filter(|c| c.on_host && !c.cooling && (c.heat > 0 || everything_fits)).collect();
    hot.sort_by_key(|c| (std::cmp::Reverse(c.heat), c.id));
    let mut cold: Vec<&Candidate> = chunks.iter().filter(|c| !c.on_host && !c.cooling).collect();
    cold.sort_by_key(|c| (c.heat, c.id));

    let mut plan = Plan::default();
    let filled = hot.len().min(room).min(ups);
    plan.up.extend(hot[..filled].iter().map(|c| c.id));
    for (host, hbm) in hot[filled..].iter().zip(&cold) {
        if plan.up.len() >= ups || plan.down.len() >= batch || !worth_swapping(host.heat, hbm.heat) {
            break;
        }
        plan.up.push(host.id);
        plan.down.push(hbm.id);
    }
    plan
}

/// The plan that meets a budget `over` chunks below the HBM in use: the `over` coldest HBM
/// chunks down (those not cooling first), nothing up.
pub fn shed(chunks: &[Candidate], over: usize) -> Plan {
    let mut in_hbm: Vec<&Candidate> = chunks.iter().filter(|c| !c.on_host).collect();
    in_hbm.sort_by_key(|c| (c.cooling, c.heat, c.id));
    Plan { up: Vec::new(), down: in_hbm.iter().take(over).map(|c| c.id).collect() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn chunk(id: usize, on_host: bool, heat: u64) -> Candidate {
        Candidate { id, on_host, heat, cooling: false }
    }

    #[test]
    fn hot_host_chunks_fill_the_room_then_swap_with_cold_hbm_chunks() {
        let chunks = [chunk(0, false, 0), chunk(1, false, 9), chunk(2, true, 50), chunk(3, true, 7), chunk(4, true, 0)];
        assert_eq!(plan(&chunks, 1, 8, 8), Plan { up: vec![2, 3], down: vec![0] }, "room for 50; 7 > 0 + 0 + 1");
        assert_eq!(
            plan(&chunks, 0, 8, 8),
            Plan { up: vec![2], down: vec![0] },
            "no room: 50 for 0; 7 is not > 9 + 4 + 1"
        );
        assert_eq!(plan(&chunks, 2, 8, 8).up, [2, 3], "never-touched chunks stay where they are");
        assert_eq!(plan(&chunks, 3, 8, 8).up, [2, 3, 4], "unless every host chunk fits");
        assert_eq!(plan(&chunks, 0, 1, 1), Plan { up: vec![2], down: vec![0] }, "one each way");
    }

    #[test]
    fn free_room_fills_beyond_a_batch_and_swaps_stay_within_one() {
        let mut chunks: Vec<Candidate> = (0..10).map(|id| chunk(id, true, 20 + id as u64)).collect();
        chunks.extend((10..14).map(|id| chunk(id, false, 1)));
        let p = plan(&chunks, 6, 2, 6);
        assert_eq!(p.up, [9, 8, 7, 6, 5, 4], "room for six: the six hottest come up at once");
        assert!(p.down.is_empty(), "no swap beyond the fill's bound");
        let p = plan(&chunks, 1, 2, 6);
        assert_eq!((p.up.len(), p.down.len()), (3, 2), "one into the room, then two swaps: a batch down");
        assert_eq!(plan(&chunks, 6, 2, 2).up.len(), 2, "a fill of one batch, as before");
    }

    #[test]
    fn a_small_margin_is_not_worth_a_swap() {
        let chunks = [chunk(0, false, 10), chunk(1, false, 30), chunk(2, true, 16), chunk(3, true, 17)];
        assert_eq!(plan(&chunks, 0, 8, 8), Plan { up: vec![3], down: vec![0] }, "17 > 10 + 5 + 1; 16 is not");
        assert_eq!(plan(&[chunk(0, false, 1), chunk(1, true, 3)], 0, 8, 8), Plan { up: vec![1], down: vec![0] });
        assert!(plan(&[chunk(0, false, 4), chunk(1, true, 5)], 0, 8, 8).is_empty(), "5 against 4 is noise");
        let cooling = [Candidate { cooling: true, ..chunk(0, false, 0) }, chunk(1, true, 99)];
        assert!(plan(&cooling, 0, 8, 8).is_empty(), "a chunk that just moved stays");
    }

    fn chunks() -> impl Strategy<Value = Vec<Candidate>> {
        prop::collection::vec((any::<bool>(), 0u64..40, prop::bool::weighted(0.1)), 0..60).prop_map(|v| {
            v.into_iter()
                .enumerate()
                .map(|(id, (on_host, heat, cooling))| Candidate { id, on_host, heat, cooling })
                .collect()
        })
    }

    fn apply(chunks: &[Candidate], plan: &Plan) -> Vec<Candidate> {
        let mut after = chunks.to_vec();
        for &id in &plan.up {
            after[id].on_host = false;
        }
        for &id in &plan.down {
            after[id].on_host = true;
        }
        after
    }

    proptest! {
        #[test]
        fn plans_respect_budget_batch_direction_and_cooling(
            chunks in chunks(), room in 0usize..20, batch in 1usize..20, fill in 0usize..40,
        ) {
            let p = plan(&chunks, room, batch, fill);
            prop_assert!(p.up.len() <= batch.max(fill) && p.down.len() <= batch);
            prop_assert!(p.up.len() - p.down.len() <= fill.max(batch).min(room), "into free room, at most the fill");
            prop_assert!(p.up.len() <= p.down.len() + room, "ups − downs ≤ room");
            let mut ids: Vec<usize> = p.up.iter().chain(&p.down).copied().collect();
            ids.sort_unstable();
            ids.dedup();
            prop_assert_eq!(ids.len(), p.up.len() + p.down.len(), "no chunk twice");
            let everything_fits = chunks.iter().filter(|c| c.on_host && !c.cooling).count() <= room;
            for &id in &p.up {
                prop_assert!(chunks[id].on_host && !chunks[id].cooling && (chunks[id].heat > 0 || everything_fits));
            }
            prop_assert!(!everything_fits || p.down.is_empty(), "room for all: nothing goes down");
            for &id in &p.down {
                prop_assert!(!chunks[id].on_host && !chunks[id].cooling);
            }
            // Every chunk going down is colder than every chunk coming up, by the margin.
            for &down in &p.down {
                for &up in &p.up {
                    prop_assert!(chunks[up].heat > chunks[down].heat);
                }
            }
        }

        #[test]
        fn shedding_sends_down_the_coldest_hbm_chunks_it_is_over_by(chunks in chunks(), over in 0usize..30) {
            let p = shed(&chunks, over);
            let in_hbm = chunks.iter().filter(|c| !c.on_host).count();
            prop_assert!(p.up.is_empty());
            prop_assert_eq!(p.down.len(), over.min(in_hbm));
            let mut ids = p.down.clone();
            ids.sort_unstable();
            ids.dedup();
            prop_assert_eq!(ids.len(), p.down.len(), "no chunk twice");
            let key = |c: &Candidate| (c.cooling, c.heat);
            for &down in &p.down {
                prop_assert!(!chunks[down].on_host);
                // Every HBM chunk that stays is no colder than any that goes.
                for stays in chunks.iter().filter(|c| !c.on_host && !p.down.contains(&c.id)) {
                    prop_assert!(key(stays) >= key(&chunks[down]));
                }
            }
        }

        #[test]
        fn with_heats_unchanged_a_second_plan_moves_nothing(chunks in chunks(), room in 0usize..20) {
            let unbounded = chunks.len() + 1;
            let warm: Vec<Candidate> = chunks.iter().map(|c| Candidate { cooling: false, ..*c }).collect();
            let first = plan(&warm, room, unbounded, unbounded);
            let room_after = room + first.down.len() - first.up.len();
            let second = plan(&apply(&warm, &first), room_after, unbounded, unbounded);
            prop_assert!(second.is_empty(), "{:?} then {:?}", first, second);
        }
    }
}
