//! The tiers of memory a chunk can live in, fastest first. One vocabulary for the engine (where a
//! chunk is, statistics per tier), the node daemon's protocol (budgets per tier) and the
//! policies (where a victim goes).

use serde::{Deserialize, Serialize};

/// A tier of memory, ordered from fastest to slowest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Tier {
    /// The HBM of the engine's GPU.
    Hbm,
    /// Spare HBM lent by neighbour GPUs, reached over NVLink (the peer tier).
    Peer,
    /// Pinned host memory.
    Host,
    /// The file (NVMe) tier.
    File,
}

impl Tier {
    /// Every tier, fastest first.
    pub const ALL: [Tier; 4] = [Tier::Hbm, Tier::Peer, Tier::Host, Tier::File];

    /// The tier's name in statistics, configuration and messages.
    pub fn name(self) -> &'static str {
        match self {
            Tier::Hbm => "hbm",
            Tier::Peer => "peer",
            Tier::Host => "host",
            Tier::File => "file",
        }
    }
}

impl std::fmt::Display for Tier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_the_serialized_form_and_order_is_speed() {
        for tier in Tier::ALL {
            assert_eq!(serde_json::to_string(&tier).unwrap(), format!("\"{}\"", tier.name()));
        }
        assert!(Tier::ALL.windows(2).all(|w| w[0] < w[1]));
    }
}
