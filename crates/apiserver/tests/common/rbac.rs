//! What the identity and RBAC tests share: the namespaces, ServiceAccounts and bindings they
//! set up, upstream's refusal messages, kubeconfigs holding a token, kubectl helpers.

use std::path::{Path, PathBuf};

use super::kubectl::{KUBECTL_1_33 as KUBECTL, Kubectl};
use base64::Engine;

/// Namespaces, ServiceAccounts and bindings the tests share: `rb-a/proxy` holds
/// `system:node-proxier` cluster-wide, `rb-a/viewer` holds `view` only in `rb-a`, `rb-a/dns`
/// holds `system:coredns`.
pub const SETUP: &str = r#"
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

pub const PROXY: &str = "system:serviceaccount:rb-a:proxy";
pub const VIEWER: &str = "system:serviceaccount:rb-a:viewer";

/// upstream's 403 message as kubectl prints it.
pub fn forbidden(user: &str, verb: &str, resource: &str, group: &str, ns: Option<&str>) -> String {
    format!(
        "Error from server (Forbidden): {}",
        denied(user, verb, resource, group, ns)
    )
}

/// upstream's 403 message (`NewForbidden` of the authorizer's refusal).
pub fn denied(user: &str, verb: &str, resource: &str, group: &str, ns: Option<&str>) -> String {
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

pub fn kubeconfig_with_token(
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

/// A test server with [`SETUP`] applied, its admin kubeconfig and its URL.
pub struct Env {
    pub ts: super::TestServer,
    pub admin: PathBuf,
    pub server: String,
}

impl Env {
    pub async fn start() -> Env {
        Self::start_with(|_| {}).await
    }

    pub async fn start_with(f: impl FnOnce(&mut svcnet_apiserver::ServerConfig)) -> Env {
        let ts = super::TestServer::start_with(f).await;
        let admin = ts.server().kubeconfig_path().to_path_buf();
        let server = format!("https://{}", ts.server().addr());
        let k = Kubectl::new(KUBECTL, &admin);
        tokio::task::spawn_blocking(move || k.ok_in(&["apply", "-f", "-"], Some(SETUP)))
            .await
            .unwrap();
        Env { ts, admin, server }
    }

    pub fn admin(&self) -> Kubectl {
        Kubectl::new(KUBECTL, &self.admin)
    }

    pub fn token_kubeconfig(&self, name: &str, token: &str) -> PathBuf {
        kubeconfig_with_token(
            self.ts.dir.path(),
            name,
            &self.server,
            self.ts.server().ca_pem(),
            token,
        )
    }

    pub async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(Kubectl) -> T + Send + 'static,
    ) -> T {
        let k = self.admin();
        tokio::task::spawn_blocking(move || f(k)).await.unwrap()
    }
}

pub fn as_user<'a>(args: &[&'a str], user: &'a str) -> Vec<String> {
    let mut v: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    v.push(format!("--as={user}"));
    v
}

pub fn run(k: &Kubectl, args: &[String]) -> super::kubectl::Out {
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    k.run(&a, None)
}

/// Asserts kubectl succeeded; its output.
pub fn ok(k: &Kubectl, args: &[String]) -> String {
    let o = run(k, args);
    assert!(o.ok, "kubectl {args:?} failed:\n{}{}", o.stdout, o.stderr);
    o.stdout
}

/// Asserts kubectl failed with exactly `message` on its standard error.
pub fn refused(k: &Kubectl, args: &[String], message: &str) {
    let o = run(k, args);
    assert!(!o.ok, "kubectl {args:?} should fail:\n{}", o.stdout);
    assert_eq!(o.stderr.trim(), message, "kubectl {args:?}");
}

/// `kubectl auth can-i …`'s answer.
pub fn can_i(k: &Kubectl, args: &[String]) -> String {
    let o = run(k, args);
    o.stdout.trim().to_string()
}

/// `kubectl create token <sa>`: the token.
pub fn create_token(k: &Kubectl, args: &[&str]) -> String {
    let mut all = vec!["create", "token"];
    all.extend_from_slice(args);
    k.ok(&all).trim().to_string()
}

/// A kube-rs client that authenticates with `token`.
pub async fn token_client(env: &Env, name: &str, token: &str) -> kube::Client {
    super::client_for(&env.token_kubeconfig(name, token)).await
}
