//! The companion iptables rules of the IPVS dataplane (kube-proxy's IPVS-mode skeleton, in
//! svcnet's names): a constant set of chains reading the ipsets (`render::Set`), plus the
//! mangle chain of firewall-mark rules. Applied with `iptables-restore --noflush` on the back
//! end `svcnet_iptables::IptablesExecutor::detect` picks (legacy where the kernel has no
//! nf_tables, as in user-mode Linux).
//!
//! * mangle `SVCIPVS-MARK` (PREROUTING, OUTPUT): new connections to a firewall-mark frontend
//!   get its mark.
//! * nat `SVCIPVS-SERVICES` (PREROUTING, OUTPUT): connmark the masquerade bit by frontend set
//!   and source; `SVCIPVS-POSTROUTING`: masquerade hairpin connections and marked ones.
//! * filter `SVCIPVS-FILTER` (INPUT), for new connections only (a connection's later packets
//!   carry no mark): connections diverted to a firewall-mark server pass;
//!   load-balancer source ranges; refused frontends (REJECT / DROP); then any other new
//!   connection to an address on the dummy is rejected, so host ports never answer on service
//!   IPs (k/k#72236). `SVCIPVS-FORWARD` / `SVCIPVS-OUTPUT`: addresses in a service CIDR that
//!   no service holds are dropped, never routed on.

use svcnet_iptables::{Family, Hook, Payload, Table, payload::Rule};
use svcnet_proxy::IpFamily;

use crate::render::{
    Dst, FWMARK_BASE, FWMARK_MASK, MASQ_MARK, MarkRule, PREFIX, Rendered, Set, Source,
};

pub const MARK_CHAIN: &str = "SVCIPVS-MARK";
pub const SERVICES: &str = "SVCIPVS-SERVICES";
pub const POSTROUTING: &str = "SVCIPVS-POSTROUTING";
pub const MARK_MASQ: &str = "SVCIPVS-MARK-MASQ";
pub const PORTS: &str = "SVCIPVS-PORTS";
pub const FILTER: &str = "SVCIPVS-FILTER";
pub const FORWARD: &str = "SVCIPVS-FORWARD";
pub const OUTPUT: &str = "SVCIPVS-OUTPUT";

fn s(args: &[&str]) -> Vec<String> {
    args.iter().map(|a| a.to_string()).collect()
}

/// `-m set --match-set <set> <dirs>`.
pub(crate) fn set(set: Set, family: IpFamily, dirs: &str) -> Vec<String> {
    s(&["-m", "set", "--match-set", &set.name(family), dirs])
}

/// `-m set ! --match-set <set> <dirs>`.
pub(crate) fn not_set(set: Set, family: IpFamily, dirs: &str) -> Vec<String> {
    s(&["-m", "set", "!", "--match-set", &set.name(family), dirs])
}

fn cat(parts: &[Vec<String>]) -> Vec<String> {
    parts.concat()
}

/// Matches packets carrying one of svcnet's firewall marks.
fn marked() -> Vec<String> {
    s(&[
        "-m",
        "mark",
        "--mark",
        &format!("{FWMARK_BASE:#x}/{FWMARK_MASK:#x}"),
    ])
}

/// The arguments of one mark rule.
pub fn mark_args(m: &MarkRule, family: IpFamily) -> Vec<String> {
    let proto = m.protocol.as_str();
    let dst = match m.dst {
        Dst::Addr(ip) => s(&["-d", &ip.to_string()]),
        Dst::NodeIps => set(Set::NodeIps, family, "dst"),
    };
    let src = match m.source {
        Source::Any => vec![],
        Source::ClusterCidrs => set(Set::ClusterCidrs, family, "src"),
        Source::Local => s(&["-m", "addrtype", "--src-type", "LOCAL"]),
    };
    cat(&[
        s(&["-m", "conntrack", "--ctstate", "NEW"]),
        dst,
        s(&["-p", proto, "-m", proto, "--dport", &m.port.to_string()]),
        src,
        s(&["-j", "MARK", "--set-mark", &format!("{:#x}", m.mark)]),
    ])
}

/// The jumps from the built-in chains.
pub fn hooks() -> Vec<Hook> {
    let hook = |table, chain, comment: &str, target: &str| Hook {
        table,
        chain,
        rule: Rule::new(
            chain,
            s(&["-m", "comment", "--comment", comment, "-j", target]),
        ),
    };
    vec![
        hook(Table::Mangle, "PREROUTING", "svcnet ipvs marks", MARK_CHAIN),
        hook(Table::Mangle, "OUTPUT", "svcnet ipvs marks", MARK_CHAIN),
        hook(Table::Nat, "PREROUTING", "svcnet ipvs services", SERVICES),
        hook(Table::Nat, "OUTPUT", "svcnet ipvs services", SERVICES),
        hook(
            Table::Nat,
            "POSTROUTING",
            "svcnet ipvs masquerade",
            POSTROUTING,
        ),
        hook(Table::Filter, "INPUT", "svcnet ipvs filter", FILTER),
        hook(Table::Filter, "FORWARD", "svcnet ipvs forward", FORWARD),
        hook(Table::Filter, "OUTPUT", "svcnet ipvs output", OUTPUT),
    ]
}

/// Only the mark chain and the port translations (a partial sync whose marks changed).
pub fn marks_payload(r: &Rendered, family: IpFamily) -> Payload {
    let mut p = Payload::new(Family::from(family));
    let t = p.table(Table::Mangle);
    t.chains.push(MARK_CHAIN.into());
    for m in &r.marks {
        t.rules.push(Rule::new(MARK_CHAIN, mark_args(m, family)));
    }
    let nat = p.table(Table::Nat);
    nat.chains.push(PORTS.into());
    for d in &r.port_dnats {
        let proto = d.protocol.as_str();
        nat.rules.push(Rule::new(
            PORTS,
            s(&[
                "-p",
                proto,
                "-m",
                "mark",
                "--mark",
                &format!("{:#x}", d.mark),
                "-j",
                "DNAT",
                "--to-destination",
                &format!(":{}", d.port),
            ]),
        ));
    }
    p
}

/// Every chain of the dataplane (a full sync).
pub fn payload(r: &Rendered, family: IpFamily) -> Payload {
    let mut p = marks_payload(r, family);
    let reject = match family {
        IpFamily::V4 => "icmp-port-unreachable",
        IpFamily::V6 => "icmp6-port-unreachable",
    };
    let masq = format!("{MASQ_MARK:#x}/{MASQ_MARK:#x}");
    let nat = p.table(Table::Nat);
    nat.chains
        .extend([SERVICES, POSTROUTING, MARK_MASQ].map(String::from));
    // PORTS is declared by marks_payload; it must exist before SERVICES jumps to it, and
    // the payload's nat section declares every chain before any rule.
    let mut rule = |chain: &str, args: Vec<String>| nat.rules.push(Rule::new(chain, args));
    rule(MARK_MASQ, s(&["-j", "CONNMARK", "--set-xmark", &masq]));
    rule(
        SERVICES,
        cat(&[set(Set::MasqAll, family, "dst,dst"), s(&["-j", MARK_MASQ])]),
    );
    rule(
        SERVICES,
        cat(&[
            set(Set::MasqOffCluster, family, "dst,dst"),
            not_set(Set::ClusterCidrs, family, "src"),
            s(&["-j", MARK_MASQ]),
        ]),
    );
    rule(
        SERVICES,
        cat(&[
            set(Set::MasqLocalSource, family, "dst,dst"),
            s(&["-m", "addrtype", "--src-type", "LOCAL", "-j", MARK_MASQ]),
        ]),
    );
    // After the masquerade decisions (made on the frontend), persistent mark servers' ports.
    rule(SERVICES, cat(&[marked(), s(&["-j", PORTS])]));
    rule(
        POSTROUTING,
        cat(&[
            set(Set::LoopBack, family, "dst,dst,src"),
            s(&["-j", "MASQUERADE"]),
        ]),
    );
    rule(
        POSTROUTING,
        s(&["-m", "connmark", "--mark", &masq, "-j", "MASQUERADE"]),
    );
    let filter = p.table(Table::Filter);
    filter
        .chains
        .extend([FILTER, FORWARD, OUTPUT].map(String::from));
    let mut rule = |chain: &str, args: Vec<String>| filter.rules.push(Rule::new(chain, args));
    rule(FILTER, cat(&[marked(), s(&["-j", "RETURN"])]));
    let drop = s(&["-j", "DROP"]);
    let refuse = s(&["-j", "REJECT", "--reject-with", reject]);
    for parts in [
        vec![
            set(Set::LbFirewall, family, "dst,dst"),
            not_set(Set::LbAllow, family, "dst,dst,src"),
            drop.clone(),
        ],
        vec![set(Set::Reject, family, "dst,dst"), refuse.clone()],
        vec![set(Set::Drop, family, "dst,dst"), drop],
        vec![
            set(Set::Vips, family, "dst"),
            not_set(Set::Frontends, family, "dst,dst"),
            refuse,
        ],
    ] {
        let new = s(&["-m", "conntrack", "--ctstate", "NEW"]);
        rule(FILTER, cat(&[vec![new], parts].concat()));
    }
    for net in &r.service_cidrs {
        let net = net.to_string();
        rule(FORWARD, s(&["-d", &net, "-j", "DROP"]));
        rule(
            OUTPUT,
            s(&[
                "-d",
                &net,
                "-m",
                "addrtype",
                "!",
                "--dst-type",
                "LOCAL",
                "-j",
                "DROP",
            ]),
        );
    }
    p
}

/// Whether a chain or set name is this dataplane's.
pub fn is_ours(name: &str) -> bool {
    name.starts_with(PREFIX)
}

/// The restore text removing this dataplane's hooks and chains from `iptables-save` output
/// (`None`: nothing to remove).
pub fn cleanup_text(save: &str) -> Option<String> {
    let mut out = String::new();
    let mut table: Option<&str> = None;
    let mut chains: Vec<String> = Vec::new();
    let mut jumps: Vec<String> = Vec::new();
    let mut flush = |table: Option<&str>, chains: &mut Vec<String>, jumps: &mut Vec<String>| {
        if let Some(t) = table
            && !(chains.is_empty() && jumps.is_empty())
        {
            out.push_str(&format!("*{t}\n"));
            for c in chains.iter() {
                out.push_str(&format!(":{c} - [0:0]\n"));
            }
            for j in jumps.iter() {
                out.push_str(&format!("-D {j}\n"));
            }
            for c in chains.iter() {
                out.push_str(&format!("-X {c}\n"));
            }
            out.push_str("COMMIT\n");
        }
        chains.clear();
        jumps.clear();
    };
    for line in save.lines() {
        if let Some(t) = line.strip_prefix('*') {
            flush(table, &mut chains, &mut jumps);
            table = Some(match t.trim() {
                "mangle" => "mangle",
                "nat" => "nat",
                "filter" => "filter",
                _ => "raw",
            });
        } else if let Some(decl) = line.strip_prefix(':') {
            if let Some(name) = decl.split_whitespace().next()
                && is_ours(name)
            {
                chains.push(name.to_string());
            }
        } else if let Some(rest) = line.strip_prefix("-A ") {
            let chain = rest.split_whitespace().next().unwrap_or_default();
            let targets_ours = rest
                .split_whitespace()
                .collect::<Vec<_>>()
                .windows(2)
                .any(|w| w[0] == "-j" && is_ours(w[1]));
            if !is_ours(chain) && targets_ours {
                jumps.push(rest.to_string());
            }
        }
    }
    flush(table, &mut chains, &mut jumps);
    (!out.is_empty()).then_some(out)
}
