//! The option that also cuts existing connections a change now denies (off by default, as
//! upstream intends: the table judges new connections, and `ct state established` lets an
//! accepted one live on). The conntrack table is read with `conntrack -L`, each flow judged
//! by the evaluator (source, destination after DNAT, protocol, destination port after DNAT),
//! and the denied ones deleted with `conntrack -D`: their next packet is a new connection,
//! which the table then refuses.
//!
//! [`parse`] and [`denied`] are pure; [`list`] and [`delete`] run the CLI.

use std::net::IpAddr;
use std::process::Stdio;

use svcnet_netpol::{Cluster, Connection, Endpoint, IpFamily, Protocol};

/// One conntrack entry: its original tuple and where DNAT sent it (the reply's source).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Flow {
    pub protocol: Protocol,
    pub src: IpAddr,
    pub dst: IpAddr,
    pub sport: u16,
    pub dport: u16,
    /// The destination after DNAT (the reply's source address and port).
    pub to: IpAddr,
    pub to_port: u16,
}

/// Why listing or deleting failed.
#[derive(Debug, thiserror::Error)]
pub enum ConntrackError {
    #[error("conntrack not found; install it (Debian/Ubuntu: `apt-get install conntrack`)")]
    NotInstalled,
    #[error("`conntrack {args}` failed: {stderr}")]
    Failed { args: String, stderr: String },
    #[error("running conntrack: {0}")]
    Io(std::io::Error),
}

/// A line of `conntrack -L` (`tcp 6 431999 ESTABLISHED src=… dst=… sport=… dport=… src=…
/// dst=… sport=… dport=… [ASSURED] …`); `None` for other protocols or lines.
pub fn parse(line: &str) -> Option<Flow> {
    let mut words = line.split_whitespace();
    let protocol = match words.next()? {
        "tcp" => Protocol::Tcp,
        "udp" => Protocol::Udp,
        "sctp" => Protocol::Sctp,
        _ => return None,
    };
    let mut src = Vec::new();
    let mut dst = Vec::new();
    let mut sport = Vec::new();
    let mut dport = Vec::new();
    for w in words {
        if let Some((k, v)) = w.split_once('=') {
            match k {
                "src" => src.push(v.parse::<IpAddr>().ok()?),
                "dst" => dst.push(v.parse::<IpAddr>().ok()?),
                "sport" => sport.push(v.parse::<u16>().ok()?),
                "dport" => dport.push(v.parse::<u16>().ok()?),
                _ => {}
            }
        }
    }
    if src.len() < 2 || dst.is_empty() || sport.len() < 2 || dport.is_empty() {
        return None;
    }
    Some(Flow {
        protocol,
        src: src[0],
        dst: dst[0],
        sport: sport[0],
        dport: dport[0],
        to: src[1],
        to_port: sport[1],
    })
}

/// The flows touching a pod of `node` that the policies of `cluster` deny. `nodes` names the
/// nodes' addresses (traffic from a pod's own node is always allowed). `proxy_sources` are
/// the table's ([`crate::Options::proxy_sources`]): under a proxy that relays Service
/// connections and judges them itself, its two legs are left alone as the table leaves them
/// (a connection redirected to one of this node's addresses, and the proxies' own).
pub fn denied<'a>(
    cluster: &Cluster,
    node: &str,
    nodes: &[(String, IpAddr)],
    proxy_sources: &[IpAddr],
    flows: &'a [Flow],
) -> Vec<&'a Flow> {
    let local = |e: &Endpoint| match e {
        Endpoint::Pod { namespace, name } => cluster
            .pod(namespace, name)
            .is_some_and(|p| p.node.as_deref() == Some(node)),
        _ => false,
    };
    let this_node =
        |ip: IpAddr| ip.is_loopback() || nodes.iter().any(|(n, a)| n == node && *a == ip);
    let relayed = |f: &Flow| {
        !proxy_sources.is_empty()
            && (proxy_sources.contains(&f.src) || (f.to != f.dst && this_node(f.to)))
    };
    flows
        .iter()
        .filter(|f| !relayed(f))
        .filter(|f| {
            let src = cluster.endpoint(f.src, nodes);
            let dst = cluster.endpoint(f.to, nodes);
            let conn = Connection {
                src,
                dst,
                protocol: f.protocol,
                port: f.to_port,
            };
            (local(&conn.src) || local(&conn.dst))
                && !(cluster.check_over(&conn, IpFamily::of(f.src))).is_ok_and(|v| v.allowed())
        })
        .collect()
}

fn run(netns: Option<&str>, args: &[String]) -> Result<String, ConntrackError> {
    let out = svcnet_netns::command(netns, "conntrack")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => ConntrackError::NotInstalled,
            _ => ConntrackError::Io(e),
        })?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    // `-D` with nothing left to delete (the flow ended meanwhile) exits 1: not an error.
    if !out.status.success() && !stderr.contains("0 flow entries") {
        return Err(ConntrackError::Failed {
            args: args.join(" "),
            stderr: stderr.trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The TCP, UDP and SCTP flows of the namespace, IPv4 and IPv6.
pub fn list(netns: Option<&str>) -> Result<Vec<Flow>, ConntrackError> {
    let mut flows = Vec::new();
    for family in ["ipv4", "ipv6"] {
        let out = run(netns, &["-L".into(), "-f".into(), family.into()])?;
        flows.extend(out.lines().filter_map(parse));
    }
    Ok(flows)
}

/// Deletes the flows by their original tuple; returns how many were asked for.
pub fn delete(netns: Option<&str>, flows: &[&Flow]) -> Result<usize, ConntrackError> {
    for f in flows {
        let proto = match f.protocol {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Sctp => "sctp",
        };
        let family = match f.src {
            IpAddr::V4(_) => "ipv4",
            IpAddr::V6(_) => "ipv6",
        };
        let args: Vec<String> = [
            "-D",
            "-f",
            family,
            "-p",
            proto,
            "-s",
            &f.src.to_string(),
            "-d",
            &f.dst.to_string(),
            "--sport",
            &f.sport.to_string(),
            "--dport",
            &f.dport.to_string(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        run(netns, &args)?;
    }
    Ok(flows.len())
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    #[test]
    fn a_dnat_flow_is_judged_by_where_it_went() {
        let line = "tcp      6 431999 ESTABLISHED src=10.0.1.5 dst=10.96.0.10 sport=40000 dport=80 \
                    src=10.0.1.7 dst=10.0.1.5 sport=8080 dport=40000 [ASSURED] mark=0 use=1";
        assert_eq!(
            parse(line),
            Some(Flow {
                protocol: Protocol::Tcp,
                src: Ipv4Addr::new(10, 0, 1, 5).into(),
                dst: Ipv4Addr::new(10, 96, 0, 10).into(),
                sport: 40000,
                dport: 80,
                to: Ipv4Addr::new(10, 0, 1, 7).into(),
                to_port: 8080,
            })
        );
        assert_eq!(
            parse("icmp 1 29 src=1.1.1.1 dst=2.2.2.2 type=8 code=0 id=1"),
            None
        );
        assert_eq!(
            parse("conntrack v1.4.7 (conntrack-tools): 0 flow entries"),
            None
        );
    }

    fn flow(src: &str, dst: &str, to: &str) -> Flow {
        let (to, to_port) = to.split_once(':').unwrap();
        Flow {
            protocol: Protocol::Tcp,
            src: src.parse().unwrap(),
            dst: dst.parse().unwrap(),
            sport: 40000,
            dport: 80,
            to: to.parse().unwrap(),
            to_port: to_port.parse().unwrap(),
        }
    }

    /// node1 holds `x/a` (10.244.1.5, isolated for ingress and egress by deny-all) and
    /// `x/b` (10.244.1.6); node2's `cni0` is 10.244.2.1. The node's own flows to its pods keep
    /// the node exception; under the userspace proxy its legs (the client's to the listener,
    /// the proxies' from their sources) are left to it; everything else is judged.
    #[test]
    fn the_node_and_a_relaying_proxy_keep_their_flows() {
        let pod = |name: &str, ip: &str| svcnet_netpol::Pod {
            namespace: "x".into(),
            name: name.into(),
            ips: vec![ip.parse().unwrap()],
            node: Some("node1".into()),
            ..Default::default()
        };
        let np: k8s_openapi::api::networking::v1::NetworkPolicy =
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "deny-a", "namespace": "x"},
                "spec": {"podSelector": {"matchLabels": {}}, "policyTypes": ["Ingress", "Egress"]},
            }))
            .unwrap();
        let mut a = pod("a", "10.244.1.5");
        a.labels.insert("pod".into(), "a".into());
        let cluster = Cluster {
            namespaces: vec![],
            pods: vec![a, pod("b", "10.244.1.6")],
            policies: vec![svcnet_netpol::Policy::from_k8s(&np).unwrap()],
        };
        let nodes: Vec<(String, IpAddr)> = ["172.30.0.2", "10.244.1.1"]
            .iter()
            .map(|a| ("node1".to_string(), a.parse().unwrap()))
            .collect();
        let flows = [
            flow("10.244.1.6", "10.244.1.5", "10.244.1.5:80"), // b → a: denied
            flow("10.244.1.1", "10.244.1.5", "10.244.1.5:80"), // the node → a
            flow("10.244.2.1", "10.244.1.5", "10.244.1.5:80"), // node2's proxy → a
            flow("10.244.1.5", "10.96.0.10", "10.244.1.1:41000"), // a → a Service, redirected
        ];
        let cut = |proxies: &[IpAddr]| -> Vec<&str> {
            let names = ["b→a", "node→a", "proxy→a", "a→listener"];
            denied(&cluster, "node1", &nodes, proxies, &flows)
                .into_iter()
                .map(|f| names[flows.iter().position(|g| g == f).unwrap()])
                .collect()
        };
        assert_eq!(cut(&[]), ["b→a", "proxy→a", "a→listener"]);
        let proxies: Vec<IpAddr> = ["10.244.1.1", "10.244.2.1"]
            .iter()
            .map(|a| a.parse().unwrap())
            .collect();
        assert_eq!(cut(&proxies), ["b→a"]);
    }
}
