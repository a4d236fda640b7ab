//! The rule table (`tests/rules.txt`, the same cases `src/zone/tests.rs` runs against the pure
//! zone) run against the real server with `dig`, over UDP and over TCP. One server per pod mode,
//! each synced with the table's snapshot; forwarded and chased names go to a fake upstream on
//! another loopback port. Sections are compared as sets (headless answers are shuffled).

#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::sync::Arc;

use futures::StreamExt;
use svcnet_dns::fake_upstream::FakeUpstream;
use svcnet_dns::rule_table::{self, SERIAL, Wire};
use svcnet_dns::{DnsServer, Zone};

/// What `dig` printed, normalised to `Response`'s text: the rcode, then each section's records
/// (`owner TTL class type rdata`, single-spaced, TXT unquoted) sorted; plus whether `aa` was set.
#[derive(Debug)]
struct Seen {
    text: String,
    authoritative: bool,
}

fn normalize(out: &str) -> Seen {
    let mut status = String::from("(no status line)");
    let mut authoritative = false;
    let mut sections: Vec<(String, Vec<String>)> = Vec::new();
    for line in out.lines() {
        if let Some(rest) = line.split("status: ").nth(1) {
            status = rest.split(',').next().unwrap_or("").to_string();
        } else if let Some(rest) = line.strip_prefix(";; flags: ") {
            let flags = rest.split(';').next().unwrap_or("");
            authoritative = flags.split_whitespace().any(|f| f == "aa");
        } else if let Some(title) = line
            .strip_prefix(";; ")
            .and_then(|l| l.strip_suffix(" SECTION:"))
        {
            sections.push((title.to_lowercase(), Vec::new()));
        } else if !line.starts_with(';')
            && !line.trim().is_empty()
            && let Some((_, lines)) = sections.last_mut()
        {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let mut record = fields.join(" ");
            if fields.get(3) == Some(&"TXT") {
                record = record.replace('"', "");
            }
            lines.push(record);
        }
    }
    let mut text = format!("{status}\n");
    for (title, mut lines) in sections {
        if lines.is_empty() {
            continue;
        }
        lines.sort();
        text.push_str(&format!("{title}:\n"));
        for l in lines {
            text.push_str(&format!("  {l}\n"));
        }
    }
    Seen {
        text,
        authoritative,
    }
}

/// `expected` equals `got`, except that TTLs of records from the upstream (served from the
/// forwarder's cache, which ages them) may be lower by up to `aged` seconds (the time since
/// the upstream first answered, rounded up).
fn matches(expected: &str, got: &str, cluster_ttls: &[&str], aged: u32) -> bool {
    let (e, g): (Vec<&str>, Vec<&str>) = (expected.lines().collect(), got.lines().collect());
    e.len() == g.len()
        && e.iter().zip(&g).all(|(e, g)| {
            if e == g {
                return true;
            }
            let (ef, gf): (Vec<&str>, Vec<&str>) = (e.split(' ').collect(), g.split(' ').collect());
            let ttl = |f: &[&str]| f.get(3).and_then(|t| t.parse::<u32>().ok());
            ef.len() == gf.len()
                && !cluster_ttls.contains(&ef.get(3).copied().unwrap_or(""))
                && ef
                    .iter()
                    .zip(&gf)
                    .enumerate()
                    .all(|(i, (a, b))| i == 3 || a == b)
                && matches!((ttl(&ef), ttl(&gf)), (Some(x), Some(y)) if y <= x && x - y <= aged)
        })
}

async fn dig(addr: SocketAddr, query: &str, tcp: bool) -> String {
    let mut parts = query.split_whitespace();
    let (name, qtype) = (parts.next().unwrap(), parts.next().unwrap());
    let class = parts.next().unwrap_or("IN");
    let out = tokio::process::Command::new("dig")
        .arg(format!("@{}", addr.ip()))
        .args(["-p", &addr.port().to_string()])
        .args(["-q", name, "-t", qtype, "-c", class])
        .args([
            "+noall",
            "+answer",
            "+authority",
            "+additional",
            "+comments",
            // A second try after 3 s, as every resolver does, so a loaded CI machine does not
            // fail a query by timing; the server's own ledger (checked after each round) must
            // still show every datagram it received answered.
            "+tries=2",
            "+time=3",
            "+nocookie",
            if tcp { "+tcp" } else { "+notcp" },
        ])
        .output()
        .await
        .expect("dig must be installed (bind9-dnsutils)");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rule_table_over_udp_and_tcp() {
    let upstream = FakeUpstream::start(rule_table::upstream_records().unwrap())
        .await
        .unwrap();
    let cases = rule_table::cases().unwrap();
    let mut servers = Vec::new();
    for (mode, options) in rule_table::setups(&cases) {
        let config = Arc::new(rule_table::zone_config(mode, &options).unwrap());
        let server = DnsServer::start(
            "127.0.0.1:0".parse().unwrap(),
            config.clone(),
            vec![upstream.addr()],
        )
        .await
        .unwrap();
        server
            .zone()
            .publish(Zone::build(config, &rule_table::world(), SERIAL));
        servers.push(((mode, options), server));
    }

    // Forwarded answers age in the forwarder's cache from the first round on.
    let started = std::time::Instant::now();
    // Three rounds of the same questions: the first two take the general path (an answer is
    // kept on its second miss), the third is answered from each zone's answer cache, and must
    // be the same.
    for round in 1..=3 {
        let mut jobs = Vec::new();
        let mut skipped = 0;
        for case in &cases {
            let expected = match &case.wire {
                Wire::Same => case.expected.clone(),
                Wire::Expect(text) => text.clone(),
                Wire::Skip(_) => {
                    skipped += 1;
                    continue;
                }
            };
            // The zone's own answers are authoritative; forwarded ones are the upstream's.
            let authoritative = case.expected != "forward\n";
            let setup = (case.pods, case.options.clone());
            let addr = servers
                .iter()
                .find(|(s, _)| *s == setup)
                .unwrap()
                .1
                .local_addr();
            for query in &case.queries {
                for tcp in [false, true] {
                    let expected = expected.clone();
                    jobs.push(async move {
                        let raw = dig(addr, query, tcp).await;
                        let seen = normalize(&raw);
                        let transport = if tcp { "TCP" } else { "UDP" };
                        let mut problems = Vec::new();
                        let aged = started.elapsed().as_secs() as u32 + 1;
                        if !matches(&expected, &seen.text, &["30", "28800"], aged) {
                            problems.push(format!("--- expected\n{expected}--- got\n{}", seen.text));
                        }
                        if seen.authoritative != authoritative {
                            problems.push(format!("aa is {}, want {authoritative}", seen.authoritative));
                        }
                        (!problems.is_empty()).then(|| {
                            format!(
                                "round {round}: tests/rules.txt:{} {query} over {transport}:\n{}\n(dig printed:\n{raw})",
                                case.line,
                                problems.join("\n")
                            )
                        })
                    });
                }
            }
        }
        let total = jobs.len();
        let failures: Vec<String> = futures::stream::iter(jobs)
            .buffer_unordered(8)
            .filter_map(|r| async move { r })
            .collect()
            .await;
        assert!(total >= 100, "only {total} dig queries ran");
        assert!(skipped <= 2, "{skipped} cases skipped over the wire");
        assert!(
            failures.is_empty(),
            "{} of {total} dig queries differ:\n{}",
            failures.len(),
            failures.join("\n\n")
        );
        for (mode, server) in &servers {
            // An answer is counted just after its send returns, which dig may beat.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
            let mut st = server.udp_stats();
            while st.answered < st.received && std::time::Instant::now() < deadline {
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                st = server.udp_stats();
            }
            assert!(
                st.received > 0
                    && st.answered == st.received
                    && st.dropped == 0
                    && st.send_failed == 0,
                "round {round}, pods {mode:?}: a UDP question went unanswered: {st:?}"
            );
        }
    }
    let kept: usize = servers.iter().map(|(_, s)| s.zone().cache_stats().0).sum();
    assert!(kept >= 50, "only {kept} answers kept after two rounds");
}

#[test]
fn normalize_reads_digs_text() {
    let seen = normalize(
        ";; ->>HEADER<<- opcode: QUERY, status: NOERROR, id: 1\n\
         ;; flags: qr aa rd; QUERY: 1, ANSWER: 2, AUTHORITY: 0, ADDITIONAL: 1\n\n\
         ;; OPT PSEUDOSECTION:\n; EDNS: version: 0, flags:; udp: 1232\n\
         ;; ANSWER SECTION:\n\
         b.x.\t\t30\tIN\tA\t10.0.0.2\n\
         a.x.\t\t30\tIN\tTXT\t\"1.1.0\"\n",
    );
    assert!(seen.authoritative);
    assert_eq!(
        seen.text,
        "NOERROR\nanswer:\n  a.x. 30 IN TXT 1.1.0\n  b.x. 30 IN A 10.0.0.2\n"
    );
    assert!(matches(
        "  x. 60 IN A 1.2.3.4",
        "  x. 59 IN A 1.2.3.4",
        &["30"],
        2
    ));
    assert!(!matches(
        "  x. 30 IN A 1.2.3.4",
        "  x. 29 IN A 1.2.3.4",
        &["30"],
        2
    ));
    assert!(!matches(
        "  x. 60 IN A 1.2.3.4",
        "  x. 60 IN A 1.2.3.5",
        &["30"],
        2
    ));
}
