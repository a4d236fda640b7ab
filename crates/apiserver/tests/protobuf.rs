//! kubectl's typed commands send protobuf bodies (`kubectl create namespace`, `create service`,
//! `create deployment`, `expose`); the server decodes them and answers JSON.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::process::Command;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Service};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::Api;

const KUBECTL: &str = "/usr/lib/google-cloud-sdk/bin/kubectl.1.33";

fn kubectl(kubeconfig: &Path, args: &[&str]) -> String {
    let out = Command::new(KUBECTL)
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .env("HOME", kubeconfig.parent().unwrap())
        .output()
        .expect("kubectl runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "kubectl {args:?}:\n{text}");
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_create_family_over_protobuf() {
    assert!(Path::new(KUBECTL).exists(), "{KUBECTL} is missing");
    let ts = common::TestServer::start().await;
    let kc = ts.server().kubeconfig_path().to_path_buf();
    tokio::task::spawn_blocking(move || {
        let k = |args: &[&str]| kubectl(&kc, args);
        // -v=8 shows the request headers: the bodies really are protobuf.
        let out = k(&["create", "namespace", "team", "-v=8"]);
        assert!(out.contains("namespace/team created"), "{out}");
        assert!(
            out.contains("Content-Type: application/vnd.kubernetes.protobuf"),
            "{out}"
        );
        let out = k(&[
            "create",
            "service",
            "clusterip",
            "web",
            "--tcp=80:8080",
            "-n",
            "team",
        ]);
        assert!(out.contains("service/web created"), "{out}");
        let out = k(&[
            "create",
            "service",
            "nodeport",
            "np",
            "--tcp=80:80",
            "--node-port=30080",
        ]);
        assert!(out.contains("service/np created"), "{out}");
        let out = k(&[
            "create",
            "service",
            "externalname",
            "ext",
            "--external-name=db.example.com",
        ]);
        assert!(out.contains("service/ext created"), "{out}");
        let out = k(&[
            "create",
            "deployment",
            "myapp",
            "--image=nginx",
            "--replicas=3",
            "--port=80",
        ]);
        assert!(out.contains("deployment.apps/myapp created"), "{out}");
        let out = k(&[
            "expose",
            "deployment",
            "myapp",
            "--port=80",
            "--target-port=8080",
            "--name=myapp",
        ]);
        assert!(out.contains("service/myapp exposed"), "{out}");
        let out = k(&[
            "create",
            "deployment",
            "zero",
            "--image=nginx",
            "--replicas=0",
        ]);
        assert!(out.contains("deployment.apps/zero created"), "{out}");
    })
    .await
    .unwrap();

    let client = ts.client().await;
    let ns = Api::<Namespace>::all(client.clone())
        .get("team")
        .await
        .unwrap();
    assert_eq!(ns.status.unwrap().phase.as_deref(), Some("Active"));
    let team: Api<Service> = Api::namespaced(client.clone(), "team");
    let web = team.get("web").await.unwrap().spec.unwrap();
    assert_eq!(web.type_.as_deref(), Some("ClusterIP"));
    assert!(web.cluster_ip.unwrap().starts_with("10."));
    let port = &web.ports.unwrap()[0];
    assert_eq!(
        (port.port, port.target_port.clone()),
        (80, Some(IntOrString::Int(8080)))
    );
    assert_eq!(web.selector.unwrap()["app"], "web");

    let svcs: Api<Service> = Api::namespaced(client.clone(), "default");
    let np = svcs.get("np").await.unwrap().spec.unwrap();
    assert_eq!(np.ports.unwrap()[0].node_port, Some(30080));
    let ext = svcs.get("ext").await.unwrap().spec.unwrap();
    assert_eq!(ext.external_name.as_deref(), Some("db.example.com"));
    assert_eq!(
        ext.cluster_ip, None,
        "ExternalName services get no cluster IP"
    );
    let exposed = svcs.get("myapp").await.unwrap().spec.unwrap();
    assert_eq!(exposed.selector.unwrap()["app"], "myapp");

    let deps: Api<Deployment> = Api::namespaced(client, "default");
    let d = deps.get("myapp").await.unwrap().spec.unwrap();
    assert_eq!(d.replicas, Some(3));
    let c = &d.template.spec.unwrap().containers[0];
    assert_eq!(
        (c.name.as_str(), c.image.as_deref()),
        ("nginx", Some("nginx"))
    );
    assert_eq!(c.ports.as_ref().unwrap()[0].container_port, 80);
    let zero = deps.get("zero").await.unwrap().spec.unwrap();
    assert_eq!(zero.replicas, Some(0), "an explicit replicas: 0 is kept");
    ts.stop().await;
}
