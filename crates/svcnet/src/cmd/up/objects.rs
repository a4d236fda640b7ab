//! The API objects `svcnet up` owns: the Node objects of its nodes, cluster DNS's Service and,
//! without the built-in proxy, the API server's direct address for node add-ons.

use std::net::IpAddr;

use anyhow::Context as _;
use k8s_openapi::api::core::v1::{ConfigMap, Endpoints, Node, Service};

/// A node `svcnet up` registers.
#[derive(Debug, Clone)]
pub struct NodeSpec {
    pub name: String,
    pub internal_ip: IpAddr,
    pub pod_cidr: ipnet::IpNet,
    /// Annotations `svcnet up` owns on the Node (flannel's, for the pod network).
    pub annotations: Vec<(String, String)>,
}

/// Creates `kube-system/kube-dns` (cluster IP `ip`, port 53 over UDP and TCP) unless it exists, so
/// that pods find cluster DNS through the proxy like any other Service. It has no selector: when
/// `endpoint` is given (the address pods reach the DNS server at), its Endpoints are written by
/// hand, and the mirroring controller turns them into EndpointSlices.
pub async fn ensure_kube_dns(
    client: &kube::Client,
    ip: IpAddr,
    endpoint: Option<std::net::SocketAddr>,
) -> anyhow::Result<()> {
    let services: kube::Api<Service> = kube::Api::namespaced(client.clone(), "kube-system");
    let exists = services
        .get_opt("kube-dns")
        .await
        .context("cannot read kube-system/kube-dns")?
        .is_some();
    if !exists {
        let service: Service = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {
                "name": "kube-dns",
                "namespace": "kube-system",
                "labels": { "k8s-app": "kube-dns", "kubernetes.io/name": "CoreDNS" },
            },
            "spec": {
                "clusterIP": ip.to_string(),
                "ports": [
                    { "name": "dns", "port": 53, "protocol": "UDP", "targetPort": 53 },
                    { "name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": 53 },
                ],
            },
        }))
        .context("kube-dns service object")?;
        services
            .create(&Default::default(), &service)
            .await
            .context("cannot create kube-system/kube-dns")?;
    }
    let Some(endpoint) = endpoint else {
        return Ok(());
    };
    let endpoints: kube::Api<Endpoints> = kube::Api::namespaced(client.clone(), "kube-system");
    let mut desired: Endpoints = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Endpoints",
        "metadata": { "name": "kube-dns", "namespace": "kube-system", "labels": { "k8s-app": "kube-dns" } },
        "subsets": [{
            "addresses": [{ "ip": endpoint.ip().to_string() }],
            "ports": [
                { "name": "dns", "port": endpoint.port(), "protocol": "UDP" },
                { "name": "dns-tcp", "port": endpoint.port(), "protocol": "TCP" },
            ],
        }],
    }))
    .context("kube-dns endpoints object")?;
    match endpoints
        .get_opt("kube-dns")
        .await
        .context("cannot read kube-system/kube-dns endpoints")?
    {
        Some(current) if current.subsets == desired.subsets => {}
        Some(current) => {
            desired.metadata.resource_version = current.metadata.resource_version;
            endpoints
                .replace("kube-dns", &Default::default(), &desired)
                .await
                .context("cannot update kube-system/kube-dns endpoints")?;
        }
        None => {
            endpoints
                .create(&Default::default(), &desired)
                .await
                .context("cannot create kube-system/kube-dns endpoints")?;
        }
    }
    Ok(())
}

/// The ConfigMap that tells node add-ons where the API server is when no proxy serves the
/// `kubernetes` Service yet: Calico's convention for clusters without kube-proxy, read by
/// `deploy/svcnet.yaml`'s DaemonSets through an optional `envFrom`.
pub const SERVICES_ENDPOINT: &str = "kubernetes-services-endpoint";

/// Writes `kube-system/kubernetes-services-endpoint` with the API server's direct address
/// (`KUBERNETES_SERVICE_HOST`/`PORT`), as an installer does for a cluster whose proxy is an
/// add-on: the proxy's own pods cannot reach the API through the Service IP they program.
pub async fn ensure_services_endpoint(
    client: &kube::Client,
    api: std::net::SocketAddr,
) -> anyhow::Result<()> {
    let maps: kube::Api<ConfigMap> = kube::Api::namespaced(client.clone(), "kube-system");
    let object = serde_json::json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": SERVICES_ENDPOINT, "namespace": "kube-system"},
        "data": {
            "KUBERNETES_SERVICE_HOST": api.ip().to_string(),
            "KUBERNETES_SERVICE_PORT": api.port().to_string(),
        },
    });
    maps.patch(
        SERVICES_ENDPOINT,
        &kube::api::PatchParams::apply("svcnet-up").force(),
        &kube::api::Patch::Apply(&object),
    )
    .await
    .with_context(|| format!("cannot write kube-system/{SERVICES_ENDPOINT}"))?;
    Ok(())
}

/// Registers (or refreshes) a Node object: Ready, its InternalIP, its pod CIDR and the pod
/// network's annotations.
pub async fn register_node(client: &kube::Client, node: &NodeSpec) -> anyhow::Result<()> {
    let name = node.name.as_str();
    let nodes: kube::Api<Node> = kube::Api::all(client.clone());
    let now = k8s_openapi::jiff::Timestamp::now();
    let object: Node = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": node.annotations.iter().cloned().collect::<std::collections::BTreeMap<_, _>>(),
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": std::env::consts::ARCH,
            },
        },
        "spec": { "podCIDR": node.pod_cidr.to_string(), "podCIDRs": [node.pod_cidr.to_string()] },
    }))
    .context("node object")?;
    let existing = nodes
        .get_opt(name)
        .await
        .with_context(|| format!("cannot read node {name}"))?;
    let mut current = match existing {
        Some(mut current) => {
            // The pod CIDR follows the topology of this run.
            current.spec = object.spec.clone();
            let annotations = current.metadata.annotations.get_or_insert_default();
            // A Calico backend's annotations go when this run's backend is not one, and
            // flannel's when the pod network is left to an add-on (which publishes its own).
            let owned = [
                svcnet_agent::podnet::bgp::CALICO_ANNOTATION_PREFIX,
                svcnet_agent::routes::FLANNEL_ANNOTATION_PREFIX,
            ];
            annotations.retain(|k, _| {
                !owned.iter().any(|p| k.starts_with(p))
                    || node.annotations.iter().any(|(n, _)| n == k)
            });
            annotations.extend(node.annotations.iter().cloned());
            nodes
                .replace(name, &Default::default(), &current)
                .await
                .with_context(|| format!("cannot update node {name}"))?
        }
        None => nodes
            .create(&Default::default(), &object)
            .await
            .with_context(|| format!("cannot register node {name}"))?,
    };
    let status = serde_json::json!({
        "conditions": [{
            "type": "Ready",
            "status": "True",
            "reason": "SvcnetReady",
            "message": "svcnet node is ready",
            "lastHeartbeatTime": now.to_string(),
            "lastTransitionTime": now.to_string(),
        }],
        "addresses": [
            { "type": "InternalIP", "address": node.internal_ip.to_string() },
            { "type": "Hostname", "address": name },
        ],
        "nodeInfo": {
            "architecture": std::env::consts::ARCH,
            "operatingSystem": "linux",
            "kubeletVersion": concat!("svcnet-", env!("CARGO_PKG_VERSION")),
            "kubeProxyVersion": concat!("svcnet-", env!("CARGO_PKG_VERSION")),
            "containerRuntimeVersion": "svcnet://process",
            "kernelVersion": "", "osImage": "", "machineID": "", "systemUUID": "", "bootID": "",
        },
    });
    current.status = Some(serde_json::from_value(status).context("node status")?);
    nodes
        .replace_status(name, &Default::default(), &current)
        .await
        .with_context(|| format!("cannot update the status of node {name}"))?;
    Ok(())
}

/// The `n`th address of the first service CIDR (kubeadm's convention puts cluster DNS at the tenth).
pub fn nth_address(cidrs: &[ipnet::IpNet], n: u32) -> anyhow::Result<IpAddr> {
    let cidr = cidrs
        .first()
        .context("--service-cidr needs at least one CIDR")?;
    let ip = match cidr.network() {
        IpAddr::V4(net) => IpAddr::V4((u32::from(net) + n).into()),
        IpAddr::V6(net) => IpAddr::V6((u128::from(net) + u128::from(n)).into()),
    };
    anyhow::ensure!(
        cidr.contains(&ip),
        "--service-cidr {cidr} is too small to hold the DNS service IP"
    );
    Ok(ip)
}

/// This machine's host name, made a valid node name.
pub fn default_node_name() -> String {
    let raw = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let name: String = raw
        .trim()
        .to_ascii_lowercase()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '-'
            }
        })
        .collect();
    let name = name.trim_matches(|c| c == '-' || c == '.').to_string();
    if name.is_empty() {
        "svcnet-node".to_string()
    } else {
        name
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_service_ip_is_the_tenth_address() {
        let v4: Vec<ipnet::IpNet> = vec!["10.96.0.0/12".parse().unwrap()];
        assert_eq!(nth_address(&v4, 10).unwrap().to_string(), "10.96.0.10");
        let v6: Vec<ipnet::IpNet> = vec!["fd00:10:96::/112".parse().unwrap()];
        assert_eq!(nth_address(&v6, 10).unwrap().to_string(), "fd00:10:96::a");
        let tiny: Vec<ipnet::IpNet> = vec!["10.0.0.0/30".parse().unwrap()];
        assert!(nth_address(&tiny, 10).is_err());
        assert!(nth_address(&[], 10).is_err());
    }
}
