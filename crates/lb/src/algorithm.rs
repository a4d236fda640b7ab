//! The algorithm names: the `svcnet.io/lb-algorithm` annotation values and the `--scheduler`
//! flag values.

use std::fmt;
use std::str::FromStr;

/// Service annotation choosing the algorithm of one service (overrides `--scheduler`).
pub const ANNOTATION: &str = "svcnet.io/lb-algorithm";

/// A load-balancing algorithm.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Algorithm {
    /// `rr`: each new connection goes to the next endpoint in turn.
    RoundRobin,
    /// `wrr`: round robin in proportion to endpoint weights (smooth interleaving).
    WeightedRoundRobin,
    /// `random`: uniformly at random, weighted (kube-proxy's iptables/nftables behaviour).
    Random,
    /// `lc`: the endpoint with the fewest active connections.
    LeastConnection,
    /// `sed`: shortest expected delay, minimal `(active + 1) / weight`.
    ShortestExpectedDelay,
    /// `nq`: never queue, an idle endpoint if any, else as `sed`.
    NeverQueue,
    /// `sh`: hash of the client (source) address.
    SourceHash,
    /// `dh`: hash of the original destination (the frontend address and port the client used).
    DestinationHash,
    /// `maglev`: Maglev consistent hashing of the client address and port.
    Maglev,
}

impl Algorithm {
    pub const ALL: [Algorithm; 9] = [
        Algorithm::RoundRobin,
        Algorithm::WeightedRoundRobin,
        Algorithm::Random,
        Algorithm::LeastConnection,
        Algorithm::ShortestExpectedDelay,
        Algorithm::NeverQueue,
        Algorithm::SourceHash,
        Algorithm::DestinationHash,
        Algorithm::Maglev,
    ];

    /// The short name used in annotations, flags, logs and metrics labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::RoundRobin => "rr",
            Self::WeightedRoundRobin => "wrr",
            Self::Random => "random",
            Self::LeastConnection => "lc",
            Self::ShortestExpectedDelay => "sed",
            Self::NeverQueue => "nq",
            Self::SourceHash => "sh",
            Self::DestinationHash => "dh",
            Self::Maglev => "maglev",
        }
    }

    /// A human description, for messages.
    pub fn description(self) -> &'static str {
        match self {
            Self::RoundRobin => "round robin",
            Self::WeightedRoundRobin => "weighted round robin",
            Self::Random => "random",
            Self::LeastConnection => "least connections",
            Self::ShortestExpectedDelay => "shortest expected delay",
            Self::NeverQueue => "never queue",
            Self::SourceHash => "source hashing",
            Self::DestinationHash => "destination hashing",
            Self::Maglev => "Maglev consistent hashing",
        }
    }

    /// Whether the choice depends on live per-endpoint connection counts.
    pub fn needs_load(self) -> bool {
        matches!(
            self,
            Self::LeastConnection | Self::ShortestExpectedDelay | Self::NeverQueue
        )
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An annotation or flag value that names no algorithm.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "{value:?} is not a load-balancing algorithm (expected one of rr, wrr, random, lc, sed, nq, sh, dh, maglev)"
)]
pub struct ParseAlgorithmError {
    pub value: String,
}

impl FromStr for Algorithm {
    type Err = ParseAlgorithmError;

    /// Parses the short names; `mh` (IPVS's and kube-router's name for Maglev) is accepted too.
    /// Surrounding white space is ignored, case is not (annotation values are case-sensitive in
    /// every peer).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let v = s.trim();
        if v == "mh" {
            return Ok(Self::Maglev);
        }
        Self::ALL
            .into_iter()
            .find(|a| a.as_str() == v)
            .ok_or_else(|| ParseAlgorithmError {
                value: s.to_string(),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for a in Algorithm::ALL {
            assert_eq!(a.as_str().parse::<Algorithm>(), Ok(a));
        }
        assert_eq!(" mh ".parse::<Algorithm>(), Ok(Algorithm::Maglev));
        let e = "RR".parse::<Algorithm>().unwrap_err();
        assert!(
            e.to_string()
                .contains("\"RR\" is not a load-balancing algorithm")
        );
    }
}
