//! A traced branch in words, from svcnet's v2 table: the frontend from the comment of the
//! group element the DNAT matched (`cluster IP of ns/name/proto/port`), the masquerade reason
//! from the data set that marked it, the verdict from the refusal set or node-wide check that
//! ended it. It reads the userspace proxy's redirect table too.

use svcnet_proxy::trace::{Branch, Explanation, Outcome, why};

/// The frontend named by the comment the tracer appended to a DNAT rule (` # <comment>`).
fn frontend_of(rule: &str) -> Option<String> {
    rule.rsplit_once(" # ").map(|(_, c)| c.to_string())
}

/// A branch in words.
pub fn explain(b: &Branch) -> Explanation {
    let frontend = b
        .ended_by
        .as_ref()
        .and_then(|(_, rule)| frontend_of(rule))
        .or_else(|| {
            // The userspace proxy's table: a redirect rule per frontend.
            let (chain, rule) = b.ended_by.as_ref()?;
            let (m, _) = rule.split_once(" redirect to ")?;
            (chain == "frontends").then(|| format!("userspace frontend `{m}`"))
        });
    let is_cluster_ip = frontend
        .as_deref()
        .is_some_and(|f| f.starts_with("cluster IP"));
    let masquerade = b.masquerade_by.as_ref().map(|(chain, rule)| {
        if rule.contains("@hairpin") {
            why::HAIRPIN.to_string()
        } else if rule.contains("masq-off-cluster") {
            why::OFF_CLUSTER.to_string()
        } else if rule.contains("masq-local-source") {
            why::LOCAL_SHORT_CIRCUIT.to_string()
        } else if rule.contains("masq-always") && is_cluster_ip {
            "every connection to a cluster IP is masqueraded (--masquerade-all)".to_string()
        } else if rule.contains("masq-always") {
            why::EXTERNAL_CLUSTER.to_string()
        } else {
            format!("marked by `{rule}` in chain {chain}")
        }
    });
    let (end_chain, end_rule) = b
        .ended_by
        .clone()
        .unwrap_or_else(|| (String::new(), String::new()));
    let verdict = match &b.outcome {
        Outcome::Endpoint { to, .. } => format!("DNAT to {to}"),
        Outcome::Listener { port } => format!(
            "redirected to the userspace proxy's listener on port {port}: it picks the endpoint \
             with the service's algorithm and connects to it from the node"
        ),
        Outcome::Pass => why::NOT_A_SERVICE.to_string(),
        Outcome::Reject
            if end_rule.contains("@cluster-ips") || end_chain == "cluster-ips-check" =>
        {
            why::UNKNOWN_PORT.to_string()
        }
        Outcome::Reject if end_rule.contains("no-endpoint-") => why::NO_ENDPOINTS.to_string(),
        Outcome::Drop if end_rule.contains("@firewall-allow") => why::SOURCE_RANGES.to_string(),
        Outcome::Drop if end_chain == "cluster-ips-check" => why::UNALLOCATED.to_string(),
        Outcome::Drop | Outcome::Reject
            if end_rule.contains("local-refuse-") || end_rule.contains("no-endpoint-drop") =>
        {
            why::NO_LOCAL_ENDPOINTS.to_string()
        }
        Outcome::Reject => format!("rejected by `{end_rule}` in chain {end_chain}"),
        Outcome::Drop => format!("dropped by `{end_rule}` in chain {end_chain}"),
    };
    Explanation {
        frontend,
        masquerade,
        verdict,
    }
}
