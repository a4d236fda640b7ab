//! Algorithm unit tests: rr order, weights, lc/sed/nq under simulated load, hash stability,
//! Maglev balance and disruption on 100 endpoints, and properties over random inputs.
#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns

use std::collections::{BTreeMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use expect_test::expect;
use proptest::prelude::*;
use rand::SeedableRng;
use rand::rngs::StdRng;
use svcnet_lb::maglev::{DEFAULT_TABLE_SIZE, MaglevTable};
use svcnet_lb::select::wrr_schedule;
use svcnet_lb::{Algorithm, Backend, Balancer, EndpointView, Flow, NoLoad};

fn addr(i: usize) -> SocketAddr {
    SocketAddr::new(
        IpAddr::V4(Ipv4Addr::new(10, 244, (i / 250) as u8, (i % 250 + 2) as u8)),
        8080,
    )
}

fn backends(weights: &[u32]) -> Vec<Backend> {
    weights
        .iter()
        .enumerate()
        .map(|(i, w)| Backend {
            addr: addr(i),
            weight: *w,
        })
        .collect()
}

fn flow(client: u32, port: u16) -> Flow {
    Flow {
        client: SocketAddr::new(
            IpAddr::V4(Ipv4Addr::from(0x0a63_0000u32.wrapping_add(client))),
            port,
        ),
        destination: "10.96.0.10:80".parse().unwrap(),
    }
}

fn picks(b: &Balancer, n: u64, view: &dyn EndpointView) -> Vec<usize> {
    let mut rng = StdRng::seed_from_u64(1);
    (0..n)
        .map(|t| b.pick(&flow(t as u32, 40_000), t, view, &mut rng).unwrap())
        .collect()
}

#[test]
fn round_robin_visits_each_endpoint_in_turn_and_skips_down_ones() {
    let b = Balancer::new(Algorithm::RoundRobin, backends(&[1, 1, 1])).unwrap();
    assert_eq!(picks(&b, 7, &NoLoad), [0, 1, 2, 0, 1, 2, 0]);
    // Endpoint 1 down: its turn goes to the next one.
    let down = |i: usize| i != 1;
    assert_eq!(picks(&b, 6, &down), [0, 2, 2, 0, 2, 2]);
    // Weights do not matter for rr, except 0 (quiesced).
    let b = Balancer::new(Algorithm::RoundRobin, backends(&[5, 0, 1])).unwrap();
    assert_eq!(picks(&b, 4, &NoLoad), [0, 2, 0, 2]);
    let none = |_: usize| false;
    let mut rng = StdRng::seed_from_u64(1);
    assert_eq!(b.pick(&flow(1, 1), 0, &none, &mut rng), None);
}

#[test]
fn weighted_round_robin_is_smooth_and_proportional() {
    assert_eq!(wrr_schedule(&[5, 1, 1]), [0, 0, 1, 0, 2, 0, 0]);
    assert_eq!(wrr_schedule(&[2, 4]), [1, 0, 1]);
    assert_eq!(wrr_schedule(&[0, 0]), Vec::<usize>::new());
    let b = Balancer::new(Algorithm::WeightedRoundRobin, backends(&[3, 1, 6])).unwrap();
    let mut count = [0usize; 3];
    for i in picks(&b, 1_000, &NoLoad) {
        count[i] += 1;
    }
    assert_eq!(count, [300, 100, 600]);
}

#[test]
fn random_is_weighted_and_reproducible_with_a_seed() {
    let b = Balancer::new(Algorithm::Random, backends(&[1, 2, 1])).unwrap();
    let run = |seed| {
        let mut rng = StdRng::seed_from_u64(seed);
        (0..8_000u64)
            .map(|t| b.pick(&flow(0, 0), t, &NoLoad, &mut rng).unwrap())
            .collect::<Vec<_>>()
    };
    assert_eq!(run(7), run(7), "same seed, same choices");
    let mut count = [0f64; 3];
    for i in run(7) {
        count[i] += 1.0;
    }
    // Expected 2000/4000/2000; 5 standard deviations is about ±200.
    for (c, want) in count.iter().zip([2_000.0, 4_000.0, 2_000.0]) {
        assert!((c - want).abs() < 200.0, "{count:?}");
    }
}

/// A discrete-time load simulation: one connection arrives per tick; a connection to endpoint
/// `i` lasts `durations[i]` ticks. Returns connections per endpoint and the peak of active
/// connections on any endpoint.
fn simulate(alg: Algorithm, weights: &[u32], durations: &[u64], ticks: u64) -> (Vec<u64>, u32) {
    struct Load(Vec<u32>);
    impl EndpointView for Load {
        fn active(&self, i: usize) -> u32 {
            self.0[i]
        }
    }
    let b = Balancer::new(alg, backends(weights)).unwrap();
    let mut load = Load(vec![0; weights.len()]);
    let mut ends: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
    let mut total = vec![0u64; weights.len()];
    let mut peak = 0;
    let mut rng = StdRng::seed_from_u64(3);
    for t in 0..ticks {
        for i in ends.remove(&t).unwrap_or_default() {
            load.0[i] -= 1;
        }
        let i = b.pick(&flow(t as u32, 1), t, &load, &mut rng).unwrap();
        load.0[i] += 1;
        total[i] += 1;
        peak = peak.max(load.0[i]);
        ends.entry(t + durations[i]).or_default().push(i);
    }
    (total, peak)
}

#[test]
fn least_connection_steers_away_from_a_slow_endpoint() {
    // Endpoint 0 holds each connection 20 ticks, the others 2: round robin piles connections
    // on the slow one, least-connection keeps every endpoint's queue short.
    let durations = [20, 2, 2, 2];
    let (rr, rr_peak) = simulate(Algorithm::RoundRobin, &[1; 4], &durations, 4_000);
    let (lc, lc_peak) = simulate(Algorithm::LeastConnection, &[1; 4], &durations, 4_000);
    assert_eq!(rr, [1_000; 4]);
    assert!(rr_peak >= 5, "rr peak {rr_peak}");
    assert!(lc_peak <= 2, "lc peak {lc_peak}");
    assert!(lc[0] < 300, "slow endpoint got {} of 4000 under lc", lc[0]);
}

#[test]
fn shortest_expected_delay_follows_weights_and_never_queue_prefers_idle() {
    // Connections that never end: sed fills endpoints in proportion to their weights.
    let (sed, _) = simulate(
        Algorithm::ShortestExpectedDelay,
        &[1, 3],
        &[u64::MAX / 2; 2],
        400,
    );
    assert_eq!(sed, [100, 300]);
    // A busy heavy endpoint versus an idle light one: sed still picks by ratio, nq takes the
    // idle one (it "never queues" behind a busy endpoint).
    struct Fixed;
    impl EndpointView for Fixed {
        fn active(&self, i: usize) -> u32 {
            [3, 0, 2][i]
        }
    }
    let mut rng = StdRng::seed_from_u64(0);
    let sed = Balancer::new(Algorithm::ShortestExpectedDelay, backends(&[10, 1, 1])).unwrap();
    let nq = Balancer::new(Algorithm::NeverQueue, backends(&[10, 1, 1])).unwrap();
    assert_eq!(sed.pick(&flow(1, 1), 0, &Fixed, &mut rng), Some(0));
    assert_eq!(nq.pick(&flow(1, 1), 0, &Fixed, &mut rng), Some(1));
    // Without an idle endpoint nq behaves as sed.
    let (nq_total, _) = simulate(Algorithm::NeverQueue, &[1, 3], &[u64::MAX / 2; 2], 400);
    assert_eq!(nq_total, [100, 300]);
}

#[test]
fn hashing_is_stable_and_independent_of_input_order() {
    let table = |alg: Algorithm, order: &[usize]| {
        let list: Vec<Backend> = order.iter().map(|i| backends(&[1; 5])[*i]).collect();
        let b = Balancer::with_table_size(alg, list, 251).unwrap();
        let mut rng = StdRng::seed_from_u64(0);
        (0..12u32)
            .map(|c| {
                let i = b
                    .pick(&flow(c, 1000 + c as u16), 0, &NoLoad, &mut rng)
                    .unwrap();
                b.backends()[i].addr.ip().to_string()
            })
            .collect::<Vec<_>>()
    };
    for alg in [Algorithm::SourceHash, Algorithm::Maglev] {
        assert_eq!(table(alg, &[0, 1, 2, 3, 4]), table(alg, &[4, 2, 0, 3, 1]));
    }
    // Pinned: nodes running different svcnet versions must keep agreeing, and the nftables
    // dataplane evaluates the same hashes. A change here is a compatibility break.
    let sh = table(Algorithm::SourceHash, &[0, 1, 2, 3, 4]).join(" ");
    let mg = table(Algorithm::Maglev, &[0, 1, 2, 3, 4]).join(" ");
    expect![[r#"
        sh: 10.244.0.3 10.244.0.3 10.244.0.2 10.244.0.6 10.244.0.2 10.244.0.3 10.244.0.4 10.244.0.6 10.244.0.3 10.244.0.5 10.244.0.4 10.244.0.5
        maglev: 10.244.0.6 10.244.0.3 10.244.0.5 10.244.0.6 10.244.0.4 10.244.0.6 10.244.0.4 10.244.0.5 10.244.0.6 10.244.0.4 10.244.0.4 10.244.0.3"#]].assert_eq(&format!("sh: {sh}\nmaglev: {mg}"));
    // dh depends on the destination only: every client of one frontend gets one endpoint.
    let b = Balancer::new(Algorithm::DestinationHash, backends(&[1; 5])).unwrap();
    let chosen: HashSet<usize> = picks(&b, 50, &NoLoad).into_iter().collect();
    assert_eq!(chosen.len(), 1);
    // A down endpoint moves only its own clients under sh.
    let b = Balancer::new(Algorithm::SourceHash, backends(&[1; 5])).unwrap();
    let before = picks(&b, 200, &NoLoad);
    let after = picks(&b, 200, &|i: usize| i != 2);
    for (x, y) in before.iter().zip(&after) {
        assert!(x == y || *x == 2, "{x} moved to {y}");
        assert_ne!(*y, 2);
    }
}

fn maglev(n: usize) -> (Vec<(SocketAddr, u32)>, MaglevTable) {
    let list: Vec<(SocketAddr, u32)> = (0..n).map(|i| (addr(i), 1)).collect();
    let t = MaglevTable::build(&list, DEFAULT_TABLE_SIZE).unwrap();
    (list, t)
}

/// Fraction of slots whose owner (by address) differs between two tables.
fn moved(
    a: &(Vec<(SocketAddr, u32)>, MaglevTable),
    b: &(Vec<(SocketAddr, u32)>, MaglevTable),
) -> f64 {
    let owner =
        |t: &(Vec<(SocketAddr, u32)>, MaglevTable), s: usize| t.0[t.1.entries()[s] as usize].0;
    let m = a.1.entries().len();
    (0..m).filter(|&s| owner(a, s) != owner(b, s)).count() as f64 / m as f64
}

/// The paper's population (Algorithm 1 of Eisenbud et al., offset and skip from two hashes of
/// each backend's name) with *ideal* random permutations, N = 100, M = 65537, 20 draws
/// (`paper_model` below; 20 draws of a Python twin of it): adding a 101st backend moves
/// 1.50–1.65 % of the slots (median 1.56 %), removing one 1.53–1.61 % (median 1.56 %). Only
/// 0.99 % must move (the new backend's share); the rest is the algorithm's own cascade (a
/// displaced backend takes its next preferred slot from another), which the paper trades for
/// exact balance. The bound below is that model's worst draw, so a weaker permutation (for
/// example correlated offset/skip hashes, or a table whose order depends on insertion) fails.
const PAPER_SINGLE_CHANGE_MAX: f64 = 0.0165;

#[test]
fn maglev_balance_and_disruption_on_100_endpoints() {
    let base = maglev(100);
    let shares = base.1.shares(100);
    let (lo, hi) = (65_537 / 100, 65_537 / 100 + 1);
    assert!(shares.iter().all(|s| *s == lo || *s == hi), "{shares:?}");

    // Adding a 101st endpoint: it takes exactly its share, and the total moved stays within
    // what the paper's algorithm does.
    let grown = maglev(101);
    let newcomer = grown.1.shares(101)[100];
    assert!(
        newcomer == 65_537 / 101 || newcomer == 65_537 / 101 + 1,
        "{newcomer}"
    );
    let add = moved(&base, &grown);
    assert!(
        (newcomer as f64 / 65_537.0..=PAPER_SINGLE_CHANGE_MAX).contains(&add),
        "adding one moved {:.3} %",
        add * 100.0
    );
    // Removing one (every tenth, in turn): its slots must move; others barely.
    let mut removes = Vec::new();
    for gone in (0..100).step_by(10) {
        let mut list = base.0.clone();
        list.remove(gone);
        let t = MaglevTable::build(&list, DEFAULT_TABLE_SIZE).unwrap();
        let remove = moved(&base, &(list, t));
        let own = shares[gone] as f64 / 65_537.0;
        assert!(
            (own..=PAPER_SINGLE_CHANGE_MAX).contains(&remove),
            "removing endpoint {gone} moved {:.3} %",
            remove * 100.0
        );
        removes.push(remove * 100.0);
    }
    removes.sort_by(|a, b| a.total_cmp(b));
    println!(
        "maglev M=65537 N=100: shares {lo}..{hi}, add one moved {:.3} % (newcomer {newcomer} slots), remove one moved {:.3}..{:.3} %",
        add * 100.0,
        removes[0],
        removes[removes.len() - 1]
    );
}

/// Algorithm 1 of the paper, written from its pseudo-code and independent of `MaglevTable`:
/// `perms[i] = (offset, skip)`; returns slot → backend.
fn paper_model(perms: &[(u64, u64)], m: u64) -> Vec<usize> {
    let mut entry = vec![usize::MAX; m as usize];
    let mut next = vec![0u64; perms.len()];
    let mut n = 0;
    loop {
        for (i, (offset, skip)) in perms.iter().enumerate() {
            let mut c = (offset + next[i] * skip) % m;
            while entry[c as usize] != usize::MAX {
                next[i] += 1;
                c = (offset + next[i] * skip) % m;
            }
            entry[c as usize] = i;
            next[i] += 1;
            n += 1;
            if n == m {
                return entry;
            }
        }
    }
}

#[test]
fn maglev_paper_algorithm_moves_more_than_the_minimum_too() {
    // With ideal random permutations the paper's algorithm itself moves ~1.5 % of the slots
    // when a 101st backend joins (0.99 % is the minimum): the cascade is the algorithm's, and
    // our table (1.54 %) is within its range.
    use rand::Rng;
    let m = u64::from(DEFAULT_TABLE_SIZE);
    for seed in 0..3u64 {
        let mut rng = StdRng::seed_from_u64(seed);
        let perms: Vec<(u64, u64)> = (0..101)
            .map(|_| (rng.random_range(0..m), rng.random_range(1..m)))
            .collect();
        let (a, b) = (paper_model(&perms[..100], m), paper_model(&perms, m));
        let moved = a.iter().zip(&b).filter(|(x, y)| x != y).count() as f64 / m as f64;
        println!(
            "paper model, draw {seed}: add one moved {:.3} %",
            moved * 100.0
        );
        assert!(
            (0.014..=PAPER_SINGLE_CHANGE_MAX).contains(&moved),
            "draw {seed}: {moved}"
        );
    }
}

#[test]
fn maglev_weights_are_proportional() {
    let list = vec![(addr(0), 1), (addr(1), 2), (addr(2), 1)];
    let t = MaglevTable::build(&list, 251).unwrap();
    let s = t.shares(3);
    assert_eq!(s.iter().sum::<u32>(), 251);
    assert!((s[1] as i64 - 2 * s[0] as i64).abs() <= 2, "{s:?}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn maglev_each_backend_gets_floor_or_ceil(n in 1usize..60, seed in any::<u64>()) {
        let mut list: Vec<(SocketAddr, u32)> = (0..n).map(|i| (addr(i), 1)).collect();
        // Any order yields the same table (by address).
        let mut rng = StdRng::seed_from_u64(seed);
        use rand::seq::SliceRandom;
        let t1 = MaglevTable::build(&list, 251).unwrap();
        list.shuffle(&mut rng);
        let t2 = MaglevTable::build(&list, 251).unwrap();
        let owners = |t: &MaglevTable, l: &[(SocketAddr, u32)]| -> Vec<SocketAddr> {
            t.entries().iter().map(|e| l[*e as usize].0).collect()
        };
        let sorted: Vec<_> = { let mut l = list.clone(); l.sort(); l };
        prop_assert_eq!(owners(&t1, &sorted), owners(&t2, &list));
        let (lo, hi) = (251 / n as u32, 251_u32.div_ceil(n as u32));
        for s in t2.shares(n) {
            prop_assert!(s == lo || s == hi, "share {} not in {}..={}", s, lo, hi);
        }
    }

    #[test]
    fn every_algorithm_picks_only_eligible_endpoints(
        weights in proptest::collection::vec(0u32..4, 1..8),
        down in proptest::collection::vec(any::<bool>(), 8),
        ticket in any::<u64>(),
        client in any::<u32>(),
    ) {
        let eligible = |i: usize| !down[i];
        for alg in Algorithm::ALL {
            let b = Balancer::with_table_size(alg, backends(&weights), 251).unwrap();
            let mut rng = StdRng::seed_from_u64(ticket);
            let any = (0..weights.len()).any(|i| b.backends()[i].weight > 0 && eligible(i));
            match b.pick(&flow(client, 5), ticket, &eligible, &mut rng) {
                Some(i) => prop_assert!(b.backends()[i].weight > 0 && eligible(i), "{alg} picked {i}"),
                None => prop_assert!(!any, "{alg} found nothing although one was eligible"),
            }
        }
    }

    #[test]
    fn wrr_cycle_counts_equal_reduced_weights(weights in proptest::collection::vec(0u32..20, 1..10)) {
        let s = wrr_schedule(&weights);
        let g = weights.iter().fold(0u32, |g, w| num_gcd(g, *w));
        for (i, w) in weights.iter().enumerate() {
            let want = w.checked_div(g).unwrap_or(0) as usize;
            prop_assert_eq!(s.iter().filter(|x| **x == i).count(), want);
        }
    }
}

fn num_gcd(a: u32, b: u32) -> u32 {
    if b == 0 { a } else { num_gcd(b, a % b) }
}
