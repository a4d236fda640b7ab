//! Which dataplane can express which algorithm, and the fallback when it cannot.
//!
//! Kernel dataplanes evaluate rules statelessly per new flow: they can draw a random number
//! (`numgen random`), count (`numgen inc`, `statistic --mode nth`) and hash packet fields
//! (`jhash`; in iptables only the source address, with `-m cluster`), but they keep no per-endpoint connection counts, so lc, sed and nq are out of
//! their reach. An algorithm a dataplane cannot express falls back to `random` (kube-proxy's
//! own behaviour), and the fallback is always reported — in the proxy's log and as a
//! Kubernetes Event on the Service ([`EVENT_REASON`]) — never silent.

use std::fmt;

use crate::algorithm::Algorithm;

/// `reason` of the Kubernetes Event recorded on a Service whose algorithm fell back.
pub const EVENT_REASON: &str = "LoadBalancingAlgorithmUnsupported";

/// A dataplane, for capability questions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dataplane {
    Nftables,
    Iptables,
    Userspace,
    /// Linux IPVS (its schedulers).
    Ipvs,
}

impl Dataplane {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Nftables => "nftables",
            Self::Iptables => "iptables",
            Self::Userspace => "userspace",
            Self::Ipvs => "ipvs",
        }
    }

    /// The algorithm used when neither the service nor `--scheduler` names one: random for the
    /// nftables and iptables dataplanes (as kube-proxy), round robin for userspace (as the seeds
    /// describe it) and IPVS (kube-proxy's `--ipvs-scheduler` default).
    pub fn default_algorithm(self) -> Algorithm {
        match self {
            Self::Nftables | Self::Iptables => Algorithm::Random,
            Self::Userspace | Self::Ipvs => Algorithm::RoundRobin,
        }
    }

    /// The algorithm used instead of one the dataplane cannot express: random, except in
    /// IPVS, which has no random scheduler (round robin there).
    pub fn fallback_algorithm(self) -> Algorithm {
        match self {
            Self::Ipvs => Algorithm::RoundRobin,
            _ => Algorithm::Random,
        }
    }
}

impl fmt::Display for Dataplane {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether a dataplane can express an algorithm.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Support {
    /// Implemented as specified; `how` names the mechanism.
    Native { how: &'static str },
    /// Not expressible; `why` explains it in a sentence fragment.
    Unsupported { why: &'static str },
}

/// The capability table.
pub fn support(algorithm: Algorithm, dataplane: Dataplane) -> Support {
    use Algorithm::*;
    const NO_COUNTS: &str = "it needs live per-endpoint connection counts, which stateless \
                             kernel rules do not keep";
    match (dataplane, algorithm) {
        (Dataplane::Userspace, _) => Support::Native {
            how: "the proxy picks per connection",
        },
        (Dataplane::Nftables, Random) => Support::Native {
            how: "numgen random mod N",
        },
        (Dataplane::Nftables, RoundRobin | WeightedRoundRobin) => Support::Native {
            how: "numgen inc mod N over the weighted round-robin cycle",
        },
        (Dataplane::Nftables, SourceHash) => Support::Native {
            how: "jhash ip saddr mod N",
        },
        (Dataplane::Nftables, DestinationHash) => Support::Native {
            how: "jhash ip daddr . th dport mod N",
        },
        (Dataplane::Nftables, Maglev) => Support::Native {
            how: "jhash ip saddr . th sport mod M into a Maglev lookup map",
        },
        (Dataplane::Nftables, LeastConnection | ShortestExpectedDelay | NeverQueue) => {
            Support::Unsupported { why: NO_COUNTS }
        }
        (Dataplane::Iptables, Random) => Support::Native {
            how: "-m statistic --mode random",
        },
        (Dataplane::Iptables, RoundRobin) => Support::Native {
            how: "-m statistic --mode nth",
        },
        (Dataplane::Iptables, WeightedRoundRobin) => Support::Native {
            how: "-m statistic --mode nth over the weighted round-robin cycle",
        },
        (Dataplane::Iptables, SourceHash) => Support::Native {
            how: "-m cluster: jhash of the source address into at most 32 slots",
        },
        (Dataplane::Iptables, LeastConnection | ShortestExpectedDelay | NeverQueue) => {
            Support::Unsupported { why: NO_COUNTS }
        }
        (Dataplane::Iptables, DestinationHash | Maglev) => Support::Unsupported {
            why: "iptables has no match that hashes the destination or looks a hash up in a table",
        },
        (Dataplane::Ipvs, Random) => Support::Unsupported {
            why: "IPVS has no random scheduler",
        },
        (Dataplane::Ipvs, RoundRobin) => Support::Native {
            how: "IPVS scheduler rr",
        },
        (Dataplane::Ipvs, WeightedRoundRobin) => Support::Native {
            how: "IPVS scheduler wrr",
        },
        (Dataplane::Ipvs, LeastConnection) => Support::Native {
            how: "IPVS scheduler lc",
        },
        (Dataplane::Ipvs, ShortestExpectedDelay) => Support::Native {
            how: "IPVS scheduler sed",
        },
        (Dataplane::Ipvs, NeverQueue) => Support::Native {
            how: "IPVS scheduler nq",
        },
        (Dataplane::Ipvs, SourceHash) => Support::Native {
            how: "IPVS scheduler sh",
        },
        (Dataplane::Ipvs, DestinationHash) => Support::Native {
            how: "IPVS scheduler dh",
        },
        (Dataplane::Ipvs, Maglev) => Support::Native {
            how: "IPVS scheduler mh (Maglev hashing of the source address and port)",
        },
    }
}

/// An algorithm a dataplane could not honour, and what it uses instead.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fallback {
    pub requested: Algorithm,
    pub used: Algorithm,
    pub dataplane: Dataplane,
    pub why: &'static str,
}

impl fmt::Display for Fallback {
    /// The log line and Event message, e.g. "load-balancing algorithm lc (least connections)
    /// cannot be expressed by the nftables dataplane: it needs …; using random instead".
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "load-balancing algorithm {} ({}) cannot be expressed by the {} dataplane: {}; using {} instead",
            self.requested,
            self.requested.description(),
            self.dataplane,
            self.why,
            self.used
        )
    }
}

/// The algorithm a dataplane uses for a service, and the fallback to report if any.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolution {
    pub algorithm: Algorithm,
    pub fallback: Option<Fallback>,
}

/// Resolves a service's requested algorithm (annotation, else `--scheduler`, else `None`) for
/// a dataplane: `None` gives the dataplane's default; an unsupported one gives the dataplane's
/// [`Dataplane::fallback_algorithm`] plus a [`Fallback`] to report.
pub fn resolve(requested: Option<Algorithm>, dataplane: Dataplane) -> Resolution {
    let Some(requested) = requested else {
        return Resolution {
            algorithm: dataplane.default_algorithm(),
            fallback: None,
        };
    };
    match support(requested, dataplane) {
        Support::Native { .. } => Resolution {
            algorithm: requested,
            fallback: None,
        },
        Support::Unsupported { why } => Resolution {
            algorithm: dataplane.fallback_algorithm(),
            fallback: Some(Fallback {
                requested,
                used: dataplane.fallback_algorithm(),
                dataplane,
                why,
            }),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn userspace_supports_everything_and_random_is_universal() {
        for a in Algorithm::ALL {
            assert!(matches!(
                support(a, Dataplane::Userspace),
                Support::Native { .. }
            ));
        }
        for d in [
            Dataplane::Nftables,
            Dataplane::Iptables,
            Dataplane::Userspace,
        ] {
            assert!(matches!(
                support(Algorithm::Random, d),
                Support::Native { .. }
            ));
            assert!(resolve(None, d).fallback.is_none());
        }
    }

    #[test]
    fn ipvs_has_every_scheduler_but_random_and_falls_back_to_rr() {
        for a in Algorithm::ALL {
            let native = matches!(support(a, Dataplane::Ipvs), Support::Native { .. });
            assert_eq!(native, a != Algorithm::Random, "{a}");
        }
        assert_eq!(
            resolve(None, Dataplane::Ipvs).algorithm,
            Algorithm::RoundRobin
        );
        let r = resolve(Some(Algorithm::Random), Dataplane::Ipvs);
        assert_eq!(r.algorithm, Algorithm::RoundRobin);
        assert_eq!(
            r.fallback.unwrap().to_string(),
            "load-balancing algorithm random (random) cannot be expressed by the ipvs dataplane: \
             IPVS has no random scheduler; using rr instead"
        );
    }

    #[test]
    fn nftables_falls_back_from_lc_with_a_clear_message() {
        let r = resolve(Some(Algorithm::LeastConnection), Dataplane::Nftables);
        assert_eq!(r.algorithm, Algorithm::Random);
        let msg = r.fallback.unwrap().to_string();
        assert_eq!(
            msg,
            "load-balancing algorithm lc (least connections) cannot be expressed by the nftables \
             dataplane: it needs live per-endpoint connection counts, which stateless kernel \
             rules do not keep; using random instead"
        );
        let r = resolve(Some(Algorithm::Maglev), Dataplane::Nftables);
        assert_eq!((r.algorithm, r.fallback), (Algorithm::Maglev, None));
        assert_eq!(
            resolve(None, Dataplane::Userspace).algorithm,
            Algorithm::RoundRobin
        );
    }
}
