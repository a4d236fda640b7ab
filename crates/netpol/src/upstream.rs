//! Upstream's e2e model (`test/e2e/network/netpol/model.go`) as data, for the tests of this
//! crate and of every dataplane compiled from it: namespaces x, y, z (labels `ns=<name>` and
//! `kubernetes.io/metadata.name`) with pods a, b, c (label `pod=<name>`), each serving TCP and
//! UDP on 80 and 81 with container ports named `serve-<port>-<proto>`.

use std::collections::BTreeMap;
use std::net::IpAddr;

use crate::eval::Cluster;
use crate::model::{NamedPort, Namespace, Pod, Protocol};

pub const NAMESPACES: [&str; 3] = ["x", "y", "z"];
pub const PODS: [&str; 3] = ["a", "b", "c"];
/// The (protocol, port) pairs every pod serves.
pub const PROBES: [(Protocol, u16); 4] = [
    (Protocol::Tcp, 80),
    (Protocol::Tcp, 81),
    (Protocol::Udp, 80),
    (Protocol::Udp, 81),
];

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The model with no policies; `place` gives each pod (namespace, name) its address and node.
pub fn model(place: impl Fn(&str, &str) -> (IpAddr, Option<String>)) -> Cluster {
    let mut c = Cluster::default();
    for ns in NAMESPACES {
        c.namespaces.push(Namespace {
            name: ns.into(),
            labels: labels(&[("ns", ns), ("kubernetes.io/metadata.name", ns)]),
        });
    }
    for ns in NAMESPACES {
        for pod in PODS {
            let ports = PROBES
                .iter()
                .map(|(protocol, port)| NamedPort {
                    name: format!(
                        "serve-{port}-{}",
                        if *protocol == Protocol::Tcp {
                            "tcp"
                        } else {
                            "udp"
                        }
                    ),
                    port: *port,
                    protocol: *protocol,
                })
                .collect();
            let (ip, node) = place(ns, pod);
            c.pods.push(Pod {
                namespace: ns.into(),
                name: pod.into(),
                labels: labels(&[("pod", pod)]),
                ips: vec![ip],
                ports,
                node,
            });
        }
    }
    c
}
