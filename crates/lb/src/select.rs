//! The individual schedulers as small pure functions over endpoint indices. [`crate::Balancer`]
//! combines them; they are public so dataplanes that precompute rules (nftables' `numgen inc`
//! slot maps, `jhash` maps) render exactly the sequence the userspace dataplane follows.
//!
//! Conventions: endpoints are indices `0..n`; weight 0 means quiesced (never picked, as IPVS);
//! `eligible(i)` is false for endpoints that are marked down or were already tried for this
//! connection; a `ticket` is a per-service counter value that makes rotation deterministic.

use rand::Rng;

use crate::balancer::EndpointView;

/// Longest weighted round-robin cycle; larger weight sums are scaled down proportionally.
pub const MAX_SCHEDULE: u64 = 1 << 16;

/// The weighted round-robin cycle: endpoint indices in the order successive connections get
/// them, each index appearing in proportion to its weight, interleaved smoothly (nginx's
/// "smooth weighted round robin": weights 5,1,1 give `a a b a c a a`, never `a a a a a b c`).
/// With equal weights this is plain round robin `0 1 2 …`. Weight-0 endpoints never appear.
pub fn wrr_schedule(weights: &[u32]) -> Vec<usize> {
    wrr_schedule_within(weights, MAX_SCHEDULE)
}

/// [`wrr_schedule`] with a cycle of about `max` entries at most: larger weight sums are scaled
/// down proportionally (every endpoint with a weight keeps at least one entry, so a cycle
/// is never shorter than the number of weighted endpoints).
pub fn wrr_schedule_within(weights: &[u32], max: u64) -> Vec<usize> {
    let g = weights.iter().fold(0u32, |g, w| gcd(g, *w));
    if g == 0 {
        return Vec::new();
    }
    let mut w: Vec<u64> = weights.iter().map(|w| u64::from(*w / g)).collect();
    let total: u64 = w.iter().sum();
    if total > max {
        for x in w.iter_mut().filter(|x| **x > 0) {
            *x = (*x * max / total).max(1);
        }
    }
    let total: i64 = w.iter().map(|x| *x as i64).sum();
    let mut current = vec![0i64; w.len()];
    let mut out = Vec::with_capacity(total as usize);
    for _ in 0..total {
        let mut best = usize::MAX;
        for (i, wi) in w.iter().enumerate() {
            if *wi == 0 {
                continue;
            }
            current[i] += *wi as i64;
            if best == usize::MAX || current[i] > current[best] {
                best = i;
            }
        }
        current[best] -= total;
        out.push(best);
    }
    out
}

/// Round robin over a schedule: the entry at `ticket`, or the next eligible one after it.
pub fn round_robin(
    schedule: &[usize],
    ticket: u64,
    eligible: impl Fn(usize) -> bool,
) -> Option<usize> {
    let len = schedule.len() as u64;
    if len == 0 {
        return None;
    }
    (0..len)
        .map(|k| schedule[((ticket % len + k) % len) as usize])
        .find(|&i| eligible(i))
}

/// Weighted random choice among eligible endpoints.
pub fn random<R: Rng + ?Sized>(
    weights: &[u32],
    eligible: impl Fn(usize) -> bool,
    rng: &mut R,
) -> Option<usize> {
    let total: u64 = (0..weights.len())
        .filter(|&i| eligible(i))
        .map(|i| u64::from(weights[i]))
        .sum();
    if total == 0 {
        return None;
    }
    let mut r = rng.random_range(0..total);
    for (i, w) in weights.iter().enumerate() {
        if !eligible(i) || *w == 0 {
            continue;
        }
        if r < u64::from(*w) {
            return Some(i);
        }
        r -= u64::from(*w);
    }
    None
}

/// Candidates in rotated order: ties between equally loaded endpoints go to the first one
/// after `ticket`, so equal load spreads over all of them instead of piling on index 0.
fn rotated<V: EndpointView + ?Sized>(
    weights: &[u32],
    ticket: u64,
    view: &V,
) -> impl Iterator<Item = usize> {
    let n = weights.len();
    let start = if n == 0 {
        0
    } else {
        (ticket % n as u64) as usize
    };
    let ok: Vec<usize> = (0..n)
        .map(|k| (start + k) % n)
        .filter(|&i| weights[i] > 0 && view.eligible(i))
        .collect();
    ok.into_iter()
}

/// Least connections (IPVS `lc`): the fewest active connections; weights only quiesce (0).
pub fn least_connection<V: EndpointView + ?Sized>(
    weights: &[u32],
    ticket: u64,
    view: &V,
) -> Option<usize> {
    rotated(weights, ticket, view).min_by_key(|&i| view.active(i))
}

/// Shortest expected delay (IPVS `sed`): minimal `(active + 1) / weight`.
pub fn shortest_expected_delay<V: EndpointView + ?Sized>(
    weights: &[u32],
    ticket: u64,
    view: &V,
) -> Option<usize> {
    let mut best: Option<usize> = None;
    for i in rotated(weights, ticket, view) {
        best = match best {
            None => Some(i),
            // (a_i + 1) / w_i < (a_b + 1) / w_b  ⇔  (a_i + 1) · w_b < (a_b + 1) · w_i
            Some(b) => {
                let lhs = (u64::from(view.active(i)) + 1) * u64::from(weights[b]);
                let rhs = (u64::from(view.active(b)) + 1) * u64::from(weights[i]);
                Some(if lhs < rhs { i } else { b })
            }
        };
    }
    best
}

/// Never queue (IPVS `nq`): an endpoint with no active connection if there is one (the first
/// after the ticket's rotation), otherwise as [`shortest_expected_delay`].
pub fn never_queue<V: EndpointView + ?Sized>(
    weights: &[u32],
    ticket: u64,
    view: &V,
) -> Option<usize> {
    rotated(weights, ticket, view)
        .find(|&i| view.active(i) == 0)
        .or_else(|| shortest_expected_delay(weights, ticket, view))
}

/// Expands weights into hash slots: endpoint `i` owns `weights[i] / gcd` consecutive slots
/// (the element list of an nftables `jhash … mod <len> vmap`).
pub fn hash_slots(weights: &[u32]) -> Vec<usize> {
    let g = weights.iter().fold(0u32, |g, w| gcd(g, *w));
    if g == 0 {
        return Vec::new();
    }
    let total: u64 = weights.iter().map(|w| u64::from(*w / g)).sum();
    let scale = |w: u32| {
        let w = u64::from(w / g);
        if total > MAX_SCHEDULE && w > 0 {
            (w * MAX_SCHEDULE / total).max(1)
        } else {
            w
        }
    };
    weights
        .iter()
        .enumerate()
        .flat_map(|(i, w)| std::iter::repeat_n(i, scale(*w) as usize))
        .collect()
}

/// The endpoint at hash slot `slot`, or — when it is not eligible — the next eligible one in
/// slot order (IPVS `sh`'s fallback: the flow moves, but deterministically).
pub fn hashed(slots: &[usize], slot: u32, eligible: impl Fn(usize) -> bool) -> Option<usize> {
    let len = slots.len();
    (0..len)
        .map(|k| slots[(slot as usize + k) % len])
        .find(|&i| eligible(i))
}

pub(crate) fn gcd(a: u32, b: u32) -> u32 {
    if b == 0 { a } else { gcd(b, a % b) }
}
