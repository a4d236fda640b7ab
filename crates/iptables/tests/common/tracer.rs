//! A test-only packet tracer over `FakeIptables` (kube-proxy has one for its iptables rules).
//! It interprets exactly the rule shapes svcnet's renderer emits — any other match, option or
//! target panics, so a new shape cannot slip past the tests uninterpreted — and follows EVERY
//! branch of `-m statistic --mode random` with its probability mass, so a trace returns the
//! exact distribution of outcomes: which endpoint, masqueraded or not, rejected or dropped.
//!
//! Netfilter order modelled: nat PREROUTING (or nat OUTPUT for packets the node sends),
//! routing (local destination → filter INPUT, else filter FORWARD; OUTPUT for the node's own),
//! then nat POSTROUTING for packets that leave. Conntrack state is always NEW (first packet).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipnet::IpNet;
use svcnet_iptables::fake::FakeTable;
use svcnet_iptables::{FakeIptables, Table};

#[derive(Clone, Debug)]
pub struct Packet {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub proto: &'static str,
    pub dport: u16,
    /// Sent by a process on the node itself (nat/filter OUTPUT instead of PREROUTING).
    pub from_node: bool,
}

/// What the node knows: its own addresses (`addrtype LOCAL`) and which `recent` lists hold
/// the packet's source (affinity state).
#[derive(Clone, Debug, Default)]
pub struct Env {
    pub local_addrs: Vec<IpAddr>,
    pub recent: BTreeSet<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Verdict {
    /// Delivered to `dst` (`ip:port`, after DNAT if any).
    Accept {
        dst: String,
        dnat: bool,
        masquerade: bool,
        recent_set: Vec<String>,
    },
    Drop,
    Reject,
}

#[derive(Clone, Debug)]
struct St {
    dst: IpAddr,
    dport: u16,
    dnat: bool,
    mark: u32,
    masquerade: bool,
    recent_set: Vec<String>,
    p: f64,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum End {
    Return,
    Accept,
    Drop,
    Reject,
}

fn parse_mark(s: &str) -> u32 {
    let s = s.trim_start_matches("0x");
    u32::from_str_radix(s, 16).unwrap_or_else(|_| panic!("bad mark {s}"))
}

fn net_contains(spec: &str, ip: IpAddr) -> bool {
    match spec.parse::<IpNet>() {
        Ok(n) => n.contains(&ip),
        Err(_) => {
            spec.parse::<IpAddr>()
                .unwrap_or_else(|_| panic!("bad address {spec}"))
                == ip
        }
    }
}

struct Tracer<'a> {
    pkt: &'a Packet,
    env: &'a Env,
    depth: usize,
}

/// One rule parsed into what the tracer needs.
struct Parsed {
    /// Deterministic result of every non-statistic match.
    matches: bool,
    probability: Option<f64>,
    recent_set: Option<String>,
    target: Option<(String, Vec<String>)>,
}

impl Tracer<'_> {
    fn parse(&self, st: &St, args: &[String]) -> Parsed {
        let mut p = Parsed {
            matches: true,
            probability: None,
            recent_set: None,
            target: None,
        };
        let mut i = 0;
        let mut neg = false;
        let next = |i: &mut usize| -> &str {
            *i += 1;
            args.get(*i)
                .map(String::as_str)
                .unwrap_or_else(|| panic!("truncated rule {args:?}"))
        };
        while i < args.len() {
            let a = args[i].as_str();
            match a {
                "!" => {
                    neg = true;
                    i += 1;
                    continue;
                }
                "-m" => {
                    let module = next(&mut i);
                    match module {
                        "comment" => {
                            assert_eq!(next(&mut i), "--comment", "{args:?}");
                            next(&mut i);
                        }
                        "tcp" | "udp" | "sctp" => {
                            assert_eq!(args.get(i + 1).map(String::as_str), Some("-p"), "{args:?}");
                            assert_eq!(
                                args.get(i + 2).map(String::as_str),
                                Some(module),
                                "{args:?}"
                            );
                        }
                        "statistic" => {
                            assert_eq!(next(&mut i), "--mode", "{args:?}");
                            let v: f64 = match next(&mut i) {
                                "random" => {
                                    assert_eq!(next(&mut i), "--probability", "{args:?}");
                                    next(&mut i).parse().unwrap()
                                }
                                // One in every N reaching the rule: a share of 1/N.
                                "nth" => {
                                    assert_eq!(next(&mut i), "--every", "{args:?}");
                                    let every: u32 = next(&mut i).parse().unwrap();
                                    assert_eq!(next(&mut i), "--packet", "{args:?}");
                                    assert_eq!(next(&mut i), "0", "{args:?}");
                                    1.0 / f64::from(every)
                                }
                                m => panic!("statistic mode {m}: {args:?}"),
                            };
                            assert!((0.0..=1.0).contains(&v));
                            p.probability = Some(v);
                        }
                        // Source hashing: deterministic for a given source address.
                        "cluster" => {
                            let mut total = 0u32;
                            let mut mask = 0u32;
                            let mut seed = 0u32;
                            let hex = |v: &str| {
                                u32::from_str_radix(v.trim_start_matches("0x"), 16).unwrap()
                            };
                            for _ in 0..3 {
                                match next(&mut i) {
                                    "--cluster-total-nodes" => {
                                        total = next(&mut i).parse().unwrap()
                                    }
                                    "--cluster-local-nodemask" => mask = hex(next(&mut i)),
                                    "--cluster-hash-seed" => seed = hex(next(&mut i)),
                                    other => panic!("unknown cluster option {other} in {args:?}"),
                                }
                            }
                            let IpAddr::V4(src) = self.pkt.src else {
                                panic!("the tracer hashes IPv4 sources only: {args:?}");
                            };
                            let slot = super::cluster_slot(src, seed, total);
                            p.matches &= mask & (1 << slot) != 0;
                        }
                        "recent" => {
                            assert_eq!(next(&mut i), "--name", "{args:?}");
                            let name = next(&mut i).to_string();
                            match next(&mut i) {
                                "--rcheck" => {
                                    assert_eq!(next(&mut i), "--seconds", "{args:?}");
                                    let secs: u32 = next(&mut i).parse().unwrap();
                                    assert!(secs > 0);
                                    assert_eq!(next(&mut i), "--reap", "{args:?}");
                                    p.matches &= self.env.recent.contains(&name);
                                }
                                "--set" => p.recent_set = Some(name),
                                other => panic!("unknown recent option {other} in {args:?}"),
                            }
                        }
                        "addrtype" => {
                            let which = next(&mut i);
                            assert_eq!(next(&mut i), "LOCAL", "{args:?}");
                            let ip = match which {
                                "--dst-type" => st.dst,
                                "--src-type" => self.pkt.src,
                                other => panic!("unknown addrtype option {other} in {args:?}"),
                            };
                            p.matches &= self.env.local_addrs.contains(&ip);
                        }
                        "mark" => {
                            let mut mneg = false;
                            let mut opt = next(&mut i);
                            if opt == "!" {
                                mneg = true;
                                opt = next(&mut i);
                            }
                            assert_eq!(opt, "--mark", "{args:?}");
                            let (value, mask) = next(&mut i).split_once('/').unwrap();
                            let hit = st.mark & parse_mark(mask) == parse_mark(value);
                            p.matches &= hit != mneg;
                        }
                        "conntrack" => {
                            assert_eq!(next(&mut i), "--ctstate", "{args:?}");
                            let states = next(&mut i);
                            // Every traced packet is the first of its connection.
                            p.matches &= states.split(',').any(|s| s == "NEW");
                            for s in states.split(',') {
                                assert!(
                                    ["NEW", "INVALID", "RELATED", "ESTABLISHED"].contains(&s),
                                    "{args:?}"
                                );
                            }
                        }
                        other => panic!("unknown match module {other} in {args:?}"),
                    }
                }
                "-p" => p.matches &= next(&mut i) == self.pkt.proto,
                "--dport" => p.matches &= next(&mut i).parse::<u16>().unwrap() == st.dport,
                "-d" => p.matches &= net_contains(next(&mut i), st.dst) != neg,
                "-s" => p.matches &= net_contains(next(&mut i), self.pkt.src) != neg,
                "-j" => {
                    let t = next(&mut i).to_string();
                    let opts = args[i + 1..].to_vec();
                    p.target = Some((t, opts));
                    break;
                }
                other => panic!("unknown rule shape at {other:?} in {args:?}"),
            }
            neg = false;
            i += 1;
        }
        assert!(!neg, "dangling ! in {args:?}");
        p
    }

    /// Runs `chain`, returning every branch's end state.
    fn run(&mut self, table: &FakeTable, chain: &str, st: St) -> Vec<(St, End)> {
        self.depth += 1;
        assert!(self.depth < 32, "jump loop at {chain}");
        let rules = table
            .get(chain)
            .unwrap_or_else(|| panic!("no chain {chain}"));
        let mut live = vec![st];
        let mut done = Vec::new();
        for args in rules {
            let mut next_live = Vec::new();
            for st in live {
                let parsed = self.parse(&st, args);
                if !parsed.matches {
                    next_live.push(st);
                    continue;
                }
                let mut hit = st.clone();
                if let Some(prob) = parsed.probability {
                    let mut miss = st.clone();
                    miss.p *= 1.0 - prob;
                    hit.p *= prob;
                    if miss.p > 0.0 {
                        next_live.push(miss);
                    }
                    if hit.p == 0.0 {
                        continue;
                    }
                }
                if let Some(list) = parsed.recent_set {
                    hit.recent_set.push(list);
                }
                let Some((target, opts)) = parsed.target else {
                    next_live.push(hit);
                    continue;
                };
                let opt = |name: &str| -> String {
                    assert_eq!(
                        opts.first().map(String::as_str),
                        Some(name),
                        "{target} {opts:?}"
                    );
                    assert_eq!(opts.len(), 2, "{target} {opts:?}");
                    opts[1].clone()
                };
                match target.as_str() {
                    "ACCEPT" | "DROP" | "REJECT" | "RETURN" => {
                        assert!(opts.is_empty(), "{target} {opts:?}");
                        let end = match target.as_str() {
                            "ACCEPT" => End::Accept,
                            "DROP" => End::Drop,
                            "REJECT" => End::Reject,
                            _ => End::Return,
                        };
                        done.push((hit, end));
                    }
                    "DNAT" => {
                        let to = opt("--to-destination");
                        let (ip, port) = to.rsplit_once(':').unwrap();
                        hit.dst = ip.trim_matches(['[', ']']).parse().unwrap();
                        hit.dport = port.parse().unwrap();
                        hit.dnat = true;
                        done.push((hit, End::Accept));
                    }
                    "MARK" => {
                        let (how, m) = (opts[0].as_str(), parse_mark(&opts[1]));
                        assert_eq!(opts.len(), 2);
                        match how {
                            "--or-mark" => hit.mark |= m,
                            "--xor-mark" => hit.mark ^= m,
                            other => panic!("unknown MARK option {other}"),
                        }
                        next_live.push(hit);
                    }
                    "MASQUERADE" => {
                        assert_eq!(opts, ["--random-fully"]);
                        hit.masquerade = true;
                        done.push((hit, End::Accept));
                    }
                    user => {
                        assert!(opts.is_empty(), "{target} {opts:?}");
                        for (st, end) in self.run(table, user, hit) {
                            match end {
                                End::Return => next_live.push(st),
                                _ => done.push((st, end)),
                            }
                        }
                    }
                }
            }
            live = next_live;
        }
        done.extend(live.into_iter().map(|s| (s, End::Return)));
        self.depth -= 1;
        done
    }
}

/// Traces `pkt` through the fake's tables: the distribution of verdicts (probabilities sum
/// to 1).
pub fn trace(fake: &FakeIptables, pkt: &Packet, env: &Env) -> BTreeMap<Verdict, f64> {
    let mut t = Tracer { pkt, env, depth: 0 };
    let st = St {
        dst: pkt.dst,
        dport: pkt.dport,
        dnat: false,
        mark: 0,
        masquerade: false,
        recent_set: Vec::new(),
        p: 1.0,
    };
    let nat = fake.table(Table::Nat);
    let filter = fake.table(Table::Filter);
    let mut out: BTreeMap<Verdict, f64> = BTreeMap::new();
    let nat_hook = if pkt.from_node {
        "OUTPUT"
    } else {
        "PREROUTING"
    };
    for (st, end) in t.run(nat, nat_hook, st) {
        assert!(
            matches!(end, End::Return | End::Accept),
            "nat {nat_hook} must not filter: {end:?}"
        );
        let local = env.local_addrs.contains(&st.dst);
        let filter_hook = match (pkt.from_node, local) {
            (true, _) => "OUTPUT",
            (false, true) => "INPUT",
            (false, false) => "FORWARD",
        };
        for (st, end) in t.run(filter, filter_hook, st) {
            let verdict = match end {
                End::Drop => Verdict::Drop,
                End::Reject => Verdict::Reject,
                End::Accept | End::Return => {
                    let mut finals = vec![(st.clone(), End::Return)];
                    if filter_hook != "INPUT" {
                        finals = t.run(nat, "POSTROUTING", st);
                    }
                    for (st, _) in finals {
                        let dst = match st.dst {
                            IpAddr::V4(a) => format!("{a}:{}", st.dport),
                            IpAddr::V6(a) => format!("[{a}]:{}", st.dport),
                        };
                        let v = Verdict::Accept {
                            dst,
                            dnat: st.dnat,
                            masquerade: st.masquerade,
                            recent_set: st.recent_set.clone(),
                        };
                        *out.entry(v).or_default() += st.p;
                    }
                    continue;
                }
            };
            *out.entry(verdict).or_default() += st.p;
        }
    }
    let total: f64 = out.values().sum();
    assert!(
        (total - 1.0).abs() < 1e-9,
        "probabilities sum to {total}: {out:?}"
    );
    out
}

/// The iptables dataplane's tracer for the shared packet-flow table: a packet from the node
/// takes nat/filter OUTPUT.
pub struct IptablesTracer<'a> {
    pub fake: &'a FakeIptables,
    pub env: Env,
}

impl svcnet_flows::Tracer for IptablesTracer<'_> {
    fn name(&self) -> &'static str {
        "iptables"
    }

    fn trace(&self, p: &svcnet_flows::Packet) -> svcnet_flows::Distribution {
        use svcnet_flows::Outcome;
        let pkt = Packet {
            src: p.src,
            dst: p.dst,
            proto: p.proto.as_str(),
            dport: p.dport,
            from_node: p.from == svcnet_flows::Client::Node,
        };
        let mut out = svcnet_flows::Distribution::new();
        for (v, prob) in trace(self.fake, &pkt, &self.env) {
            let o = match v {
                Verdict::Drop => Outcome::Drop,
                Verdict::Reject => Outcome::Reject,
                Verdict::Accept { dnat: false, .. } => Outcome::Pass,
                Verdict::Accept {
                    dst, masquerade, ..
                } => Outcome::Endpoint {
                    to: dst.parse().unwrap_or_else(|_| panic!("bad address {dst}")),
                    masquerade,
                },
            };
            *out.entry(o).or_default() += prob;
        }
        out
    }
}
