//! What a container gets, computed purely from the pod, the node and the services: its
//! environment (as the kubelet builds it), its command line (or the built-in test server),
//! `/etc/resolv.conf` per `dnsPolicy`/`dnsConfig`, and `/etc/hosts`.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::Path;

use k8s_openapi::api::core::v1::{Container, Pod, Service};

/// The environment variable that makes the svcnet binary run the built-in test server.
pub const TESTSERVER_ENV: &str = "SVCNET_TESTSERVER";
/// The pod name and IP the test server reports.
pub const TESTSERVER_POD_ENV: &str = "SVCNET_TESTSERVER_POD";
pub const TESTSERVER_IP_ENV: &str = "SVCNET_TESTSERVER_IP";

const BASE_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// What the agent knows about the running pod when it starts a container.
#[derive(Debug, Clone)]
pub struct PodContext<'a> {
    pub pod: &'a Pod,
    pub pod_ip: Ipv4Addr,
    pub host_ip: Ipv4Addr,
    pub node_name: &'a str,
}

/// A problem with the pod spec, naming the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("pod {pod}: {field}: {message}")]
pub struct SpecError {
    pub pod: String,
    pub field: String,
    pub message: String,
}

fn pod_key(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or("default"),
        pod.metadata.name.as_deref().unwrap_or("")
    )
}

/// The data of the ConfigMaps a container's environment reads (`envFrom` and
/// `configMapKeyRef`), by name, in the pod's namespace; a name missing here does not exist.
pub type ConfigMapData = BTreeMap<String, BTreeMap<String, String>>;

/// The ConfigMaps a container's environment reads, by name (see [`ConfigMapData`]).
pub fn env_config_maps(container: &Container) -> std::collections::BTreeSet<String> {
    let from = container
        .env_from
        .iter()
        .flatten()
        .filter_map(|f| f.config_map_ref.as_ref().map(|r| r.name.clone()));
    let keys = container.env.iter().flatten().filter_map(|v| {
        let r = v.value_from.as_ref()?.config_map_key_ref.as_ref()?;
        Some(r.name.clone())
    });
    from.chain(keys).collect()
}

/// The container's environment, in order: a base PATH/HOME, the service-link variables,
/// `HOSTNAME`, the `envFrom` ConfigMaps' keys (with their `prefix`), then the declared `env`
/// (which wins), with `$(VAR)` references expanded. A ConfigMap that does not exist, or a
/// key it lacks, is the kubelet's `CreateContainerConfigError` unless marked `optional`;
/// `envFrom` keys that cannot be variable names (empty, or with `=`) are skipped, as the
/// kubelet skips invalid ones.
pub fn container_env(
    ctx: &PodContext<'_>,
    container: &Container,
    services: &[Service],
    config_maps: &ConfigMapData,
) -> Result<Vec<(String, String)>, SpecError> {
    let pod = ctx.pod;
    let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
    let spec = pod.spec.as_ref();
    let links = spec.and_then(|s| s.enable_service_links).unwrap_or(true);
    let mut env: Vec<(String, String)> = vec![
        ("PATH".into(), BASE_PATH.into()),
        ("HOME".into(), "/root".into()),
    ];
    for var in svcnet_dns::service_env_vars(ns, services, links) {
        env.push((var.name, var.value));
    }
    env.push(("HOSTNAME".into(), hostname(pod)));
    let error = |field: String, message: String| SpecError {
        pod: pod_key(pod),
        field,
        message,
    };
    for (i, from) in container.env_from.iter().flatten().enumerate() {
        let field = |f: &str| format!("spec.containers[{}].envFrom[{i}].{f}", container.name);
        let Some(r) = &from.config_map_ref else {
            return Err(error(
                field("secretRef"),
                "only configMapRef is supported (Secrets are not served)".into(),
            ));
        };
        let data = match config_maps.get(&r.name) {
            Some(data) => data,
            None if r.optional == Some(true) => continue,
            None => {
                return Err(error(
                    field("configMapRef"),
                    format!("configmap {:?} not found", r.name),
                ));
            }
        };
        let prefix = from.prefix.as_deref().unwrap_or("");
        for (k, v) in data {
            let name = format!("{prefix}{k}");
            if name.is_empty() || name.contains('=') {
                continue;
            }
            env.retain(|(n, _)| n != &name);
            env.push((name, v.clone()));
        }
    }
    let mut declared: BTreeMap<String, String> = BTreeMap::new();
    for (i, var) in container.env.iter().flatten().enumerate() {
        let field = |f: &str| format!("spec.containers[{}].env[{i}].{f}", container.name);
        let value = if let Some(from) = &var.value_from {
            if let Some(r) = &from.config_map_key_ref {
                let found = config_maps.get(&r.name).map(|d| d.get(&r.key));
                match found {
                    Some(Some(v)) => v.clone(),
                    _ if r.optional == Some(true) => continue,
                    None => {
                        return Err(error(
                            field("valueFrom.configMapKeyRef"),
                            format!("configmap {:?} not found", r.name),
                        ));
                    }
                    Some(None) => {
                        return Err(error(
                            field("valueFrom.configMapKeyRef"),
                            format!("couldn't find key {} in ConfigMap {ns}/{}", r.key, r.name),
                        ));
                    }
                }
            } else {
                let Some(field_ref) = &from.field_ref else {
                    return Err(error(
                        field("valueFrom"),
                        "only fieldRef and configMapKeyRef are supported (no secretKeyRef/resourceFieldRef)".into(),
                    ));
                };
                field_value(ctx, &field_ref.field_path).ok_or_else(|| {
                    error(
                        field("valueFrom.fieldRef.fieldPath"),
                        format!("unsupported field path {:?}", field_ref.field_path),
                    )
                })?
            }
        } else {
            let lookup = |name: &str| {
                declared.get(name).cloned().or_else(|| {
                    env.iter()
                        .rev()
                        .find(|(k, _)| k == name)
                        .map(|(_, v)| v.clone())
                })
            };
            expand(var.value.as_deref().unwrap_or(""), lookup)
        };
        declared.insert(var.name.clone(), value.clone());
        env.retain(|(k, _)| k != &var.name);
        env.push((var.name.clone(), value));
    }
    Ok(env)
}

/// Linux capability names by number (`linux/capability.h`), without the `CAP_` prefix.
const CAPABILITIES: [&str; 41] = [
    "CHOWN",
    "DAC_OVERRIDE",
    "DAC_READ_SEARCH",
    "FOWNER",
    "FSETID",
    "KILL",
    "SETGID",
    "SETUID",
    "SETPCAP",
    "LINUX_IMMUTABLE",
    "NET_BIND_SERVICE",
    "NET_BROADCAST",
    "NET_ADMIN",
    "NET_RAW",
    "IPC_LOCK",
    "IPC_OWNER",
    "SYS_MODULE",
    "SYS_RAWIO",
    "SYS_CHROOT",
    "SYS_PTRACE",
    "SYS_PACCT",
    "SYS_ADMIN",
    "SYS_BOOT",
    "SYS_NICE",
    "SYS_RESOURCE",
    "SYS_TIME",
    "SYS_TTY_CONFIG",
    "MKNOD",
    "LEASE",
    "AUDIT_WRITE",
    "AUDIT_CONTROL",
    "SETFCAP",
    "MAC_OVERRIDE",
    "MAC_ADMIN",
    "SYSLOG",
    "WAKE_ALARM",
    "BLOCK_SUSPEND",
    "AUDIT_READ",
    "PERFMON",
    "BPF",
    "CHECKPOINT_RESTORE",
];

/// The capabilities a container runtime (containerd, Docker) gives a container by default.
const DEFAULT_CAPABILITIES: [&str; 14] = [
    "CHOWN",
    "DAC_OVERRIDE",
    "FSETID",
    "FOWNER",
    "MKNOD",
    "NET_RAW",
    "SETGID",
    "SETUID",
    "SETFCAP",
    "SETPCAP",
    "NET_BIND_SERVICE",
    "SYS_CHROOT",
    "KILL",
    "AUDIT_WRITE",
];

fn capability_bit(name: &str) -> Option<u64> {
    let bare = name.strip_prefix("CAP_").unwrap_or(name);
    CAPABILITIES
        .iter()
        .position(|c| *c == bare)
        .map(|i| 1u64 << i)
}

/// The capabilities container `c` runs with, as containerd computes them from its
/// `securityContext` (bit n = capability n): `privileged` keeps all (`None`); otherwise the
/// runtime's defaults, plus `add`, minus `drop` (`ALL` in `add` is every capability; `ALL` in
/// `drop` starts from none, and `add` still adds). An unknown name is an error, as the
/// runtime's.
pub fn capabilities(c: &Container) -> Result<Option<u64>, String> {
    let sc = c.security_context.as_ref();
    if sc.and_then(|s| s.privileged) == Some(true) {
        return Ok(None);
    }
    let caps = sc.and_then(|s| s.capabilities.as_ref());
    let add = caps.and_then(|c| c.add.as_deref()).unwrap_or_default();
    let drop = caps.and_then(|c| c.drop.as_deref()).unwrap_or_default();
    let all = (1u64 << CAPABILITIES.len()) - 1;
    let bits = |names: &[String]| -> Result<u64, String> {
        names.iter().try_fold(0u64, |acc, n| {
            if n == "ALL" {
                return Ok(all);
            }
            capability_bit(n)
                .map(|b| acc | b)
                .ok_or_else(|| format!("unknown capability {n:?}"))
        })
    };
    let (add, drop) = (bits(add)?, bits(drop)?);
    let defaults = DEFAULT_CAPABILITIES
        .iter()
        .filter_map(|n| capability_bit(n))
        .fold(0, |a, b| a | b);
    Ok(Some((defaults & !drop) | add))
}

/// The value of a `fieldRef` path, as the kubelet's downward API gives it.
pub fn field_value(ctx: &PodContext<'_>, path: &str) -> Option<String> {
    let m = &ctx.pod.metadata;
    let spec = ctx.pod.spec.as_ref();
    Some(match path {
        "metadata.name" => m.name.clone().unwrap_or_default(),
        "metadata.namespace" => m.namespace.clone().unwrap_or_else(|| "default".into()),
        "metadata.uid" => m.uid.clone().unwrap_or_default(),
        "spec.nodeName" => ctx.node_name.to_string(),
        "spec.serviceAccountName" => spec
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_else(|| "default".into()),
        "status.podIP" | "status.podIPs" => ctx.pod_ip.to_string(),
        "status.hostIP" | "status.hostIPs" => ctx.host_ip.to_string(),
        _ => {
            let (map, key) = if let Some(rest) = path.strip_prefix("metadata.labels['") {
                (m.labels.as_ref(), rest.strip_suffix("']")?)
            } else if let Some(rest) = path.strip_prefix("metadata.annotations['") {
                (m.annotations.as_ref(), rest.strip_suffix("']")?)
            } else {
                return None;
            };
            map.and_then(|m| m.get(key)).cloned().unwrap_or_default()
        }
    })
}

/// Kubernetes' `$(VAR)` expansion: known references are replaced, `$$` escapes `$`, unknown
/// references stay as written.
pub fn expand(input: &str, lookup: impl Fn(&str) -> Option<String>) -> String {
    let mut out = String::new();
    let mut rest = input;
    while let Some(pos) = rest.find('$') {
        out.push_str(&rest[..pos]);
        let after = &rest[pos + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(inner) = after.strip_prefix('(')
            && let Some(end) = inner.find(')')
        {
            let name = &inner[..end];
            match lookup(name) {
                Some(v) => out.push_str(&v),
                None => out.push_str(&format!("$({name})")),
            }
            rest = &inner[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// The pod's hostname: `spec.hostname`, else its name.
pub fn hostname(pod: &Pod) -> String {
    pod.spec
        .as_ref()
        .and_then(|s| s.hostname.clone())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| pod.metadata.name.clone().unwrap_or_default())
}

/// How a container runs: its own command, or the built-in test server on its ports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Launch {
    Command(Vec<String>),
    /// `ports` as `tcp:80,udp:53`.
    TestServer {
        ports: String,
    },
}

/// An image reference without its tag or digest: `ghcr.io/svcnet/svcnet:v1` →
/// `ghcr.io/svcnet/svcnet` (a `:` before the last `/` is a registry port, not a tag).
pub fn image_repository(image: &str) -> &str {
    let image = image.split('@').next().unwrap_or(image);
    match image.rfind(':') {
        Some(i) if !image[i..].contains('/') => &image[..i],
        _ => image,
    }
}

/// The command line of a container whose image the runtime runs as `program` (an image
/// mapped to a program of this machine): the image's binary replaces `command[0]` (the
/// entrypoint it names); without a `command`, the program runs with `args`, as an image's
/// entrypoint would. `$(VAR)` references are expanded.
pub fn launch_mapped(
    container: &Container,
    env: &[(String, String)],
    program: &Path,
) -> Vec<String> {
    let lookup = |name: &str| {
        env.iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    std::iter::once(program.display().to_string())
        .chain(
            container
                .command
                .iter()
                .flatten()
                .skip(1)
                .chain(container.args.iter().flatten())
                .map(|a| expand(a, lookup)),
        )
        .collect()
}

pub fn launch(container: &Container, env: &[(String, String)]) -> Launch {
    let lookup = |name: &str| {
        env.iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    match container.command.as_ref().filter(|c| !c.is_empty()) {
        Some(command) => Launch::Command(
            command
                .iter()
                .chain(container.args.iter().flatten())
                .map(|a| expand(a, lookup))
                .collect(),
        ),
        None => {
            let ports: Vec<String> = container
                .ports
                .iter()
                .flatten()
                .filter_map(|p| match p.protocol.as_deref().unwrap_or("TCP") {
                    "TCP" => Some(format!("tcp:{}", p.container_port)),
                    "UDP" => Some(format!("udp:{}", p.container_port)),
                    _ => None,
                })
                .collect();
            Launch::TestServer {
                ports: ports.join(","),
            }
        }
    }
}

/// `/etc/resolv.conf` per `dnsPolicy` and `dnsConfig`, by the DNS crate's kubelet rules (`host`
/// is the host's own resolv.conf, used by `dnsPolicy: Default`). A `dnsPolicy: None` pod
/// without nameservers, or a malformed cluster DNS address, is refused with a message.
pub fn resolv_conf(
    pod: &Pod,
    cluster_dns: &[String],
    zone: &str,
    host: &str,
) -> Result<String, String> {
    let servers = cluster_dns
        .iter()
        .map(|ip| {
            ip.parse()
                .map_err(|_| format!("cluster DNS address {ip:?} is not an IP address"))
        })
        .collect::<Result<Vec<std::net::IpAddr>, String>>()?;
    let host = svcnet_dns::resolvconf::ResolvConf::parse(host);
    svcnet_dns::resolvconf::pod_resolv_conf(pod, &servers, zone, &host)
        .map(|conf| conf.to_string())
        .map_err(|e| e.to_string())
}

/// `/etc/hosts` as the kubelet writes it: localhost lines, the pod's own address with its
/// hostname (and `<hostname>.<subdomain>.<ns>.svc.<zone>` when `subdomain` is set), and
/// `hostAliases`.
pub fn hosts_file(pod: &Pod, pod_ip: Ipv4Addr, zone: &str) -> String {
    let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
    let spec = pod.spec.as_ref();
    let host = hostname(pod);
    let mut out = String::from(
        "# Kubernetes-managed hosts file (svcnet).\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\nfe00::0\tip6-localnet\nfe00::0\tip6-mcastprefix\nfe00::1\tip6-allnodes\nfe00::2\tip6-allrouters\n",
    );
    match spec
        .and_then(|s| s.subdomain.as_deref())
        .filter(|s| !s.is_empty())
    {
        Some(sub) => out.push_str(&format!("{pod_ip}\t{host}.{sub}.{ns}.svc.{zone}\t{host}\n")),
        None => out.push_str(&format!("{pod_ip}\t{host}\n")),
    }
    for alias in spec
        .and_then(|s| s.host_aliases.as_ref())
        .into_iter()
        .flatten()
    {
        let names = alias.hostnames.clone().unwrap_or_default();
        if !names.is_empty() {
            out.push_str(&format!(
                "\n# Entries added by HostAliases.\n{}\t{}\n",
                alias.ip,
                names.join("\t")
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use expect_test::expect;
    use serde_json::json;

    fn pod(spec: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "web-0", "namespace": "shop", "uid": "u-1", "labels": {"app": "web"}},
            "spec": spec,
        }))
        .unwrap()
    }

    fn svc(name: &str, ip: &str, port: i32) -> Service {
        serde_json::from_value(json!({"metadata": {"name": name, "namespace": "shop"},
            "spec": {"clusterIP": ip, "ports": [{"port": port, "protocol": "TCP"}]}}))
        .unwrap()
    }

    #[test]
    fn env_has_service_links_hostname_field_refs_and_expansion() {
        let p = pod(json!({"containers": [{"name": "c", "env": [
            {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
            {"name": "URL", "value": "http://$(MY_APP_SERVICE_HOST):$(MY_APP_SERVICE_PORT)/$(POD)/$$(x)/$(NOPE)"},
            {"name": "HOSTNAME", "value": "override"}]}]}));
        let ctx = PodContext {
            pod: &p,
            pod_ip: "10.244.1.7".parse().unwrap(),
            host_ip: "172.30.0.2".parse().unwrap(),
            node_name: "node1",
        };
        let c = &p.spec.as_ref().unwrap().containers[0];
        let env = container_env(
            &ctx,
            c,
            &[svc("my-app", "192.168.10.12", 8080)],
            &ConfigMapData::new(),
        )
        .unwrap();
        let text: String = env
            .iter()
            .filter(|(k, _)| k != "PATH")
            .map(|(k, v)| format!("{k}={v}\n"))
            .collect();
        expect![[r#"
            HOME=/root
            MY_APP_SERVICE_HOST=192.168.10.12
            MY_APP_SERVICE_PORT=8080
            MY_APP_PORT=tcp://192.168.10.12:8080
            MY_APP_PORT_8080_TCP=tcp://192.168.10.12:8080
            MY_APP_PORT_8080_TCP_PROTO=tcp
            MY_APP_PORT_8080_TCP_PORT=8080
            MY_APP_PORT_8080_TCP_ADDR=192.168.10.12
            POD=web-0
            IP=10.244.1.7
            NODE=node1
            APP=web
            URL=http://192.168.10.12:8080/web-0/$(x)/$(NOPE)
            HOSTNAME=override
        "#]]
        .assert_eq(&text);
    }

    #[test]
    fn unsupported_value_from_names_the_field() {
        let p = pod(
            json!({"containers": [{"name": "c", "env": [{"name": "S", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]}]}),
        );
        let ctx = PodContext {
            pod: &p,
            pod_ip: "10.0.0.1".parse().unwrap(),
            host_ip: "10.0.0.2".parse().unwrap(),
            node_name: "n",
        };
        let err = container_env(
            &ctx,
            &p.spec.as_ref().unwrap().containers[0],
            &[],
            &ConfigMapData::new(),
        )
        .unwrap_err();
        assert_eq!(err.field, "spec.containers[c].env[0].valueFrom");
    }

    #[test]
    fn capabilities_as_containerd_computes_them() {
        let caps = |sc: serde_json::Value| {
            let p = pod(json!({"containers": [{"name": "c", "securityContext": sc}]}));
            capabilities(&p.spec.unwrap().containers[0])
        };
        let names = |bits: u64| -> Vec<&str> {
            (0..CAPABILITIES.len())
                .filter(|i| bits & (1 << i) != 0)
                .map(|i| CAPABILITIES[i])
                .collect()
        };
        assert_eq!(caps(json!({"privileged": true})), Ok(None));
        let default = caps(json!({})).unwrap().unwrap();
        assert_eq!(names(default).len(), 14);
        assert!(!names(default).contains(&"NET_ADMIN"));
        // The proxy DaemonSet's: the defaults and NET_ADMIN, SYS_MODULE.
        let proxy = caps(json!({"capabilities": {"add": ["NET_ADMIN", "SYS_MODULE"]}}));
        assert_eq!(proxy, Ok(Some(default | (1 << 12) | (1 << 16))));
        // CoreDNS's: nothing but binding low ports (the CAP_ prefix is accepted too).
        let dns = caps(json!({"capabilities": {"drop": ["ALL"], "add": ["CAP_NET_BIND_SERVICE"]}}));
        assert_eq!(dns.map(|b| names(b.unwrap())), Ok(vec!["NET_BIND_SERVICE"]));
        let no_raw = caps(json!({"capabilities": {"drop": ["NET_RAW"]}}))
            .unwrap()
            .unwrap();
        assert_eq!(no_raw, default & !(1 << 13));
        let all = caps(json!({"capabilities": {"add": ["ALL"]}}))
            .unwrap()
            .unwrap();
        assert_eq!(names(all).len(), CAPABILITIES.len());
        assert_eq!(
            caps(json!({"capabilities": {"add": ["NET_ADMN"]}})),
            Err(r#"unknown capability "NET_ADMN""#.into())
        );
    }

    #[test]
    fn env_from_config_maps_and_key_refs() {
        let p = pod(json!({"containers": [{"name": "c",
            "envFrom": [
                {"configMapRef": {"name": "endpoint"}},
                {"configMapRef": {"name": "absent", "optional": true}},
                {"prefix": "CFG_", "configMapRef": {"name": "cfg"}}],
            "env": [
                {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "mode"}}},
                {"name": "GONE", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "nope", "optional": true}}},
                {"name": "URL", "value": "https://$(KUBERNETES_SERVICE_HOST):$(KUBERNETES_SERVICE_PORT)"}]}]}));
        let ctx = PodContext {
            pod: &p,
            pod_ip: "10.0.0.1".parse().unwrap(),
            host_ip: "10.0.0.2".parse().unwrap(),
            node_name: "n",
        };
        let c = &p.spec.as_ref().unwrap().containers[0];
        assert_eq!(
            env_config_maps(c).into_iter().collect::<Vec<_>>(),
            ["absent", "cfg", "endpoint"]
        );
        let mut cms = ConfigMapData::new();
        cms.insert(
            "endpoint".into(),
            [
                ("KUBERNETES_SERVICE_HOST", "172.30.0.1"),
                ("KUBERNETES_SERVICE_PORT", "6443"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        );
        cms.insert(
            "cfg".into(),
            [("mode", "nftables"), ("a=b", "skipped")]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        let kube_svc: Service = serde_json::from_value(json!({
            "metadata": {"name": "kubernetes", "namespace": "default"},
            "spec": {"clusterIP": "10.96.0.1", "ports": [{"port": 443, "protocol": "TCP"}]}}))
        .unwrap();
        let env = container_env(&ctx, c, &[kube_svc], &cms).unwrap();
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        // The ConfigMap overrides the kubelet's own KUBERNETES_SERVICE_* (Calico's
        // kubernetes-services-endpoint convention) and declared env reads it.
        assert_eq!(get("KUBERNETES_SERVICE_HOST"), Some("172.30.0.1"));
        assert_eq!(get("KUBERNETES_SERVICE_PORT"), Some("6443"));
        assert_eq!(get("URL"), Some("https://172.30.0.1:6443"));
        assert_eq!(get("CFG_mode"), Some("nftables"));
        assert_eq!(get("MODE"), Some("nftables"));
        assert_eq!(get("GONE"), None);
        assert!(env.iter().all(|(k, _)| !k.contains('=')));
        let hosts = env
            .iter()
            .filter(|(k, _)| k == "KUBERNETES_SERVICE_HOST")
            .count();
        assert_eq!(hosts, 1, "one value per name: {env:?}");

        let err = container_env(&ctx, c, &[], &ConfigMapData::new()).unwrap_err();
        assert_eq!(err.field, "spec.containers[c].envFrom[0].configMapRef");
        assert_eq!(err.message, r#"configmap "endpoint" not found"#);
        cms.get_mut("cfg").unwrap().remove("mode");
        let err = container_env(&ctx, c, &[], &cms).unwrap_err();
        assert_eq!(
            err.field,
            "spec.containers[c].env[0].valueFrom.configMapKeyRef"
        );
        assert_eq!(err.message, "couldn't find key mode in ConfigMap shop/cfg");
    }

    #[test]
    fn launch_command_or_test_server() {
        let p = pod(json!({"containers": [
            {"name": "a", "command": ["sh", "-c"], "args": ["echo $(X)"]},
            {"name": "b", "ports": [{"containerPort": 80}, {"containerPort": 53, "protocol": "UDP"}, {"containerPort": 9, "protocol": "SCTP"}]}]}));
        let cs = &p.spec.as_ref().unwrap().containers;
        let env = vec![("X".to_string(), "1".to_string())];
        assert_eq!(
            launch(&cs[0], &env),
            Launch::Command(vec!["sh".into(), "-c".into(), "echo 1".into()])
        );
        assert_eq!(
            launch(&cs[1], &env),
            Launch::TestServer {
                ports: "tcp:80,udp:53".into()
            }
        );
    }

    #[test]
    fn resolv_conf_per_policy() {
        let dns = vec!["10.96.0.10".to_string()];
        let host = "nameserver 192.0.2.53\nsearch corp.example\noptions edns0\n";
        let first = pod(
            json!({"containers": [], "dnsConfig": {"options": [{"name": "ndots", "value": "2"}, {"name": "edns0"}], "searches": ["x.example"]}}),
        );
        expect![[r#"
            search shop.svc.cluster.local svc.cluster.local cluster.local corp.example x.example
            nameserver 10.96.0.10
            options ndots:2 edns0
        "#]]
        .assert_eq(&resolv_conf(&first, &dns, "cluster.local", host).unwrap());
        let default = pod(json!({"containers": [], "dnsPolicy": "Default"}));
        expect![[r#"
            search corp.example
            nameserver 192.0.2.53
            options edns0
        "#]]
        .assert_eq(&resolv_conf(&default, &dns, "cluster.local", host).unwrap());
        let none = pod(
            json!({"containers": [], "dnsPolicy": "None", "dnsConfig": {"nameservers": ["1.2.3.4"]}}),
        );
        assert_eq!(
            resolv_conf(&none, &dns, "cluster.local", host).unwrap(),
            "nameserver 1.2.3.4\n"
        );
    }

    #[test]
    fn hosts_file_has_fqdn_with_subdomain() {
        let p = pod(
            json!({"containers": [], "hostname": "web-0", "subdomain": "nginx", "hostAliases": [{"ip": "10.1.1.1", "hostnames": ["db"]}]}),
        );
        let text = hosts_file(&p, "10.244.1.9".parse().unwrap(), "cluster.local");
        assert!(
            text.contains("10.244.1.9\tweb-0.nginx.shop.svc.cluster.local\tweb-0\n"),
            "{text}"
        );
        assert!(text.contains("10.1.1.1\tdb\n"), "{text}");
    }
}

#[cfg(test)]
mod image_tests {
    use super::*;

    #[test]
    fn image_repositories_and_mapped_command_lines() {
        assert_eq!(
            image_repository("ghcr.io/svcnet/svcnet:v1"),
            "ghcr.io/svcnet/svcnet"
        );
        assert_eq!(
            image_repository("localhost:5000/svcnet"),
            "localhost:5000/svcnet"
        );
        assert_eq!(
            image_repository("localhost:5000/svcnet:1.2"),
            "localhost:5000/svcnet"
        );
        assert_eq!(image_repository("svcnet@sha256:abc"), "svcnet");
        let c: Container = serde_json::from_value(serde_json::json!({
            "name": "p", "image": "ghcr.io/svcnet/svcnet:v1",
            "command": ["/svcnet", "proxy"], "args": ["--hostname-override=$(NODE_NAME)"],
        }))
        .unwrap();
        let env = vec![("NODE_NAME".to_string(), "n1".to_string())];
        assert_eq!(
            launch_mapped(&c, &env, Path::new("/bin/svcnet")),
            ["/bin/svcnet", "proxy", "--hostname-override=n1"]
        );
        let args_only: Container = serde_json::from_value(serde_json::json!({
            "name": "p", "image": "svcnet", "args": ["dns", "--listen", "0.0.0.0:53"],
        }))
        .unwrap();
        assert_eq!(
            launch_mapped(&args_only, &[], Path::new("/bin/svcnet")),
            ["/bin/svcnet", "dns", "--listen", "0.0.0.0:53"]
        );
    }
}
