//! The pod network's part of `svcnet trace`: after the proxy has chosen a destination, how the
//! node forwards the packet there — to a pod on its own bridge, or to another node over the
//! pod network's device (flannel's `flannel.1` VXLAN VTEP or `flannel0` TUN, Calico's `tunl0`,
//! a plain route via the other node for host-gw and BGP). The kernel's own answer (`ip route
//! get`, plus the neighbour and FDB entries of the VTEP) is read in the node's namespace and
//! turned into one line by [`explain`], a pure function.

use std::net::IpAddr;

use serde::Deserialize;
use svcnet_agent::routes::{VXLAN_DEVICE, VXLAN_PORT};
use svcnet_agent::topology::POD_BRIDGE;
use svcnet_agent::udpencap::{UDP_DEVICE, UDP_PORT};

/// Calico's IPIP device.
const IPIP_DEVICE: &str = "tunl0";

/// What the kernel says about a destination: `ip -j route get` and, for the route it picks,
/// the protocol that installed it and the VTEP's entries for its gateway.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Lookup {
    pub dst: String,
    /// `local`, `unicast`, `unreachable`, ….
    pub kind: String,
    pub dev: Option<String>,
    pub gateway: Option<String>,
    /// Who installed the matching route (`bird` for Calico's BGP), from `ip route show match`.
    pub protocol: Option<String>,
    /// With `flannel.1`: the gateway's VTEP MAC (neighbour entry) and the underlay address its
    /// FDB entry sends to.
    pub vtep_mac: Option<String>,
    pub vtep_dst: Option<String>,
}

#[derive(Deserialize)]
struct RouteGet {
    #[serde(default)]
    dst: String,
    #[serde(rename = "type", default)]
    kind: Option<String>,
    dev: Option<String>,
    gateway: Option<String>,
}

#[derive(Deserialize)]
struct RouteShow {
    dst: String,
    #[serde(default)]
    protocol: Option<String>,
    dev: Option<String>,
}

#[derive(Deserialize)]
struct Neigh {
    dst: String,
    lladdr: Option<String>,
}

#[derive(Deserialize)]
struct Fdb {
    mac: String,
    dst: Option<String>,
}

/// One line saying how the node forwards to `to` (the address after the proxy's DNAT).
pub fn explain(l: &Lookup) -> String {
    let dev = l.dev.as_deref().unwrap_or("?");
    let via = l
        .gateway
        .as_ref()
        .map(|g| format!("via {g} "))
        .unwrap_or_default();
    let route = format!("`{} {via}dev {dev}`", l.dst);
    match (l.kind.as_str(), dev) {
        ("local", _) => format!("{route}: an address of this node, delivered here"),
        ("unreachable" | "blackhole" | "prohibit", _) => {
            format!("no route: the kernel answers {} for {}", l.kind, l.dst)
        }
        (_, d) if d == POD_BRIDGE && l.gateway.is_none() => format!(
            "{route}: a pod on this node, through its bridge {POD_BRIDGE} to the pod's veth \
             (no encapsulation)"
        ),
        (_, d) if d == VXLAN_DEVICE => {
            let mac = l.vtep_mac.as_deref().unwrap_or("no neighbour entry");
            let to = l
                .vtep_dst
                .as_ref()
                .map(|d| format!("UDP {VXLAN_PORT} to {d}, the node whose VTEP that is"))
                .unwrap_or_else(|| "no FDB entry for that MAC: the packet is dropped".into());
            format!(
                "{route} onlink: VXLAN (flannel) — the VTEP {VXLAN_DEVICE} wraps the packet \
                 (VNI 1, inner destination MAC {mac}) and sends it in {to}"
            )
        }
        (_, d) if d == UDP_DEVICE => format!(
            "{route}: UDP (flannel) — the TUN {UDP_DEVICE} hands the packet to svcnet's \
             user-space loop, which sends it in UDP {UDP_PORT} to the node holding its pod subnet"
        ),
        (_, d) if d == IPIP_DEVICE => format!(
            "{route} onlink: IPIP (Calico) — {IPIP_DEVICE} wraps it in an outer IPv4 header \
             (protocol 4) to {}",
            l.gateway.as_deref().unwrap_or("?")
        ),
        (_, _) if l.gateway.is_some() && l.protocol.as_deref() == Some("bird") => format!(
            "{route}: BGP (Calico) — a plain route to the other node, learnt from its BIRD \
             (no encapsulation)"
        ),
        (_, _) if l.gateway.is_some() => {
            format!(
                "{route}: routed to the next hop {} (host-gw: no encapsulation)",
                l.gateway.as_deref().unwrap_or("?")
            )
        }
        _ => route,
    }
}

/// Reads what the kernel in `netns` (or here) would do with a packet to `dst`.
pub fn lookup(
    netns: Option<&str>,
    run_in: impl Fn(Option<&str>, &[&str]) -> anyhow::Result<Option<String>>,
    dst: IpAddr,
) -> anyhow::Result<Option<Lookup>> {
    let ip = dst.to_string();
    let Some(out) = run_in(netns, &["ip", "-j", "route", "get", &ip])? else {
        return Ok(None);
    };
    let got: Vec<RouteGet> = serde_json::from_str(&out)?;
    let Some(r) = got.into_iter().next() else {
        return Ok(None);
    };
    let mut l = Lookup {
        dst: if r.dst.is_empty() { ip.clone() } else { r.dst },
        kind: r.kind.unwrap_or_else(|| "unicast".into()),
        dev: r.dev,
        gateway: r.gateway,
        ..Lookup::default()
    };
    // The route that matched (the longest prefix on the same device) says who installed it.
    if let Some(out) = run_in(netns, &["ip", "-j", "route", "show", "match", &ip])? {
        let routes: Vec<RouteShow> = serde_json::from_str(&out).unwrap_or_default();
        l.protocol = routes
            .into_iter()
            .filter(|x| x.dev == l.dev)
            .max_by_key(|x| {
                x.dst
                    .split_once('/')
                    .map_or(32, |(_, p)| p.parse().unwrap_or(0))
            })
            .and_then(|x| x.protocol);
    }
    if l.dev.as_deref() == Some(VXLAN_DEVICE)
        && let Some(gw) = l.gateway.clone()
    {
        let neigh =
            run_in(netns, &["ip", "-j", "neigh", "show", "dev", VXLAN_DEVICE])?.unwrap_or_default();
        let neigh: Vec<Neigh> = serde_json::from_str(&neigh).unwrap_or_default();
        l.vtep_mac = neigh
            .into_iter()
            .find(|n| n.dst == gw)
            .and_then(|n| n.lladdr);
        if let Some(mac) = &l.vtep_mac {
            let fdb = run_in(netns, &["bridge", "-j", "fdb", "show", "dev", VXLAN_DEVICE])?
                .unwrap_or_default();
            let fdb: Vec<Fdb> = serde_json::from_str(&fdb).unwrap_or_default();
            l.vtep_dst = fdb
                .into_iter()
                .find(|f| f.mac.eq_ignore_ascii_case(mac) && f.dst.is_some())
                .and_then(|f| f.dst);
        }
    }
    Ok(Some(l))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn l(dev: &str, gw: Option<&str>) -> Lookup {
        Lookup {
            dst: "10.244.2.3".into(),
            kind: "unicast".into(),
            dev: Some(dev.into()),
            gateway: gw.map(str::to_string),
            ..Lookup::default()
        }
    }

    #[test]
    fn each_backend_is_named_with_its_device_and_next_hop() {
        assert!(explain(&l("cni0", None)).contains("a pod on this node"));
        assert!(explain(&l("eth0", Some("172.30.0.3"))).contains("host-gw"));
        let mut bgp = l("eth0", Some("172.30.0.3"));
        bgp.protocol = Some("bird".into());
        assert!(explain(&bgp).contains("BGP (Calico)"));
        let mut vx = l("flannel.1", Some("10.244.2.0"));
        vx.vtep_mac = Some("ba:be:ac:1e:00:03".into());
        vx.vtep_dst = Some("172.30.0.3".into());
        let text = explain(&vx);
        assert!(text.contains("VXLAN (flannel)"), "{text}");
        assert!(text.contains("UDP 8472 to 172.30.0.3"), "{text}");
        assert!(text.contains("ba:be:ac:1e:00:03"), "{text}");
        let mut lost = l("flannel.1", Some("10.244.2.0"));
        lost.vtep_mac = Some("ba:be:ac:1e:00:03".into());
        assert!(explain(&lost).contains("dropped"));
        assert!(explain(&l("flannel0", None)).contains("UDP 8285"));
        assert!(explain(&l("tunl0", Some("172.30.0.3"))).contains("IPIP (Calico)"));
        let mut local = l("lo", None);
        local.kind = "local".into();
        assert!(explain(&local).contains("delivered here"));
    }

    #[test]
    fn the_kernels_json_is_read() {
        let run = |_: Option<&str>, argv: &[&str]| -> anyhow::Result<Option<String>> {
            Ok(Some(match argv[2] {
                "route" if argv[3] == "get" => r#"[{"dst":"10.244.2.3","gateway":"10.244.2.0","dev":"flannel.1","prefsrc":"10.244.1.0","flags":["onlink"],"uid":0,"cache":[]}]"#.into(),
                "route" => r#"[{"dst":"10.244.2.0/24","gateway":"10.244.2.0","dev":"flannel.1","flags":["onlink"]},{"dst":"10.244.0.0/16","dev":"cni0","protocol":"kernel"}]"#.into(),
                "neigh" => r#"[{"dst":"10.244.2.0","lladdr":"ba:be:ac:1e:00:03","state":["PERMANENT"]}]"#.into(),
                _ => r#"[{"mac":"ba:be:ac:1e:00:03","dst":"172.30.0.3","state":"permanent"}]"#.into(),
            }))
        };
        let got = lookup(None, run, "10.244.2.3".parse().unwrap())
            .unwrap()
            .unwrap();
        assert_eq!(got.dev.as_deref(), Some("flannel.1"));
        assert_eq!(got.vtep_dst.as_deref(), Some("172.30.0.3"));
        assert_eq!(got.protocol, None);
    }
}
