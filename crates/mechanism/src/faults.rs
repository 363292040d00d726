//! Faults at random, for tests: a deterministic coin that comes up "fail" about one time in
//! `n`. The simulated device (`SimDevice::inject_errors`) and the file store
//! (`FileStore::inject_errors`) each own one, so tests running in parallel in one process do
//! not disturb each other (unlike failpoints, which are process-global).

/// Decides, call by call, whether a call fails: about one in `one_in`, from `seed`.
#[derive(Debug, Default, Clone)]
pub struct RandomFaults {
    one_in: Option<u64>,
    state: u64,
}

impl RandomFaults {
    /// Fail about one call in `one_in` (`None` or `Some(0)`: never), the same calls for the
    /// same seed.
    pub fn new(one_in: Option<u64>, seed: u64) -> Self {
        Self { one_in: one_in.filter(|&n| n > 0), state: seed | 1 }
    }

    pub fn active(&self) -> bool {
        self.one_in.is_some()
    }

    /// Whether this call fails.
    pub fn fires(&mut self) -> bool {
        let Some(one_in) = self.one_in else { return false };
        // xorshift64: small, deterministic, good enough to scatter faults.
        self.state ^= self.state << 13;
        self.state ^= self.state >> 7;
        self.state ^= self.state << 17;
        self.state.is_multiple_of(one_in)
    }
}

#[cfg(test)]
mod tests {
    use super::RandomFaults;

    #[test]
    fn fires_about_one_in_n_and_never_when_off() {
        let mut faults = RandomFaults::new(Some(10), 7);
        let fired = (0..10_000).filter(|_| faults.fires()).count();
        assert!((700..1300).contains(&fired), "{fired} of 10000 at one in 10");
        let mut off = RandomFaults::new(None, 7);
        assert!(!off.active() && !(0..1000).any(|_| off.fires()));
        let (mut a, mut b) = (RandomFaults::new(Some(3), 5), RandomFaults::new(Some(3), 5));
        assert!((0..100).all(|_| a.fires() == b.fires()), "the same seed gives the same faults");
    }
}
