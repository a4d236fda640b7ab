//! RBAC end to end: the real kubectl impersonating ServiceAccounts with `--as`, the default
//! ServiceAccounts and roles, the escalation check, and the rights the shipped manifests grant.
//! Every boundary is checked both ways, with upstream's exact status codes and messages. The
//! tokens themselves are in `tokens.rs`.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::kubectl::{KUBECTL_1_33 as KUBECTL, Kubectl};
use common::rbac::*;
use kube::api::Api;
use serde_json::{Value, json};

/// The boundaries of `system:node-proxier`, `system:coredns` and a namespaced `view`,
/// through kubectl's impersonation from the admin kubeconfig.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn impersonated_service_accounts_get_exactly_their_roles() {
    let env = Env::start().await;
    env.blocking(|k| {
        // node-proxier: list/watch services and endpointslices everywhere, and nothing else.
        let svcs = ok(&k, &as_user(&["get", "services", "-A", "-o", "name"], PROXY));
        assert!(svcs.contains("service/web"), "{svcs}");
        ok(&k, &as_user(&["get", "endpointslices", "-A"], PROXY));
        ok(&k, &as_user(&["get", "nodes"], PROXY));
        refused(
            &k,
            &as_user(&["create", "service", "clusterip", "x", "--tcp=80", "-n", "rb-a"], PROXY),
            &format!(
                "error: failed to create ClusterIP service: {}",
                denied(PROXY, "create", "services", "", Some("rb-a"))
            ),
        );
        refused(
            &k,
            &as_user(&["get", "configmaps", "-n", "rb-b"], PROXY),
            &forbidden(PROXY, "list", "configmaps", "", Some("rb-b")),
        );
        refused(
            &k,
            &as_user(&["get", "configmap", "settings", "-n", "rb-b"], PROXY),
            &format!(
                "Error from server (Forbidden): configmaps \"settings\" is forbidden: User \"{PROXY}\" cannot get resource \"configmaps\" in API group \"\" in the namespace \"rb-b\""
            ),
        );
        refused(
            &k,
            &as_user(&["delete", "service", "web", "-n", "rb-b"], PROXY),
            &format!(
                "Error from server (Forbidden): services \"web\" is forbidden: User \"{PROXY}\" cannot delete resource \"services\" in API group \"\" in the namespace \"rb-b\""
            ),
        );
        // A service read by name is not a list: node-proxier has no `get` on services.
        refused(
            &k,
            &as_user(&["get", "service", "web", "-n", "rb-b"], PROXY),
            &format!(
                "Error from server (Forbidden): services \"web\" is forbidden: User \"{PROXY}\" cannot get resource \"services\" in API group \"\" in the namespace \"rb-b\""
            ),
        );

        // coredns: also pods and namespaces, still read-only.
        let dns = "system:serviceaccount:rb-a:dns";
        ok(&k, &as_user(&["get", "pods", "-A"], dns));
        ok(&k, &as_user(&["get", "namespaces"], dns));
        refused(
            &k,
            &as_user(&["get", "nodes"], dns),
            &forbidden(dns, "list", "nodes", "", None),
        );

        // view through a RoleBinding: reads in rb-a only, never writes.
        ok(&k, &as_user(&["get", "pods,services,configmaps,endpointslices", "-n", "rb-a"], VIEWER));
        refused(
            &k,
            &as_user(&["get", "configmaps", "-n", "rb-b"], VIEWER),
            &forbidden(VIEWER, "list", "configmaps", "", Some("rb-b")),
        );
        refused(
            &k,
            &as_user(&["create", "configmap", "c", "--from-literal=a=b", "-n", "rb-a"], VIEWER),
            &format!(
                "error: failed to create configmap: {}",
                denied(VIEWER, "create", "configmaps", "", Some("rb-a"))
            ),
        );
        refused(
            &k,
            &as_user(&["get", "rolebindings", "-n", "rb-a"], VIEWER),
            &forbidden(VIEWER, "list", "rolebindings", "rbac.authorization.k8s.io", Some("rb-a")),
        );

        // kubectl auth can-i answers from the same rules.
        for (args, user, want) in [
            (&["auth", "can-i", "watch", "services", "-A"][..], PROXY, "yes"),
            (&["auth", "can-i", "list", "endpointslices.discovery.k8s.io", "-A"], PROXY, "yes"),
            (&["auth", "can-i", "create", "services", "-n", "rb-a"], PROXY, "no"),
            (&["auth", "can-i", "get", "configmaps", "-n", "rb-b"], PROXY, "no"),
            (&["auth", "can-i", "list", "pods", "-n", "rb-a"], VIEWER, "yes"),
            (&["auth", "can-i", "list", "pods", "-n", "rb-b"], VIEWER, "no"),
            (&["auth", "can-i", "update", "deployments.apps", "-n", "rb-a"], VIEWER, "no"),
            (&["auth", "can-i", "get", "/healthz"], VIEWER, "yes"),
            (&["auth", "can-i", "get", "/metrics"], VIEWER, "no"),
        ] {
            assert_eq!(can_i(&k, &as_user(args, user)), want, "{user}: kubectl {args:?}");
        }
        // A user and a group, impersonated: a RoleBinding to the group grants in its namespace.
        k.ok_in(
            &["apply", "-f", "-"],
            Some("apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {name: devs, namespace: rb-b}\nroleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: edit}\nsubjects: [{kind: Group, name: devs}]\n"),
        );
        let alice = |args: &[&str]| {
            let mut v = as_user(args, "alice");
            v.push("--as-group=devs".into());
            v
        };
        ok(&k, &alice(&["create", "configmap", "from-alice", "--from-literal=a=b", "-n", "rb-b"]));
        refused(
            &k,
            &alice(&["get", "configmaps", "-n", "rb-a"]),
            &forbidden("alice", "list", "configmaps", "", Some("rb-a")),
        );
        refused(
            &k,
            &as_user(&["get", "configmaps", "-n", "rb-b"], "alice"),
            &forbidden("alice", "list", "configmaps", "", Some("rb-b")),
        );
        let who: Value = serde_json::from_str(&ok(&k, &alice(&["auth", "whoami", "-o", "json"]))).unwrap();
        assert_eq!(
            who["status"]["userInfo"],
            json!({"username": "alice", "groups": ["devs", "system:authenticated"]})
        );
        let whoami = ok(&k, &as_user(&["auth", "whoami", "-o", "json"], PROXY));
        let who: Value = serde_json::from_str(&whoami).unwrap();
        assert_eq!(
            who["status"]["userInfo"],
            json!({"username": PROXY, "groups": ["system:serviceaccounts", "system:serviceaccounts:rb-a", "system:authenticated"]})
        );

    })
    .await;
    env.ts.stop().await;
}

/// Every namespace gets a `default` ServiceAccount, also after it is deleted; the default
/// roles exist and discovery works with a token that has no other binding.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_service_accounts_and_roles() {
    let env = Env::start().await;
    let token = env
        .blocking(|k| {
            for name in [
                "cluster-admin",
                "admin",
                "edit",
                "view",
                "system:node-proxier",
                "system:coredns",
                "system:discovery",
                "system:basic-user",
                "system:public-info-viewer",
            ] {
                k.ok(&["get", "clusterrole", name]);
            }
            let crb = k.get_json(&["clusterrolebinding", "cluster-admin"]);
            assert_eq!(
                crb["subjects"],
                json!([{"kind": "Group", "apiGroup": "rbac.authorization.k8s.io", "name": "system:masters"}])
            );
            let wait_default = |ns: &str| {
                for _ in 0..100 {
                    if k.run(&["get", "serviceaccount", "default", "-n", ns], None).ok {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
                panic!("no default ServiceAccount in {ns}");
            };
            for ns in ["default", "kube-system", "rb-a", "rb-b"] {
                wait_default(ns);
            }
            k.ok(&["delete", "serviceaccount", "default", "-n", "rb-b"]);
            wait_default("rb-b");
            // kubectl's typed create commands send the RBAC kinds as protobuf.
            k.ok(&["create", "role", "reader", "--verb=get,list", "--resource=pods,services", "-n", "rb-b"]);
            k.ok(&["create", "clusterrole", "node-reader", "--verb=get", "--resource=nodes", "--resource-name=n1"]);
            k.ok(&["create", "rolebinding", "rb", "--role=reader", "--serviceaccount=rb-a:viewer", "--user=u", "--group=g", "-n", "rb-b"]);
            k.ok(&["create", "clusterrolebinding", "crb", "--clusterrole=node-reader", "--user=u"]);
            let role = k.get_json(&["role", "reader", "-n", "rb-b"]);
            assert_eq!(
                role["rules"],
                json!([{"apiGroups": [""], "resources": ["pods", "services"], "verbs": ["get", "list"]}])
            );
            let cr = k.get_json(&["clusterrole", "node-reader"]);
            assert_eq!(cr["rules"][0]["resourceNames"], json!(["n1"]));
            let rb = k.get_json(&["rolebinding", "rb", "-n", "rb-b"]);
            assert_eq!(
                rb["subjects"],
                json!([
                    {"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": "u"},
                    {"kind": "Group", "apiGroup": "rbac.authorization.k8s.io", "name": "g"},
                    {"kind": "ServiceAccount", "name": "viewer", "namespace": "rb-a"},
                ])
            );
            assert_eq!(
                rb["roleRef"],
                json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "reader"})
            );
            let table = k.ok(&["get", "clusterrolebinding", "crb", "-o", "wide"]);
            assert_eq!(
                table.lines().next().map(|h| h.split_whitespace().collect::<Vec<_>>()),
                Some(vec!["NAME", "ROLE", "AGE", "USERS", "GROUPS", "SERVICEACCOUNTS"]),
                "{table}"
            );
            let table = k.ok(&["get", "clusterrole", "node-reader"]);
            assert!(table.starts_with("NAME          CREATED AT"), "{table}");
            let explained = k.ok(&["explain", "rolebinding.roleRef"]);
            assert!(explained.contains("RoleRef contains information that points to the role being used"), "{explained}");
            // RBAC objects are validated.
            let err = k.fails_in(
                &["apply", "-f", "-"],
                "apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {name: bad, namespace: rb-a}\nroleRef: {apiGroup: rbac.authorization.k8s.io, kind: Secret, name: x}\nsubjects: [{kind: ServiceAccount, name: default}]\n",
            );
            assert!(
                err.contains("roleRef.kind: Unsupported value: \"Secret\": supported values: \"Role\", \"ClusterRole\""),
                "{err}"
            );
            create_token(&k, &["default", "-n", "rb-b"])
        })
        .await;
    let path = env.token_kubeconfig("default-sa", &token);
    tokio::task::spawn_blocking(move || {
        let k = Kubectl::new(KUBECTL, &path);
        // Discovery and the reviews are every authenticated user's.
        k.ok(&["api-resources", "-o", "name"]);
        k.ok(&["version"]);
        let rules = k.ok(&["auth", "can-i", "--list", "-n", "rb-b"]);
        assert!(
            rules.contains("selfsubjectaccessreviews.authorization.k8s.io"),
            "{rules}"
        );
        refused(
            &k,
            &["get".into(), "pods".into(), "-n".into(), "rb-b".into()],
            &forbidden(
                "system:serviceaccount:rb-b:default",
                "list",
                "pods",
                "",
                Some("rb-b"),
            ),
        );
    })
    .await
    .unwrap();
    env.ts.stop().await;
}

/// upstream's escalation check: a namespace `admin` may grant what it holds (bind `view`,
/// write a Role of its own rules) but not more (`cluster-admin`, a Role over nodes), and
/// patching a Role is judged on the patched rules.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn roles_and_bindings_grant_no_more_than_their_writer_holds() {
    let env = Env::start().await;
    env.blocking(|k| {
        k.ok_in(
            &["apply", "-f", "-"],
            Some(
                "apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: boss, namespace: rb-a}\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {name: rb-boss, namespace: rb-a}\nroleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: admin}\nsubjects: [{kind: ServiceAccount, name: boss}]\n",
            ),
        );
        let boss = "system:serviceaccount:rb-a:boss";
        let groups = r#"["system:serviceaccounts" "system:serviceaccounts:rb-a" "system:authenticated"]"#;
        let binding = |name: &str, role: &str| {
            format!(
                "apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {{name: {name}, namespace: rb-a}}\nroleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: {role}}}\nsubjects: [{{kind: ServiceAccount, name: viewer}}]\n"
            )
        };
        let apply = |manifest: &str| {
            k.run(&["apply", "-f", "-", &format!("--as={boss}")], Some(manifest))
        };
        let o = apply(&binding("ok-view", "view"));
        assert!(o.ok, "{}", o.stderr);
        let o = apply(&binding("too-much", "cluster-admin"));
        assert!(!o.ok);
        assert_eq!(
            o.stderr.trim(),
            format!(
                "Error from server (Forbidden): error when creating \"STDIN\": rolebindings.rbac.authorization.k8s.io \"too-much\" is forbidden: user \"{boss}\" (groups={groups}) is attempting to grant RBAC permissions not currently held:\n{{APIGroups:[\"*\"], Resources:[\"*\"], Verbs:[\"*\"]}}\n{{NonResourceURLs:[\"*\"], Verbs:[\"*\"]}}"
            )
        );
        let role = |rules: &str| {
            format!(
                "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {{name: mine, namespace: rb-a}}\nrules: {rules}\n"
            )
        };
        let o = apply(&role(r#"[{apiGroups: [""], resources: [pods], verbs: [get, list]}]"#));
        assert!(o.ok, "{}", o.stderr);
        // Applying a change patches the Role: the patched rules are what is judged.
        let o = apply(&role(
            r#"[{apiGroups: [""], resources: [pods], verbs: [get, list]}, {apiGroups: [""], resources: [nodes], verbs: [list]}]"#,
        ));
        assert!(!o.ok);
        assert!(
            o.stderr.trim().ends_with(&format!(
                "roles.rbac.authorization.k8s.io \"mine\" is forbidden: user \"{boss}\" (groups={groups}) is attempting to grant RBAC permissions not currently held:\n{{APIGroups:[\"\"], Resources:[\"nodes\"], Verbs:[\"list\"]}}"
            )),
            "{}",
            o.stderr
        );
        // Nothing was written by the refused requests.
        k.fails(&["get", "rolebinding", "too-much", "-n", "rb-a"]);
        let mine = k.get_json(&["role", "mine", "-n", "rb-a"]);
        assert_eq!(mine["rules"].as_array().unwrap().len(), 1);
        // The admin (system:masters) may grant anything.
        k.ok_in(&["apply", "-f", "-"], Some(&binding("by-admin", "cluster-admin")));
        let table = k.ok(&["get", "rolebindings", "-n", "rb-a", "-o", "wide"]);
        assert!(
            table.lines().any(|l| l.starts_with("by-admin") && l.contains("ClusterRole/cluster-admin") && l.trim_end().ends_with(" viewer")),
            "{table}"
        );
    })
    .await;
    env.ts.stop().await;
}

/// The ServiceAccounts, Roles and bindings of the shipped add-on manifests
/// (`deploy/svcnet.yaml`), applied unchanged.
fn shipped_rbac() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy/svcnet.yaml");
    let text = std::fs::read_to_string(path).unwrap();
    let wanted = [
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
    ];
    text.split("\n---\n")
        .filter(|doc| {
            doc.lines().any(|l| {
                l.strip_prefix("kind: ")
                    .is_some_and(|k| wanted.contains(&k.trim()))
            })
        })
        .collect::<Vec<_>>()
        .join("\n---\n")
}

/// Every role boundary the shipped manifests rely on, both ways, through impersonation of
/// each part's ServiceAccount: what the proxy, DNS and CNI parts do is allowed, and the
/// neighbouring rights they do not need are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shipped_manifests_grant_each_part_exactly_its_rights() {
    let env = Env::start().await;
    env.blocking(|k| {
        k.ok_in(&["apply", "-f", "-"], Some(&shipped_rbac()));
        let proxy = "system:serviceaccount:kube-system:svcnet-proxy";
        let dns = "system:serviceaccount:kube-system:svcnet-dns";
        let cni = "system:serviceaccount:kube-system:svcnet-cni";
        let cases: &[(&str, &[&str], &str)] = &[
            // The proxy: kube-proxy's reads, its Events, its status Lease in kube-system.
            (proxy, &["list", "services", "-A"], "yes"),
            (proxy, &["watch", "services", "-A"], "yes"),
            (
                proxy,
                &["watch", "endpointslices.discovery.k8s.io", "-A"],
                "yes",
            ),
            (proxy, &["list", "endpoints", "-A"], "yes"),
            (proxy, &["get", "nodes/n1"], "yes"),
            (proxy, &["create", "events", "-n", "default"], "yes"),
            (
                proxy,
                &["patch", "events.events.k8s.io", "-n", "default"],
                "yes",
            ),
            (
                proxy,
                &["create", "leases.coordination.k8s.io", "-n", "kube-system"],
                "yes",
            ),
            (
                proxy,
                &[
                    "update",
                    "leases.coordination.k8s.io/svcnet-proxy-n1",
                    "-n",
                    "kube-system",
                ],
                "yes",
            ),
            (
                proxy,
                &["update", "leases.coordination.k8s.io", "-n", "default"],
                "no",
            ),
            (
                proxy,
                &["delete", "leases.coordination.k8s.io", "-n", "kube-system"],
                "no",
            ),
            (proxy, &["create", "services", "-n", "default"], "no"),
            (
                proxy,
                &["update", "endpointslices.discovery.k8s.io", "-n", "default"],
                "no",
            ),
            (proxy, &["list", "pods", "-A"], "no"),
            (proxy, &["list", "configmaps", "-n", "kube-system"], "no"),
            (proxy, &["get", "secrets", "-n", "kube-system"], "no"),
            (proxy, &["patch", "nodes/status"], "no"),
            // Both node parts read their own pod and DaemonSet when stopped (an update or the
            // add-on's deletion), in kube-system only.
            (proxy, &["get", "pods/p", "-n", "kube-system"], "yes"),
            (proxy, &["get", "daemonsets.apps/svcnet-proxy", "-n", "kube-system"], "yes"),
            (proxy, &["get", "pods/p", "-n", "default"], "no"),
            (proxy, &["get", "daemonsets.apps", "-n", "default"], "no"),
            (proxy, &["update", "daemonsets.apps", "-n", "kube-system"], "no"),
            (cni, &["get", "daemonsets.apps/svcnet-cni", "-n", "kube-system"], "yes"),
            (cni, &["delete", "pods/p", "-n", "kube-system"], "no"),
            (dns, &["get", "daemonsets.apps", "-n", "kube-system"], "no"),
            // DNS: CoreDNS's reads and nothing else.
            (dns, &["watch", "services", "-A"], "yes"),
            (
                dns,
                &["list", "endpointslices.discovery.k8s.io", "-A"],
                "yes",
            ),
            (dns, &["watch", "pods", "-A"], "yes"),
            (dns, &["list", "namespaces"], "yes"),
            (dns, &["list", "nodes"], "no"),
            (dns, &["create", "events", "-n", "default"], "no"),
            (dns, &["update", "services", "-n", "default"], "no"),
            (dns, &["list", "configmaps", "-A"], "no"),
            // CNI: flannel's: pods by name, nodes, and only the status of nodes written.
            (cni, &["get", "pods/p", "-n", "default"], "yes"),
            (cni, &["watch", "nodes"], "yes"),
            (cni, &["patch", "nodes/n1", "--subresource=status"], "yes"),
            (cni, &["patch", "nodes/n1"], "no"),
            (cni, &["list", "pods", "-A"], "no"),
            (cni, &["list", "services", "-A"], "no"),
        ];
        for (user, args, want) in cases {
            let mut all = vec!["auth", "can-i"];
            all.extend_from_slice(args);
            assert_eq!(
                can_i(&k, &as_user(&all, user)),
                *want,
                "{user}: kubectl auth can-i {args:?}"
            );
        }
        // And the same through real requests.
        ok(
            &k,
            &as_user(&["get", "services,endpointslices", "-A"], proxy),
        );
        ok(
            &k,
            &as_user(&["get", "pods,services,namespaces", "-A"], dns),
        );
        ok(&k, &as_user(&["get", "nodes"], cni));
        refused(
            &k,
            &as_user(&["get", "pods", "-A"], proxy),
            &forbidden(proxy, "list", "pods", "", None),
        );
        refused(
            &k,
            &as_user(&["get", "nodes"], dns),
            &forbidden(dns, "list", "nodes", "", None),
        );
        // The CNI part writes a node's status, never the node (its status patch, as flannel
        // sends it, is below with the part's own token: kubectl's patch reads first).
        k.ok_in(&["apply", "-f", "-"], Some("apiVersion: v1\nkind: Node\nmetadata: {name: n1}\n"));
        refused(
            &k,
            &as_user(&["label", "node", "n1", "x=y"], cni),
            &format!(
                "Error from server (Forbidden): nodes \"n1\" is forbidden: User \"{cni}\" cannot patch resource \"nodes\" in API group \"\" at the cluster scope"
            ),
        );
    })
    .await;
    let token = env
        .blocking(|k| create_token(&k, &["svcnet-cni", "-n", "kube-system"]))
        .await;
    let nodes: Api<k8s_openapi::api::core::v1::Node> =
        Api::all(token_client(&env, "cni", &token).await);
    let status = json!({"status": {"conditions": [{"type": "NetworkUnavailable", "status": "False", "reason": "SvcnetReady", "message": "m"}]}});
    nodes
        .patch_status(
            "n1",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&status),
        )
        .await
        .unwrap();
    // flanneld's lease (what `svcnet cni install` publishes): its annotations through the
    // status subresource, as a strategic merge, with the conditions kept.
    let lease =
        json!({"metadata": {"annotations": {"flannel.alpha.coreos.com/backend-type": "vxlan"}}});
    let node = nodes
        .patch_status(
            "n1",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Strategic(&lease),
        )
        .await
        .unwrap();
    let annotations = node.metadata.annotations.unwrap_or_default();
    assert_eq!(
        annotations
            .get("flannel.alpha.coreos.com/backend-type")
            .map(String::as_str),
        Some("vxlan")
    );
    let conditions = node.status.unwrap().conditions.unwrap_or_default();
    assert!(
        conditions.iter().any(|c| c.type_ == "NetworkUnavailable"),
        "{conditions:?}"
    );
    match nodes
        .patch(
            "n1",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&json!({"metadata": {"labels": {"x": "y"}}})),
        )
        .await
    {
        Err(kube::Error::Api(e)) => assert_eq!(
            (e.code, e.message.as_str()),
            (
                403,
                "nodes \"n1\" is forbidden: User \"system:serviceaccount:kube-system:svcnet-cni\" cannot patch resource \"nodes\" in API group \"\" at the cluster scope"
            )
        ),
        other => panic!("the CNI part patched a node: {other:?}"),
    }
    env.ts.stop().await;
}
