//! A MODEL of upstream kube-proxy's nftables ruleset (kubernetes `pkg/proxy/nftables/proxier.go`,
//! v1.31+ shape), written for this benchmark from reading that file: it produces the `nft -f`
//! text the upstream proxier's *first full sync* would pipe to `nft` (through knftables, one
//! command per line) for ClusterIP services with Cluster traffic policy, a cluster-CIDR
//! local-traffic detector, `nodePortAddresses` unset and masquerade bit 14. It is not upstream
//! code and does not cover NodePorts, external/LB IPs, firewalls, affinity or Local policy (the
//! benchmark's services use none of them). What upstream does besides `nft -f` (computing the
//! transaction in Go, `nft list chains`/`list sets` for stale objects) is not modelled, so the
//! comparison favours the peer.
//!
//! Shape, per upstream:
//! * table `ip kube-proxy`; base chains `filter-{prerouting,input,forward,output}` (dstnat-10),
//!   `filter-output-post-dnat` (dstnat+10), `nat-{prerouting,output}` (dstnat),
//!   `nat-postrouting` (srcnat); on the first sync each base chain is added and deleted once;
//! * jump chains `service-endpoints-check`, `nodeport-endpoints-check`, `firewall-check`,
//!   `services`, `masquerading`, `cluster-ips-check`, `mark-for-masquerade`, `reject-chain`;
//! * set `cluster-ips`; maps `service-ips`, `service-nodeports`, `no-endpoint-services`,
//!   `no-endpoint-nodeports`, `firewall-ips` (all flushed on a full sync);
//! * per service port `service-<HASH>-ns/name/tcp/port`: masquerade-mark rule for off-cluster
//!   sources, then `numgen random mod N vmap { 0 : goto endpoint-…, … }`;
//! * per endpoint `endpoint-<HASH>-ns/name/tcp/port__ip/port`: hairpin masquerade mark, DNAT.
//!
//! `<HASH>` is the first 8 characters of base32(sha256(name)), as upstream names its chains.

use std::fmt::Write;

use sha2::{Digest, Sha256};

pub const TABLE: &str = "kube-proxy";
const MASQ_MARK: &str = "0x004000";

/// One ClusterIP service port and its (ready) endpoints.
#[derive(Clone)]
pub struct ServicePort {
    pub namespace: String,
    pub name: String,
    pub port_name: String,
    pub cluster_ip: String,
    pub port: u16,
    /// `(ip, port)` of each endpoint.
    pub endpoints: Vec<(String, u16)>,
    /// ClientIP affinity: upstream's dynamic `affinity-…` set per endpoint.
    pub affinity: bool,
}

/// RFC 4648 base32 (upper case, as Go's `base32.StdEncoding`) of the first 5 bytes: 8 chars.
fn hash8(name: &str) -> String {
    const ALPHABET: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    let digest = Sha256::digest(name.as_bytes());
    let bits = digest[..5]
        .iter()
        .fold(0u64, |acc, b| (acc << 8) | u64::from(*b));
    (0..8)
        .map(|i| ALPHABET[((bits >> (35 - 5 * i)) & 31) as usize] as char)
        .collect()
}

fn hashed(name: String) -> String {
    format!("{}-{name}", hash8(&name))
}

/// The text of upstream's first full sync for `services`; `cluster_cidr` feeds the local
/// traffic detector (`ip saddr != <cidr>`), `service_cidr` the unallocated-IP drop rule.
pub fn ruleset(services: &[ServicePort], cluster_cidr: &str, service_cidr: &str) -> String {
    let mut s = String::with_capacity(services.len() * 1200);
    let t = format!("ip {TABLE}");
    let _ = writeln!(s, "add table {t} {{ comment \"rules for kube-proxy\" ; }}");
    let base = [
        ("filter-prerouting", "filter", "prerouting", -110),
        ("filter-input", "filter", "input", -110),
        ("filter-forward", "filter", "forward", -110),
        ("filter-output", "filter", "output", -110),
        ("filter-output-post-dnat", "filter", "output", -90),
        ("nat-prerouting", "nat", "prerouting", -100),
        ("nat-output", "nat", "output", -100),
        ("nat-postrouting", "nat", "postrouting", 100),
    ];
    for (name, ..) in base {
        let _ = writeln!(s, "add chain {t} {name}\ndelete chain {t} {name}");
    }
    for (name, kind, hook, prio) in base {
        let _ = writeln!(
            s,
            "add chain {t} {name} {{ type {kind} hook {hook} priority {prio} ; }}\nflush chain {t} {name}"
        );
    }
    let jumps = [
        ("nodeport-endpoints-check", "filter-input", "ct state new "),
        ("service-endpoints-check", "filter-input", "ct state new "),
        ("service-endpoints-check", "filter-forward", "ct state new "),
        ("service-endpoints-check", "filter-output", "ct state new "),
        ("firewall-check", "filter-prerouting", "ct state new "),
        ("firewall-check", "filter-output", "ct state new "),
        ("services", "nat-output", ""),
        ("services", "nat-prerouting", ""),
        ("masquerading", "nat-postrouting", ""),
        ("cluster-ips-check", "filter-forward", "ct state new "),
        (
            "cluster-ips-check",
            "filter-output-post-dnat",
            "ct state new ",
        ),
    ];
    let mut created: Vec<&str> = Vec::new();
    let mut ensure = |s: &mut String, chain: &'static str| {
        if !created.contains(&chain) {
            created.push(chain);
            let _ = writeln!(s, "add chain {t} {chain}\nflush chain {t} {chain}");
        }
    };
    for (dst, src, extra) in jumps {
        ensure(&mut s, dst);
        let _ = writeln!(s, "add rule {t} {src} {extra}jump {dst}");
    }
    for chain in [
        "services",
        "cluster-ips-check",
        "masquerading",
        "mark-for-masquerade",
    ] {
        ensure(&mut s, chain);
    }
    let _ = writeln!(
        s,
        "add rule {t} mark-for-masquerade mark set mark or {MASQ_MARK}\n\
         add rule {t} masquerading mark and {MASQ_MARK} == 0 return\n\
         add rule {t} masquerading mark set mark xor {MASQ_MARK}\n\
         add rule {t} masquerading masquerade fully-random\n\
         add set {t} cluster-ips {{ type ipv4_addr ; comment \"Active ClusterIPs\" ; }}\n\
         add rule {t} cluster-ips-check ip daddr @cluster-ips reject comment \"Reject traffic to invalid ports of ClusterIPs\"\n\
         add rule {t} cluster-ips-check ip daddr {{ {service_cidr} }} drop comment \"Drop traffic to unallocated ClusterIPs\"\n\
         add set {t} nodeport-ips {{ type ipv4_addr ; comment \"IPs that accept NodePort traffic\" ; }}\n\
         delete set {t} nodeport-ips\n\
         add map {t} no-endpoint-services {{ type ipv4_addr . inet_proto . inet_service : verdict ; comment \"vmap to drop or reject packets to services with no endpoints\" ; }}\n\
         add map {t} no-endpoint-nodeports {{ type inet_proto . inet_service : verdict ; comment \"vmap to drop or reject packets to service nodeports with no endpoints\" ; }}\n\
         add chain {t} reject-chain {{ comment \"helper for @no-endpoint-services / @no-endpoint-nodeports\" ; }}\n\
         flush chain {t} reject-chain\n\
         add rule {t} reject-chain reject\n\
         add rule {t} service-endpoints-check ip daddr . meta l4proto . th dport vmap @no-endpoint-services\n\
         add rule {t} nodeport-endpoints-check ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @no-endpoint-nodeports\n\
         add map {t} firewall-ips {{ type ipv4_addr . inet_proto . inet_service : verdict ; comment \"destinations that are subject to LoadBalancerSourceRanges\" ; }}\n\
         add rule {t} firewall-check ip daddr . meta l4proto . th dport vmap @firewall-ips\n\
         add map {t} service-ips {{ type ipv4_addr . inet_proto . inet_service : verdict ; comment \"ClusterIP, ExternalIP and LoadBalancer IP traffic\" ; }}\n\
         add map {t} service-nodeports {{ type inet_proto . inet_service : verdict ; comment \"NodePort traffic\" ; }}\n\
         add rule {t} services ip daddr . meta l4proto . th dport vmap @service-ips\n\
         add rule {t} services fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @service-nodeports\n\
         flush set {t} cluster-ips\n\
         flush map {t} service-ips\n\
         flush map {t} firewall-ips\n\
         flush map {t} no-endpoint-services\n\
         flush map {t} no-endpoint-nodeports\n\
         flush map {t} service-nodeports"
    );
    for sp in services {
        service_text(&mut s, sp, cluster_cidr);
    }
    s
}

fn chains(sp: &ServicePort) -> (String, Vec<String>) {
    let base = format!("{}/{}/tcp/{}", sp.namespace, sp.name, sp.port_name);
    let svc_chain = format!("service-{}", hashed(base.clone()));
    let ep_chains = sp
        .endpoints
        .iter()
        .map(|(ip, port)| format!("endpoint-{}", hashed(format!("{base}__{ip}/{port}"))))
        .collect();
    (svc_chain, ep_chains)
}

/// One service port's part of the ruleset, as upstream writes it for a changed service in a
/// partial sync too (chains added and flushed, rules and elements re-added).
pub fn service_text(s: &mut String, sp: &ServicePort, cluster_cidr: &str) {
    let t = format!("ip {TABLE}");
    let (svc_chain, ep_chains) = chains(sp);
    for c in ep_chains.iter().chain(std::iter::once(&svc_chain)) {
        let _ = writeln!(s, "add chain {t} {c}\nflush chain {t} {c}");
    }
    let _ = writeln!(
        s,
        "add element {t} cluster-ips {{ {ip} }}\n\
         add element {t} service-ips {{ {ip} . tcp . {port} : goto {svc_chain} }}\n\
         add rule {t} {svc_chain} ip daddr {ip} tcp dport {port} ip saddr != {cluster_cidr} jump mark-for-masquerade",
        ip = sp.cluster_ip,
        port = sp.port,
    );
    let affinity_sets: Vec<String> = ep_chains
        .iter()
        .map(|c| c.replacen("endpoint-", "affinity-", 1))
        .collect();
    if sp.affinity {
        for (set, c) in affinity_sets.iter().zip(&ep_chains) {
            let _ = writeln!(
                s,
                "add set {t} {set} {{ type ipv4_addr ; flags dynamic,timeout ; timeout 10800s ; }}\n\
                 add rule {t} {svc_chain} ip saddr @{set} goto {c}"
            );
        }
    }
    let arms: Vec<String> = ep_chains
        .iter()
        .enumerate()
        .map(|(i, c)| format!("{i} : goto {c}"))
        .collect();
    let _ = writeln!(
        s,
        "add rule {t} {svc_chain} numgen random mod {} vmap {{ {} }}",
        arms.len(),
        arms.join(" , ")
    );
    for (((ip, port), c), set) in sp.endpoints.iter().zip(&ep_chains).zip(&affinity_sets) {
        let _ = writeln!(s, "add rule {t} {c} ip saddr {ip} jump mark-for-masquerade");
        if sp.affinity {
            let _ = writeln!(s, "add rule {t} {c} update @{set} {{ ip saddr }}");
        }
        let _ = writeln!(s, "add rule {t} {c} meta l4proto tcp dnat to {ip}:{port}");
    }
}

/// The endpoint chains `old` has and `new` has not, flushed (upstream deletes a stale chain
/// in a later sync).
pub fn flush_stale_endpoints(s: &mut String, old: &ServicePort, new: &ServicePort) {
    let t = format!("ip {TABLE}");
    let (_, keep) = chains(new);
    for c in chains(old).1 {
        if !keep.contains(&c) {
            let _ = writeln!(s, "flush chain {t} {c}");
        }
    }
}

/// A service port removed: its elements deleted, its chains flushed (deleted later).
pub fn remove_service(sp: &ServicePort) -> String {
    let t = format!("ip {TABLE}");
    let (svc_chain, ep_chains) = chains(sp);
    let mut s = format!(
        "delete element {t} service-ips {{ {ip} . tcp . {port} }}\ndelete element {t} cluster-ips {{ {ip} }}\n",
        ip = sp.cluster_ip,
        port = sp.port
    );
    for c in std::iter::once(&svc_chain).chain(&ep_chains) {
        let _ = writeln!(s, "flush chain {t} {c}");
    }
    s
}

#[cfg(test)]
mod tests {
    #[test]
    fn hash_is_base32_of_sha256() {
        // sha256("") = e3b0c442 98…; base32 of e3 b0 c4 42 98 = "4OYMIQUY".
        assert_eq!(super::hash8(""), "4OYMIQUY");
    }
}
