//! Identity and RBAC end to end: the real kubectl (impersonating with `--as`, and with a
//! kubeconfig holding a token from `kubectl create token`) and kube-rs with the same token.
//! Every boundary is checked both ways, with upstream's exact status codes and messages.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine;
use common::kubectl::{KUBECTL_1_33 as KUBECTL, Kubectl};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ListParams, PostParams};
use serde_json::{Value, json};

/// Namespaces, ServiceAccounts and bindings the tests share: `rb-a/proxy` holds
/// `system:node-proxier` cluster-wide, `rb-a/viewer` holds `view` only in `rb-a`, `rb-a/dns`
/// holds `system:coredns`.
const SETUP: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: rb-a}
---
apiVersion: v1
kind: Namespace
metadata: {name: rb-b}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: proxy, namespace: rb-a}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: viewer, namespace: rb-a}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: dns, namespace: rb-a}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: rb-proxy}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: system:node-proxier}
subjects:
- {kind: ServiceAccount, name: proxy, namespace: rb-a}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: rb-dns}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: system:coredns}
subjects:
- {kind: ServiceAccount, name: dns, namespace: rb-a}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: rb-view, namespace: rb-a}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: view}
subjects:
- {kind: ServiceAccount, name: viewer}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: settings, namespace: rb-b}
data: {a: "1"}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: rb-b}
spec:
  selector: {app: web}
  ports: [{port: 80}]
"#;

const PROXY: &str = "system:serviceaccount:rb-a:proxy";
const VIEWER: &str = "system:serviceaccount:rb-a:viewer";

/// upstream's 403 message as kubectl prints it.
fn forbidden(user: &str, verb: &str, resource: &str, group: &str, ns: Option<&str>) -> String {
    format!(
        "Error from server (Forbidden): {}",
        denied(user, verb, resource, group, ns)
    )
}

/// upstream's 403 message (`NewForbidden` of the authorizer's refusal).
fn denied(user: &str, verb: &str, resource: &str, group: &str, ns: Option<&str>) -> String {
    let scope = match ns {
        Some(ns) => format!("in the namespace \"{ns}\""),
        None => "at the cluster scope".into(),
    };
    let qualified = if group.is_empty() {
        resource.to_string()
    } else {
        format!("{resource}.{group}")
    };
    format!(
        "{qualified} is forbidden: User \"{user}\" cannot {verb} resource \"{resource}\" in API group \"{group}\" {scope}"
    )
}

fn kubeconfig_with_token(
    dir: &Path,
    name: &str,
    server: &str,
    ca_pem: &str,
    token: &str,
) -> PathBuf {
    let b64 = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    let text = format!(
        "apiVersion: v1
kind: Config
clusters:
- name: svcnet
  cluster: {{server: \"{server}\", certificate-authority-data: {b64}}}
users:
- name: {name}
  user: {{token: \"{token}\"}}
contexts:
- name: {name}
  context: {{cluster: svcnet, user: {name}, namespace: rb-a}}
current-context: {name}
"
    );
    let path = dir.join(format!("{name}.kubeconfig"));
    std::fs::write(&path, text).unwrap();
    path
}

struct Env {
    ts: common::TestServer,
    admin: PathBuf,
    server: String,
}

impl Env {
    async fn start() -> Env {
        Self::start_with(|_| {}).await
    }

    async fn start_with(f: impl FnOnce(&mut svcnet_apiserver::ServerConfig)) -> Env {
        let ts = common::TestServer::start_with(f).await;
        let admin = ts.server().kubeconfig_path().to_path_buf();
        let server = format!("https://{}", ts.server().addr());
        let k = Kubectl::new(KUBECTL, &admin);
        tokio::task::spawn_blocking(move || k.ok_in(&["apply", "-f", "-"], Some(SETUP)))
            .await
            .unwrap();
        Env { ts, admin, server }
    }

    fn admin(&self) -> Kubectl {
        Kubectl::new(KUBECTL, &self.admin)
    }

    fn token_kubeconfig(&self, name: &str, token: &str) -> PathBuf {
        kubeconfig_with_token(
            self.ts.dir.path(),
            name,
            &self.server,
            self.ts.server().ca_pem(),
            token,
        )
    }

    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(Kubectl) -> T + Send + 'static,
    ) -> T {
        let k = self.admin();
        tokio::task::spawn_blocking(move || f(k)).await.unwrap()
    }
}

fn as_user<'a>(args: &[&'a str], user: &'a str) -> Vec<String> {
    let mut v: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    v.push(format!("--as={user}"));
    v
}

fn run(k: &Kubectl, args: &[String]) -> common::kubectl::Out {
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    k.run(&a, None)
}

/// Asserts kubectl succeeded; its output.
fn ok(k: &Kubectl, args: &[String]) -> String {
    let o = run(k, args);
    assert!(o.ok, "kubectl {args:?} failed:\n{}{}", o.stdout, o.stderr);
    o.stdout
}

/// Asserts kubectl failed with exactly `message` on its standard error.
fn refused(k: &Kubectl, args: &[String], message: &str) {
    let o = run(k, args);
    assert!(!o.ok, "kubectl {args:?} should fail:\n{}", o.stdout);
    assert_eq!(o.stderr.trim(), message, "kubectl {args:?}");
}

fn can_i(k: &Kubectl, args: &[String]) -> String {
    let o = run(k, args);
    o.stdout.trim().to_string()
}

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

/// A ClusterIP Service of one port.
fn service(name: &str) -> Service {
    serde_json::from_value(json!({"metadata": {"name": name}, "spec": {"ports": [{"port": 80}]}}))
        .unwrap()
}

/// `kubectl create token <sa>`: the token's claims.
fn create_token(k: &Kubectl, args: &[&str]) -> String {
    let mut all = vec!["create", "token"];
    all.extend_from_slice(args);
    k.ok(&all).trim().to_string()
}

fn claims_of(token: &str) -> Value {
    let payload = token.split('.').nth(1).unwrap();
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload)
        .unwrap();
    serde_json::from_slice(&bytes).unwrap()
}

async fn token_client(env: &Env, name: &str, token: &str) -> kube::Client {
    common::client_for(&env.token_kubeconfig(name, token)).await
}

/// A token from `kubectl create token`: its claims are upstream's, and with it kubectl and
/// kube-rs get what the ServiceAccount's bindings give, and 403 beyond.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn created_tokens_authenticate_and_are_authorized() {
    let env = Env::start().await;
    let (proxy_token, viewer_token) = env
        .blocking(|k| {
            (
                create_token(&k, &["proxy", "-n", "rb-a"]),
                create_token(&k, &["viewer", "-n", "rb-a", "--duration=20m"]),
            )
        })
        .await;
    let c = claims_of(&proxy_token);
    let issuer = "https://kubernetes.default.svc.cluster.local";
    assert_eq!(c["iss"], issuer);
    assert_eq!(c["aud"], json!([issuer]));
    assert_eq!(c["sub"], PROXY);
    assert_eq!(
        c["exp"].as_i64().unwrap() - c["iat"].as_i64().unwrap(),
        3600
    );
    assert_eq!(c["nbf"], c["iat"]);
    assert_eq!(c["kubernetes.io"]["namespace"], "rb-a");
    assert_eq!(c["kubernetes.io"]["serviceaccount"]["name"], "proxy");
    let sa_uid = env
        .blocking(|k| k.get_json(&["serviceaccount", "proxy", "-n", "rb-a"]))
        .await["metadata"]["uid"]
        .clone();
    assert_eq!(c["kubernetes.io"]["serviceaccount"]["uid"], sa_uid);
    let v = claims_of(&viewer_token);
    assert_eq!(
        v["exp"].as_i64().unwrap() - v["iat"].as_i64().unwrap(),
        1200
    );

    // kubectl with a kubeconfig holding the token.
    let proxy_kc = env.token_kubeconfig("proxy", &proxy_token);
    let viewer_kc = env.token_kubeconfig("viewer", &viewer_token);
    tokio::task::spawn_blocking(move || {
        let k = Kubectl::new(KUBECTL, &proxy_kc);
        let svcs = k.ok(&["get", "services", "-A", "-o", "name"]);
        assert!(svcs.contains("service/web"), "{svcs}");
        k.ok(&["get", "endpointslices", "-A"]);
        refused(
            &k,
            &["create".into(), "service".into(), "clusterip".into(), "x".into(), "--tcp=80".into()],
            &format!(
                "error: failed to create ClusterIP service: {}",
                denied(PROXY, "create", "services", "", Some("rb-a"))
            ),
        );
        refused(
            &k,
            &["get".into(), "configmaps".into(), "-n".into(), "rb-b".into()],
            &forbidden(PROXY, "list", "configmaps", "", Some("rb-b")),
        );
        assert_eq!(k.ok(&["auth", "can-i", "list", "services", "-A"]).trim(), "yes");
        assert_eq!(can_i(&k, &["auth".into(), "can-i".into(), "create".into(), "services".into()]), "no");
        let who: Value = serde_json::from_str(&k.ok(&["auth", "whoami", "-o", "json"])).unwrap();
        assert_eq!(who["status"]["userInfo"]["username"], PROXY);
        let credential = &who["status"]["userInfo"]["extra"]["authentication.kubernetes.io/credential-id"];
        assert!(credential[0].as_str().unwrap().starts_with("JTI="), "{who}");

        let k = Kubectl::new(KUBECTL, &viewer_kc);
        k.ok(&["get", "pods,services,configmaps"]);
        refused(
            &k,
            &["delete".into(), "serviceaccount".into(), "proxy".into()],
            &format!(
                "Error from server (Forbidden): serviceaccounts \"proxy\" is forbidden: User \"{VIEWER}\" cannot delete resource \"serviceaccounts\" in API group \"\" in the namespace \"rb-a\""
            ),
        );
        // Impersonation is itself a permission, which `view` does not give.
        refused(
            &k,
            &["get".into(), "pods".into(), format!("--as={PROXY}")],
            &format!(
                "Error from server (Forbidden): serviceaccounts \"proxy\" is forbidden: User \"{VIEWER}\" cannot impersonate resource \"serviceaccounts\" in API group \"\" in the namespace \"rb-a\""
            ),
        );
    })
    .await
    .unwrap();

    // kube-rs with the same token: lists and a watch that sees a change, and the 403 Status.
    let client = token_client(&env, "proxy-rs", &proxy_token).await;
    let services: Api<Service> = Api::all(client.clone());
    assert!(
        services
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .iter()
            .any(|s| s.metadata.name.as_deref() == Some("web"))
    );
    let slices: Api<EndpointSlice> = Api::all(client.clone());
    slices.list(&ListParams::default()).await.unwrap();
    let mut watch = kube::runtime::watcher(services.clone(), Default::default()).boxed();
    let admin = env.ts.client().await;
    let admin_svcs: Api<Service> = Api::namespaced(admin, "rb-b");
    let mut created = false;
    let seen = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(ev) = watch.try_next().await.unwrap() {
            if let kube::runtime::watcher::Event::InitDone = ev
                && !created
            {
                created = true;
                admin_svcs
                    .create(&PostParams::default(), &service("late"))
                    .await
                    .unwrap();
            }
            if let kube::runtime::watcher::Event::Apply(s) = ev
                && s.metadata.name.as_deref() == Some("late")
            {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(
        seen,
        Ok(true),
        "the token's watch did not see the new service"
    );
    let own: Api<Service> = Api::namespaced(client.clone(), "rb-a");
    match own.create(&PostParams::default(), &service("x")).await {
        Err(kube::Error::Api(e)) => {
            assert_eq!((e.code, e.reason.as_str()), (403, "Forbidden"));
            assert_eq!(
                e.message,
                format!(
                    "services is forbidden: User \"{PROXY}\" cannot create resource \"services\" in API group \"\" in the namespace \"rb-a\""
                )
            );
        }
        other => panic!("creating a service with node-proxier's token: {other:?}"),
    }
    let cms: Api<ConfigMap> = Api::namespaced(client, "rb-b");
    let raw = common::raw::Raw {
        client: token_client(&env, "proxy-raw", &proxy_token).await,
    };
    let r = raw.get("/api/v1/namespaces/rb-b/configmaps/settings").await;
    assert_eq!(r.code, 403);
    assert_eq!(
        r.body,
        json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": format!("configmaps \"settings\" is forbidden: User \"{PROXY}\" cannot get resource \"configmaps\" in API group \"\" in the namespace \"rb-b\""),
            "reason": "Forbidden",
            "details": {"name": "settings", "kind": "configmaps"},
            "code": 403,
        })
    );
    assert!(cms.get("settings").await.is_err());
    env.ts.stop().await;
}

/// The Status every refused credential gets.
fn unauthorized() -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": "Unauthorized", "reason": "Unauthorized", "code": 401})
}

fn sign(key_pem: &str, claims: &Value) -> String {
    let pair = rcgen::KeyPair::from_pem(key_pem).unwrap();
    let key = jsonwebtoken::EncodingKey::from_ec_der(&pair.serialize_der());
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::ES256),
        claims,
        &key,
    )
    .unwrap()
}

/// Expired, forged (another key, an edited payload) and orphaned tokens get 401 with
/// upstream's Status, from kube-rs and kubectl alike; a token too short-lived is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_tokens_get_401() {
    let env = Env::start().await;
    let token = env
        .blocking(|k| create_token(&k, &["proxy", "-n", "rb-a"]))
        .await;
    let claims = claims_of(&token);
    let status_of = |name: &'static str, token: String| {
        let env = &env;
        async move {
            let raw = common::raw::Raw {
                client: token_client(env, name, &token).await,
            };
            raw.get("/api/v1/services").await
        }
    };
    let ok = status_of("good", token.clone()).await;
    assert_eq!(ok.code, 200, "{}", ok.body);

    // Signed with the cluster's own key, but expired (beyond the minute of leeway).
    let key = std::fs::read_to_string(env.ts.dir.path().join("pki/sa.key")).unwrap();
    let now = jiff::Timestamp::now().as_second();
    let mut expired = claims.clone();
    expired["iat"] = json!(now - 4000);
    expired["nbf"] = json!(now - 4000);
    expired["exp"] = json!(now - 400);
    // A key of the right kind that is not the cluster's.
    let stranger = rcgen::KeyPair::generate().unwrap().serialize_pem();
    // The payload edited to name another account, the signature kept.
    let mut parts: Vec<String> = token.split('.').map(str::to_string).collect();
    let mut edited = claims.clone();
    edited["sub"] = json!("system:serviceaccount:rb-a:viewer");
    edited["kubernetes.io"]["serviceaccount"]["name"] = json!("viewer");
    parts[1] = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(edited.to_string());
    // Another audience.
    let mut vault = claims.clone();
    vault["aud"] = json!(["vault"]);
    for (name, bad) in [
        ("expired", sign(&key, &expired)),
        ("stranger", sign(&stranger, &claims)),
        ("edited", parts.join(".")),
        ("audience", sign(&key, &vault)),
        ("garbage", "not-a-jwt".to_string()),
    ] {
        let r = status_of(name, bad.clone()).await;
        assert_eq!((r.code, &r.body), (401, &unauthorized()), "{name} token");
        // Authentication comes first: also where nothing is served.
        let raw = common::raw::Raw {
            client: token_client(&env, "nowhere", &bad).await,
        };
        let r = raw.get("/api/v1/widgets").await;
        assert_eq!(
            (r.code, &r.body),
            (401, &unauthorized()),
            "{name} token, unknown path"
        );
    }
    let expired_kc = env.token_kubeconfig("expired-kc", &sign(&key, &expired));
    let out = tokio::task::spawn_blocking(move || {
        Kubectl::new(KUBECTL, &expired_kc).fails(&["get", "pods"])
    })
    .await
    .unwrap();
    assert_eq!(
        out.trim(),
        "error: You must be logged in to the server (Unauthorized)"
    );

    // A token outlives neither its ServiceAccount nor a namesake made later.
    env.blocking(|k| {
        k.ok(&["delete", "serviceaccount", "proxy", "-n", "rb-a"]);
        k.ok(&["create", "serviceaccount", "proxy", "-n", "rb-a"]);
    })
    .await;
    let r = status_of("deleted", token.clone()).await;
    assert_eq!(
        (r.code, &r.body),
        (401, &unauthorized()),
        "token of a deleted ServiceAccount"
    );

    // TokenRequest validation and binding to a pod.
    let msg = env
        .blocking(|k| k.fails(&["create", "token", "proxy", "-n", "rb-a", "--duration=5m"]))
        .await;
    assert_eq!(
        msg.trim(),
        "error: failed to create token: TokenRequest.authentication.k8s.io \"proxy\" is invalid: spec.expirationSeconds: Invalid value: 300: may not specify a duration less than 10 minutes"
    );
    let msg = env
        .blocking(|k| k.fails(&["create", "token", "nobody", "-n", "rb-a"]))
        .await;
    assert_eq!(
        msg.trim(),
        "error: failed to create token: serviceaccounts \"nobody\" not found"
    );
    let bound = env
        .blocking(|k| {
            k.ok_in(
                &["apply", "-f", "-"],
                Some("apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: rb-a}\nspec:\n  serviceAccountName: proxy\n  containers: [{name: c, image: busybox}]\n"),
            );
            create_token(&k, &["proxy", "-n", "rb-a", "--bound-object-kind=Pod", "--bound-object-name=p"])
        })
        .await;
    let c = claims_of(&bound);
    assert_eq!(c["kubernetes.io"]["pod"]["name"], "p");
    let r = status_of("bound", bound.clone()).await;
    assert_eq!(r.code, 200, "{}", r.body);
    env.blocking(|k| {
        k.ok(&[
            "delete",
            "pod",
            "p",
            "-n",
            "rb-a",
            "--grace-period=0",
            "--force",
            "--wait=false",
        ])
    })
    .await;
    let r = status_of("unbound", bound).await;
    assert_eq!(
        (r.code, &r.body),
        (401, &unauthorized()),
        "token of a deleted pod"
    );
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

/// A connection without a client certificate is held to the limits of unauthenticated ones
/// only until a bearer token authenticates a request on it: then a watch outlives them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_connections_outlive_the_unauthenticated_limits() {
    let env = Env::start_with(|c| c.limits.unauthenticated_lifetime = Duration::from_secs(1)).await;
    let token = env
        .blocking(|k| create_token(&k, &["proxy", "-n", "rb-a"]))
        .await;
    let client = token_client(&env, "proxy-watch", &token).await;
    let services: Api<Service> = Api::all(client);
    let params = kube::api::WatchParams::default().timeout(20);
    let mut stream = services.watch(&params, "0").await.unwrap().boxed();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let admin: Api<Service> = Api::namespaced(env.ts.client().await, "rb-b");
    admin
        .create(&PostParams::default(), &service("after"))
        .await
        .unwrap();
    let seen = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(ev) = stream.try_next().await.unwrap() {
            if let kube::api::WatchEvent::Added(s) = ev
                && s.metadata.name.as_deref() == Some("after")
            {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(
        seen,
        Ok(true),
        "the watch on a token's connection ended early"
    );
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
