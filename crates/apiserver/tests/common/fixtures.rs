//! A minimal valid object of every served resource, for the tests that go through them all.

use serde_json::{Value, json};

/// A minimal valid object of every served resource, by its collection path.
pub fn fixture(collection: &str) -> Value {
    let pod_spec = json!({"containers": [{"name": "c", "image": "i"}]});
    let template = json!({"metadata": {"labels": {"a": "b"}}, "spec": pod_spec});
    let selector = json!({"matchLabels": {"a": "b"}});
    let name = json!({"name": "fx"});
    let plural = collection.rsplit('/').next().unwrap();
    let group = collection.split('/').nth(2).unwrap_or("");
    match (group, plural) {
        ("v1", "namespaces" | "nodes" | "configmaps" | "serviceaccounts") => {
            json!({"metadata": name})
        }
        ("v1", "pods") => json!({"metadata": name, "spec": pod_spec}),
        ("v1", "services") => json!({"metadata": name, "spec": {"ports": [{"port": 80}]}}),
        ("v1", "endpoints") => {
            json!({"metadata": name, "subsets": [{"addresses": [{"ip": "10.244.9.9"}], "ports": [{"port": 80}]}]})
        }
        ("v1", "events") => {
            json!({"metadata": name, "involvedObject": {"kind": "Pod", "name": "p"}, "reason": "R", "message": "m"})
        }
        ("discovery.k8s.io", "endpointslices") => {
            json!({"metadata": name, "addressType": "IPv4", "endpoints": [{"addresses": ["10.244.9.9"]}]})
        }
        ("apps", "deployments" | "replicasets" | "daemonsets") => {
            json!({"metadata": name, "spec": {"selector": selector, "template": template}})
        }
        ("apps", "statefulsets") => {
            json!({"metadata": name, "spec": {"serviceName": "s", "selector": selector, "template": template}})
        }
        ("events.k8s.io", "events") => {
            json!({"metadata": name, "eventTime": "2026-01-01T00:00:00.000000Z", "reportingController": "x/y", "reportingInstance": "i", "action": "A", "reason": "R", "type": "Normal", "regarding": {"kind": "Pod", "name": "p"}})
        }
        ("coordination.k8s.io", "leases") => {
            json!({"metadata": name, "spec": {"holderIdentity": "me"}})
        }
        ("networking.k8s.io", "networkpolicies") => {
            json!({"metadata": name, "spec": {"podSelector": {"matchLabels": {"a": "b"}}, "ingress": [{"from": [{"podSelector": {}}], "ports": [{"port": 80}]}]}})
        }
        ("apps", "controllerrevisions") => {
            json!({"metadata": name, "revision": 1, "data": {"spec": {"template": template}}})
        }
        ("rbac.authorization.k8s.io", "roles" | "clusterroles") => {
            json!({"metadata": name, "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]})
        }
        ("rbac.authorization.k8s.io", "rolebindings" | "clusterrolebindings") => {
            json!({"metadata": name, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"}, "subjects": [{"kind": "ServiceAccount", "name": "fx", "namespace": "default"}]})
        }
        _ => panic!("no fixture for {collection}: add one for the new resource"),
    }
}
