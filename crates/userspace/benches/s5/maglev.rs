//! S9: Maglev table build time, balance and disruption.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Instant;

use svcnet_lb::maglev::MaglevTable;

use crate::report::median;

/// S9: Maglev build time and disruption.
pub(crate) fn maglev() {
    let addr = |i: usize| {
        SocketAddr::new(
            IpAddr::V4(Ipv4Addr::new(10, 244, (i / 250) as u8, (i % 250 + 2) as u8)),
            8080,
        )
    };
    let list = |n: usize| -> Vec<(SocketAddr, u32)> { (0..n).map(|i| (addr(i), 1)).collect() };
    let moved =
        |a: &[(SocketAddr, u32)], ta: &MaglevTable, b: &[(SocketAddr, u32)], tb: &MaglevTable| {
            let m = ta.entries().len();
            (0..m)
                .filter(|&s| a[ta.entries()[s] as usize].0 != b[tb.entries()[s] as usize].0)
                .count() as f64
                / m as f64
        };
    for m in [65_537u32, 655_373] {
        for n in [100usize, 1000] {
            let base = list(n);
            let times: Vec<f64> = (0..if m > 100_000 { 5 } else { 21 })
                .map(|_| {
                    let t = Instant::now();
                    std::hint::black_box(MaglevTable::build(&base, m).unwrap());
                    t.elapsed().as_secs_f64() * 1e3
                })
                .collect();
            let tb = MaglevTable::build(&base, m).unwrap();
            let shares = tb.shares(n);
            let (lo, hi) = (shares.iter().min().unwrap(), shares.iter().max().unwrap());
            let grown = list(n + 1);
            let tg = MaglevTable::build(&grown, m).unwrap();
            let add = moved(&base, &tb, &grown, &tg);
            // k = 1 % of the backends fail: slots that move beyond the failed ones' own.
            let k = (n / 100).max(1);
            let survivors: Vec<_> = base[k..].to_vec();
            let ts = MaglevTable::build(&survivors, m).unwrap();
            let own = (0..m as usize)
                .filter(|&s| (tb.entries()[s] as usize) < k)
                .count() as f64
                / m as f64;
            let fail = moved(&base, &tb, &survivors, &ts);
            println!(
                "S9 maglev M={m} N={n} build_ms={:.2} share_min={lo} share_max={hi} (ideal {}..{}) add_one_moved_pct={:.3} (min {:.3}) fail_{k}_moved_pct={:.3} (their own {:.3})",
                median(times),
                m as usize / n,
                (m as usize).div_ceil(n),
                add * 100.0,
                100.0 / (n + 1) as f64,
                fail * 100.0,
                own * 100.0
            );
        }
    }
}
