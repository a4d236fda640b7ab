//! [`Balancer`]: one algorithm precomputed for one endpoint set (immutable, cheap to share),
//! and [`Balancer::pick`], the single entry point every dataplane calls per new flow.

use std::net::SocketAddr;

use rand::Rng;

use crate::algorithm::Algorithm;
use crate::hash::{FlowKeyBytes, SEED_DESTINATION, SEED_SOURCE, nft_jhash};
use crate::maglev::{DEFAULT_TABLE_SIZE, MaglevError, MaglevTable};
use crate::select;

/// One endpoint as the balancer sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backend {
    pub addr: SocketAddr,
    /// Relative weight; 0 quiesces the endpoint (never picked).
    pub weight: u32,
}

/// A new flow: the client's address and the original destination it asked for (the frontend:
/// cluster IP, node address or external IP, and its port).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Flow {
    pub client: SocketAddr,
    pub destination: SocketAddr,
}

/// Live per-endpoint state the dataplane keeps (the balancer itself never mutates anything).
pub trait EndpointView {
    /// False for endpoints marked down, draining, or already tried for this flow.
    fn eligible(&self, _index: usize) -> bool {
        true
    }
    /// Active connections through this proxy (used by lc, sed and nq).
    fn active(&self, _index: usize) -> u32 {
        0
    }
}

/// A view with every endpoint eligible and idle (for stateless dataplanes and tests).
#[derive(Clone, Copy, Debug, Default)]
pub struct NoLoad;
impl EndpointView for NoLoad {}

impl<F: Fn(usize) -> bool> EndpointView for F {
    fn eligible(&self, index: usize) -> bool {
        self(index)
    }
}

/// One algorithm precomputed over one endpoint set.
#[derive(Clone, Debug)]
pub struct Balancer {
    algorithm: Algorithm,
    backends: Vec<Backend>,
    weights: Vec<u32>,
    /// rr / wrr cycle, or sh / dh weighted hash slots.
    slots: Vec<usize>,
    maglev: Option<MaglevTable>,
    /// Maglev hashes the client address only (ClientIP affinity: one client, one endpoint).
    maglev_ignores_port: bool,
}

impl Balancer {
    /// Precomputes `algorithm` over `backends` (Maglev with [`DEFAULT_TABLE_SIZE`]).
    pub fn new(algorithm: Algorithm, backends: Vec<Backend>) -> Result<Self, MaglevError> {
        Self::with_table_size(algorithm, backends, DEFAULT_TABLE_SIZE)
    }

    /// As [`Balancer::new`] with an explicit Maglev table size (a prime).
    ///
    /// The backends are sorted by address first, so that every node (and every dataplane) that
    /// is given the same set builds the same cycle, slots and table whatever order the set came
    /// in; indices returned by [`Balancer::pick`] refer to [`Balancer::backends`].
    pub fn with_table_size(
        algorithm: Algorithm,
        mut backends: Vec<Backend>,
        table_size: u32,
    ) -> Result<Self, MaglevError> {
        backends.sort_by_key(|b| b.addr);
        let weights: Vec<u32> = backends.iter().map(|b| b.weight).collect();
        let slots = match algorithm {
            // Plain rr ignores weights except 0 (quiesced), as IPVS's rr does.
            Algorithm::RoundRobin => select::wrr_schedule(
                &weights
                    .iter()
                    .map(|w| u32::from(*w > 0))
                    .collect::<Vec<_>>(),
            ),
            Algorithm::WeightedRoundRobin => select::wrr_schedule(&weights),
            Algorithm::SourceHash | Algorithm::DestinationHash => select::hash_slots(&weights),
            _ => Vec::new(),
        };
        let maglev = if algorithm == Algorithm::Maglev {
            let live: Vec<(SocketAddr, u32)> = backends
                .iter()
                .filter(|b| b.weight > 0)
                .map(|b| (b.addr, b.weight))
                .collect();
            let table = MaglevTable::build(&live, table_size)?;
            // Table entries index `live`; map them back to indices into `backends`.
            let back: Vec<u32> = backends
                .iter()
                .enumerate()
                .filter(|(_, b)| b.weight > 0)
                .map(|(i, _)| i as u32)
                .collect();
            Some(table.remap(&back))
        } else {
            None
        };
        Ok(Self {
            algorithm,
            backends,
            weights,
            slots,
            maglev,
            maglev_ignores_port: false,
        })
    }

    /// Makes Maglev hash only the client address (for services with ClientIP affinity, as
    /// Cilium does), so all of a client's connections land on one endpoint.
    pub fn maglev_by_address_only(mut self, yes: bool) -> Self {
        self.maglev_ignores_port = yes;
        self
    }

    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    pub fn backends(&self) -> &[Backend] {
        &self.backends
    }

    /// The rr/wrr cycle or the sh/dh slot list (empty for other algorithms).
    pub fn slots(&self) -> &[usize] {
        &self.slots
    }

    pub fn maglev_table(&self) -> Option<&MaglevTable> {
        self.maglev.as_ref()
    }

    /// The hash key a flow is balanced on (sh: client address; dh: destination address and
    /// port; maglev: client address and port, or address only); `None` for other algorithms.
    pub fn flow_key(&self, flow: &Flow) -> Option<FlowKeyBytes> {
        match self.algorithm {
            Algorithm::SourceHash => Some(FlowKeyBytes::addr(flow.client.ip())),
            Algorithm::DestinationHash => Some(FlowKeyBytes::addr_port(
                flow.destination.ip(),
                flow.destination.port(),
            )),
            Algorithm::Maglev if self.maglev_ignores_port => {
                Some(FlowKeyBytes::addr(flow.client.ip()))
            }
            Algorithm::Maglev => Some(FlowKeyBytes::addr_port(
                flow.client.ip(),
                flow.client.port(),
            )),
            _ => None,
        }
    }

    /// Picks an endpoint index for a new flow, or `None` when no endpoint is eligible.
    /// `ticket` is a per-service counter the caller increments per pick (rr, wrr, and the tie
    /// rotation of lc/sed/nq); `rng` is used by `random` only.
    pub fn pick<V: EndpointView + ?Sized, R: Rng + ?Sized>(
        &self,
        flow: &Flow,
        ticket: u64,
        view: &V,
        rng: &mut R,
    ) -> Option<usize> {
        let w = &self.weights;
        let eligible = |i: usize| w[i] > 0 && view.eligible(i);
        match self.algorithm {
            Algorithm::RoundRobin | Algorithm::WeightedRoundRobin => {
                select::round_robin(&self.slots, ticket, eligible)
            }
            Algorithm::Random => select::random(w, eligible, rng),
            Algorithm::LeastConnection => select::least_connection(w, ticket, view),
            Algorithm::ShortestExpectedDelay => select::shortest_expected_delay(w, ticket, view),
            Algorithm::NeverQueue => select::never_queue(w, ticket, view),
            Algorithm::SourceHash => {
                let key = FlowKeyBytes::addr(flow.client.ip());
                let slot = nft_jhash(key.as_bytes(), SEED_SOURCE, self.slots.len() as u32);
                select::hashed(&self.slots, slot, eligible)
            }
            Algorithm::DestinationHash => {
                let key = FlowKeyBytes::addr_port(flow.destination.ip(), flow.destination.port());
                let slot = nft_jhash(key.as_bytes(), SEED_DESTINATION, self.slots.len() as u32);
                select::hashed(&self.slots, slot, eligible)
            }
            Algorithm::Maglev => {
                let table = self.maglev.as_ref()?;
                let key = self.flow_key(flow)?;
                let slot = table.slot_for(&key)? as usize;
                let entries = table.entries();
                // The slot's owner, else walk the table to the next eligible owner.
                (0..entries.len())
                    .map(|k| entries[(slot + k) % entries.len()] as usize)
                    .find(|&i| eligible(i))
            }
        }
    }
}
