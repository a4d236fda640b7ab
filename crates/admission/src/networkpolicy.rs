//! `networking.k8s.io/v1` NetworkPolicies: upstream's defaulting (`policyTypes`, port
//! protocol `TCP`) and validation (`pkg/apis/networking/validation`: peers, ipBlocks, ports,
//! label selectors, policy types), with upstream's field paths and messages.

use k8s_openapi::api::networking::v1::{
    IPBlock, NetworkPolicy, NetworkPolicyPeer, NetworkPolicyPort, NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::Value;

use crate::apps::validate_selector;
use crate::codec::{decode, encode};
use crate::error::FieldError;
use crate::syntax::{self, NameRule};

const PROTOCOLS: &[&str] = &["TCP", "UDP", "SCTP"];
const POLICY_TYPES: &[&str] = &["Ingress", "Egress"];

/// upstream `SetDefaults_NetworkPolicyPort` and `SetDefaults_NetworkPolicy`. The spec and its
/// pod selector are value fields in Go, so a stored policy always carries both.
fn default_policy(np: &mut NetworkPolicy) {
    let spec = np.spec.get_or_insert_with(NetworkPolicySpec::default);
    spec.pod_selector.get_or_insert_with(LabelSelector::default);
    let ports = spec
        .ingress
        .iter_mut()
        .flatten()
        .flat_map(|r| r.ports.iter_mut().flatten())
        .chain(
            spec.egress
                .iter_mut()
                .flatten()
                .flat_map(|r| r.ports.iter_mut().flatten()),
        );
    for port in ports {
        port.protocol.get_or_insert_with(|| "TCP".to_string());
    }
    // Ingress always; Egress only when egress rules exist: an egress-only (or deny-all-egress)
    // policy has to say so.
    if spec.policy_types.as_ref().is_none_or(Vec::is_empty) {
        let mut types = vec!["Ingress".to_string()];
        if spec.egress.as_ref().is_some_and(|e| !e.is_empty()) {
            types.push("Egress".to_string());
        }
        spec.policy_types = Some(types);
    }
}

/// upstream `ValidateLabelSelector` without `AllowInvalidLabelValueInSelector`: the keys and
/// operators (shared with the workloads) and the values of `In`/`NotIn` expressions.
fn validate_label_selector(sel: &LabelSelector, path: &str) -> Vec<FieldError> {
    let mut errs = validate_selector(sel, path);
    for (i, r) in sel.match_expressions.iter().flatten().enumerate() {
        for (j, v) in r.values.iter().flatten().enumerate() {
            errs.extend(syntax::is_valid_label_value(v).into_iter().map(|m| {
                FieldError::invalid(format!("{path}.matchExpressions[{i}].values[{j}]"), v, m)
            }));
        }
    }
    errs
}

/// upstream `ValidateNetworkPolicyPort`.
fn validate_port(port: &NetworkPolicyPort, path: &str) -> Vec<FieldError> {
    let mut errs = Vec::new();
    if let Some(p) = port.protocol.as_deref()
        && !PROTOCOLS.contains(&p)
    {
        errs.push(FieldError::not_supported(
            format!("{path}.protocol"),
            p,
            PROTOCOLS,
        ));
    }
    let end_path = format!("{path}.endPort");
    match (&port.port, port.end_port) {
        (Some(IntOrString::Int(p)), end) => {
            errs.extend(
                syntax::is_valid_port_num(*p)
                    .into_iter()
                    .map(|m| FieldError::invalid(format!("{path}.port"), *p, m)),
            );
            if let Some(end) = end {
                if end < *p {
                    errs.push(FieldError::invalid(
                        &end_path,
                        end,
                        "must be greater than or equal to `port`",
                    ));
                }
                errs.extend(
                    syntax::is_valid_port_num(end)
                        .into_iter()
                        .map(|m| FieldError::invalid(&end_path, end, m)),
                );
            }
        }
        (Some(IntOrString::String(name)), end) => {
            if let Some(end) = end {
                errs.push(FieldError::invalid(
                    &end_path,
                    end,
                    "may not be specified when `port` is non-numeric",
                ));
            }
            errs.extend(
                syntax::is_valid_port_name(name)
                    .into_iter()
                    .map(|m| FieldError::invalid(format!("{path}.port"), name, m)),
            );
        }
        (None, Some(end)) => errs.push(FieldError::invalid(
            &end_path,
            end,
            "may not be specified when `port` is not specified",
        )),
        (None, None) => {}
    }
    errs
}

/// upstream `ValidateIPBlock` (its legacy CIDR syntax: host bits may be set, as in
/// `192.168.1.1/24`, which the API documents as a valid example).
fn validate_ip_block(block: &IPBlock, path: &str) -> Vec<FieldError> {
    if block.cidr.is_empty() {
        return vec![FieldError::required(format!("{path}.cidr"), "")];
    }
    let Ok(cidr) = block.cidr.parse::<ipnet::IpNet>() else {
        return vec![FieldError::invalid(
            format!("{path}.cidr"),
            &block.cidr,
            syntax::CIDR_MSG,
        )];
    };
    let mut errs = Vec::new();
    for (i, except) in block.except.iter().flatten().enumerate() {
        let p = format!("{path}.except[{i}]");
        let Ok(net) = except.parse::<ipnet::IpNet>() else {
            errs.push(FieldError::invalid(&p, except, syntax::CIDR_MSG));
            continue;
        };
        // Strictly inside: its network address in `cidr` and a longer prefix (so neither
        // equal to `cidr` nor wider than it).
        if !cidr.contains(&net.network()) || cidr.prefix_len() >= net.prefix_len() {
            errs.push(FieldError::invalid(
                &p,
                except,
                "must be a strict subset of `cidr`",
            ));
        }
    }
    errs
}

/// upstream's `networkPolicyWarnings`: every `ipBlock.cidr` and `except` in a non-standard
/// form (legacy validation accepts them).
pub(crate) fn warnings(obj: &Value) -> Vec<String> {
    let spec = obj.get("spec");
    let mut out = Vec::new();
    for (field, peers) in [("ingress", "from"), ("egress", "to")] {
        let rules = spec.and_then(|s| s.get(field)).and_then(Value::as_array);
        for (i, rule) in rules.into_iter().flatten().enumerate() {
            let list = rule.get(peers).and_then(Value::as_array);
            for (j, peer) in list.into_iter().flatten().enumerate() {
                let Some(block) = peer.get("ipBlock") else {
                    continue;
                };
                let path = format!("spec.{field}[{i}].{peers}[{j}].ipBlock");
                if let Some(cidr) = block.get("cidr").and_then(Value::as_str) {
                    out.extend(syntax::cidr_warnings(&format!("{path}.cidr"), cidr));
                }
                let except = block.get("except").and_then(Value::as_array);
                for (k, e) in except.into_iter().flatten().enumerate() {
                    if let Some(e) = e.as_str() {
                        out.extend(syntax::cidr_warnings(&format!("{path}.except[{k}]"), e));
                    }
                }
            }
        }
    }
    out
}

/// upstream `ValidateNetworkPolicyPeer`: exactly one kind of peer, or both selectors.
fn validate_peer(peer: &NetworkPolicyPeer, path: &str) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let mut peers = 0;
    if let Some(sel) = &peer.pod_selector {
        peers += 1;
        errs.extend(validate_label_selector(sel, &format!("{path}.podSelector")));
    }
    if let Some(sel) = &peer.namespace_selector {
        peers += 1;
        errs.extend(validate_label_selector(
            sel,
            &format!("{path}.namespaceSelector"),
        ));
    }
    if let Some(block) = &peer.ip_block {
        peers += 1;
        errs.extend(validate_ip_block(block, &format!("{path}.ipBlock")));
    }
    if peers == 0 {
        errs.push(FieldError::required(path, "must specify a peer"));
    } else if peers > 1 && peer.ip_block.is_some() {
        errs.push(FieldError::forbidden(
            path,
            "may not specify both ipBlock and another peer",
        ));
    }
    errs
}

/// upstream `ValidateNetworkPolicySpec`.
fn validate_spec(spec: &NetworkPolicySpec) -> Vec<FieldError> {
    let mut errs = Vec::new();
    if let Some(sel) = &spec.pod_selector {
        errs.extend(validate_label_selector(sel, "spec.podSelector"));
    }
    for (i, rule) in spec.ingress.iter().flatten().enumerate() {
        for (j, port) in rule.ports.iter().flatten().enumerate() {
            errs.extend(validate_port(
                port,
                &format!("spec.ingress[{i}].ports[{j}]"),
            ));
        }
        for (j, peer) in rule.from.iter().flatten().enumerate() {
            errs.extend(validate_peer(peer, &format!("spec.ingress[{i}].from[{j}]")));
        }
    }
    for (i, rule) in spec.egress.iter().flatten().enumerate() {
        for (j, port) in rule.ports.iter().flatten().enumerate() {
            errs.extend(validate_port(port, &format!("spec.egress[{i}].ports[{j}]")));
        }
        for (j, peer) in rule.to.iter().flatten().enumerate() {
            errs.extend(validate_peer(peer, &format!("spec.egress[{i}].to[{j}]")));
        }
    }
    let types = spec.policy_types.as_deref().unwrap_or(&[]);
    if types.len() > POLICY_TYPES.len() {
        errs.push(FieldError::invalid(
            "spec.policyTypes",
            types,
            "may not specify more than two policyTypes",
        ));
        return errs;
    }
    for (i, t) in types.iter().enumerate() {
        if !POLICY_TYPES.contains(&t.as_str()) {
            errs.push(FieldError::not_supported(
                format!("spec.policyTypes[{i}]"),
                t,
                POLICY_TYPES,
            ));
        }
    }
    errs
}

/// Defaults and validates a NetworkPolicy on create and on update alike (upstream's update
/// validation adds only the metadata rules the API server applies to every kind).
pub(crate) fn admit(obj: Value) -> Result<Value, Vec<FieldError>> {
    let mut np: NetworkPolicy = decode(obj)?;
    default_policy(&mut np);
    let mut errs = syntax::validate_object_meta(&np.metadata, true, NameRule::Dns1123Subdomain);
    if let Some(spec) = &np.spec {
        errs.extend(validate_spec(spec));
    }
    if errs.is_empty() {
        encode(&np)
    } else {
        Err(errs)
    }
}
