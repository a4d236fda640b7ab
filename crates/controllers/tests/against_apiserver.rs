//! The controllers against the real svcnet API server, started in-process on a free port with
//! its data in a temporary directory, driven through kube-rs as in a cluster. Pods live on
//! another node ("other-node") and get their status set by hand, the way kwok does.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::{Endpoints, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use svcnet_controllers::{ControllerOptions, run};

mod common;

struct Cluster {
    client: kube::Client,
    server: Option<svcnet_apiserver::RunningServer>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    controllers: Option<tokio::task::JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

impl Cluster {
    async fn start() -> Result<Self> {
        let common::TestServer {
            client,
            server,
            dir,
            ..
        } = common::start_server().await?;
        let (stop, rx) = tokio::sync::oneshot::channel::<()>();
        let opts = ControllerOptions {
            node_name: "svcnet-test-node".into(),
            ..Default::default()
        };
        let c = client.clone();
        let controllers = tokio::spawn(async move {
            if let Err(e) = run(c, opts, async {
                let _ = rx.await;
            })
            .await
            {
                panic!("controllers failed: {e}");
            }
        });
        let nodes: Api<Node> = Api::all(client.clone());
        nodes
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "metadata": {"name": "other-node", "labels": {"topology.kubernetes.io/zone": "zone-x"}}
                }))?,
            )
            .await?;
        Ok(Self {
            client,
            server: Some(server),
            stop: Some(stop),
            controllers: Some(controllers),
            _dir: dir,
        })
    }

    async fn stop(mut self) -> Result<()> {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(c) = self.controllers.take() {
            c.await?;
        }
        if let Some(s) = self.server.take() {
            s.shutdown().await?;
        }
        Ok(())
    }

    fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
    {
        Api::namespaced(self.client.clone(), "default")
    }

    /// A pod on "other-node", then its status set like a kubelet would.
    async fn kwok_pod(&self, name: &str, app: &str, ip: &str, ready: bool) -> Result<()> {
        let pods: Api<Pod> = self.api();
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"app": app}},
            "spec": {"nodeName": "other-node", "containers": [{"name": "c", "image": "nginx",
                      "ports": [{"name": "http", "containerPort": 8080}]}]}
        }))?;
        pods.create(&PostParams::default(), &pod).await?;
        self.set_pod_status(name, ip, ready).await
    }

    async fn set_pod_status(&self, name: &str, ip: &str, ready: bool) -> Result<()> {
        let pods: Api<Pod> = self.api();
        let status = json!({"status": {
            "phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
            "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]
        }});
        pods.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
            .await?;
        Ok(())
    }

    async fn slices_of(&self, svc: &str) -> Result<Vec<EndpointSlice>> {
        let api: Api<EndpointSlice> = self.api();
        Ok(api
            .list(&ListParams::default().labels(&format!("kubernetes.io/service-name={svc}")))
            .await?
            .items)
    }

    async fn live_pods(&self, selector: &str) -> Result<Vec<Pod>> {
        let api: Api<Pod> = self.api();
        let pods = api
            .list(&ListParams::default().labels(selector))
            .await?
            .items;
        Ok(pods
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .collect())
    }
}

/// Polls `check` until it returns Ok(true), failing with the last observation after 30 s.
async fn eventually<F, Fut>(what: &str, mut check: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<String>>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let last = match check().await {
            Ok(None) => return Ok(()),
            Ok(Some(why)) => why,
            Err(e) => format!("error: {e:#}"),
        };
        if tokio::time::Instant::now() > deadline {
            bail!("timed out waiting for {what}; last seen: {last}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn endpoint_summary(slices: &[EndpointSlice]) -> Vec<(String, bool, Option<String>)> {
    let mut v: Vec<_> = slices
        .iter()
        .flat_map(|s| s.endpoints.iter())
        .map(|e| {
            (
                e.addresses.join(","),
                e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(false),
                e.zone.clone(),
            )
        })
        .collect();
    v.sort();
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slices_and_endpoints_follow_pods() -> Result<()> {
    let c = Cluster::start().await?;
    let svcs: Api<Service> = c.api();
    let svc: Service = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {"selector": {"app": "web"}, "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}
    }))?;
    svcs.create(&PostParams::default(), &svc).await?;
    c.kwok_pod("web-a", "web", "10.244.1.5", true).await?;
    c.kwok_pod("web-b", "web", "10.244.1.6", true).await?;
    c.kwok_pod("other", "db", "10.244.1.7", true).await?;

    let want = vec![
        ("10.244.1.5".to_string(), true, Some("zone-x".to_string())),
        ("10.244.1.6".to_string(), true, Some("zone-x".to_string())),
    ];
    eventually("two ready endpoints in one slice", || async {
        let slices = c.slices_of("web").await?;
        let got = endpoint_summary(&slices);
        Ok((slices.len() != 1 || got != want).then(|| format!("{} slices: {got:?}", slices.len())))
    })
    .await?;
    let slice = &c.slices_of("web").await?[0];
    assert_eq!(slice.address_type, "IPv4");
    assert_eq!(
        slice.ports.as_ref().unwrap()[0].port,
        Some(8080),
        "named targetPort resolved"
    );
    let labels = slice.metadata.labels.clone().unwrap_or_default();
    assert_eq!(
        labels["endpointslice.kubernetes.io/managed-by"],
        "endpointslice-controller.k8s.io"
    );
    assert!(slice.metadata.name.as_deref().unwrap().starts_with("web-"));
    // The controllers write as upstream's kube-controller-manager field manager.
    let managers: Vec<(String, String)> = slice
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .map(|e| {
            (
                e.manager.clone().unwrap_or_default(),
                e.operation.clone().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        managers,
        [("kube-controller-manager".to_string(), "Update".to_string())]
    );
    let owner = &slice.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str()),
        ("Service", "web")
    );

    let eps: Api<Endpoints> = c.api();
    eventually("Endpoints with both addresses", || async {
        let ep = eps.get_opt("web").await?;
        let addrs: Vec<String> = ep
            .iter()
            .flat_map(|e| e.subsets.iter().flatten())
            .flat_map(|s| s.addresses.iter().flatten())
            .map(|a| a.ip.clone())
            .collect();
        Ok((addrs != ["10.244.1.5", "10.244.1.6"]).then(|| format!("{addrs:?}")))
    })
    .await?;

    // web-b turns NotReady.
    c.set_pod_status("web-b", "10.244.1.6", false).await?;
    eventually("web-b not ready in the slice", || async {
        let got = endpoint_summary(&c.slices_of("web").await?);
        let ok = got.iter().any(|(a, r, _)| a == "10.244.1.6" && !r)
            && got.iter().any(|(a, r, _)| a == "10.244.1.5" && *r);
        Ok((!ok).then(|| format!("{got:?}")))
    })
    .await?;
    eventually("web-b in notReadyAddresses", || async {
        let ep = eps.get("web").await?;
        let nr: Vec<String> = ep
            .subsets
            .iter()
            .flatten()
            .flat_map(|s| s.not_ready_addresses.iter().flatten())
            .map(|a| a.ip.clone())
            .collect();
        Ok((nr != ["10.244.1.6"]).then(|| format!("{ep:?}")))
    })
    .await?;

    // A deleted pod leaves the slice.
    let pods: Api<Pod> = c.api();
    pods.delete(
        "web-a",
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        },
    )
    .await?;
    eventually("web-a gone from the slice", || async {
        let got = endpoint_summary(&c.slices_of("web").await?);
        Ok(got
            .iter()
            .any(|(a, _, _)| a == "10.244.1.5")
            .then(|| format!("{got:?}")))
    })
    .await?;

    // Deleting the service removes its slices and Endpoints.
    svcs.delete("web", &DeleteParams::default()).await?;
    eventually("slices and Endpoints removed", || async {
        let n = c.slices_of("web").await?.len();
        let ep = eps.get_opt("web").await?;
        Ok((n != 0 || ep.is_some())
            .then(|| format!("{n} slices, endpoints present: {}", ep.is_some())))
    })
    .await?;
    c.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn selectorless_endpoints_are_mirrored() -> Result<()> {
    let c = Cluster::start().await?;
    let svcs: Api<Service> = c.api();
    svcs.create(
        &PostParams::default(),
        &serde_json::from_value(
            json!({"metadata": {"name": "mysql"}, "spec": {"ports": [{"port": 3306}]}}),
        )?,
    )
    .await?;
    let eps: Api<Endpoints> = c.api();
    eps.create(
        &PostParams::default(),
        &serde_json::from_value(json!({
            "metadata": {"name": "mysql"},
            "subsets": [{"addresses": [{"ip": "192.168.1.5"}], "ports": [{"port": 3306}]}]
        }))?,
    )
    .await?;
    eventually("a mirrored slice", || async {
        let slices = c.slices_of("mysql").await?;
        let ok = slices.len() == 1
            && slices[0]
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("endpointslice.kubernetes.io/managed-by"))
                .map(String::as_str)
                == Some("endpointslicemirroring-controller.k8s.io")
            && endpoint_summary(&slices) == [("192.168.1.5".to_string(), true, None)];
        Ok((!ok).then(|| format!("{slices:?}")))
    })
    .await?;
    c.stop().await
}

/// The seeds' external-database manifest with the Endpoints first: the controller must not
/// delete hand-written Endpoints of a service that does not exist yet; once the Service comes
/// they are mirrored, and deleting the Service takes them with it, as upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoints_written_before_their_service_are_kept() -> Result<()> {
    let c = Cluster::start().await?;
    let eps: Api<Endpoints> = c.api();
    eps.create(
        &PostParams::default(),
        &serde_json::from_value(json!({
            "metadata": {"name": "mysql"},
            "subsets": [{"addresses": [{"ip": "192.168.1.5"}], "ports": [{"port": 3306}]}]
        }))?,
    )
    .await?;
    // Long enough for the controller to have seen them (it reacts within milliseconds).
    tokio::time::sleep(Duration::from_secs(2)).await;
    if eps.get_opt("mysql").await?.is_none() {
        bail!("the Endpoints controller deleted hand-written Endpoints before their Service");
    }
    let svcs: Api<Service> = c.api();
    svcs.create(
        &PostParams::default(),
        &serde_json::from_value(
            json!({"metadata": {"name": "mysql"}, "spec": {"ports": [{"port": 3306}]}}),
        )?,
    )
    .await?;
    eventually("a mirrored slice", || async {
        let slices = c.slices_of("mysql").await?;
        let ok = endpoint_summary(&slices) == [("192.168.1.5".to_string(), true, None)];
        Ok((!ok).then(|| format!("{slices:?}")))
    })
    .await?;
    if eps.get_opt("mysql").await?.is_none() {
        bail!("the Endpoints are gone after their Service came");
    }
    svcs.delete("mysql", &DeleteParams::default()).await?;
    eventually("the Endpoints go with their Service", || async {
        Ok(eps.get_opt("mysql").await?.map(|e| format!("{e:?}")))
    })
    .await?;
    c.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deployment_creates_and_scales_pods() -> Result<()> {
    let c = Cluster::start().await?;
    let deploys: Api<Deployment> = c.api();
    let d: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "myapp"},
        "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "myapp"}},
                 "template": {"metadata": {"labels": {"app": "myapp"}},
                              "spec": {"containers": [{"name": "c", "image": "nginx"}]}}}
    }))?;
    deploys.create(&PostParams::default(), &d).await?;
    eventually("3 pods", || async {
        let pods = c.live_pods("app=myapp").await?;
        Ok((pods.len() != 3).then(|| format!("{} pods", pods.len())))
    })
    .await?;
    for p in c.live_pods("app=myapp").await? {
        let name = p.metadata.name.clone().unwrap();
        let hash = p
            .metadata
            .labels
            .as_ref()
            .unwrap()
            .get("pod-template-hash")
            .cloned()
            .context("hash label")?;
        let rest = name
            .strip_prefix(&format!("myapp-{hash}-"))
            .with_context(|| format!("pod name {name}"))?;
        assert_eq!(rest.len(), 5, "{name}");
        // The pod belongs to the ReplicaSet `myapp-<hash>`, which belongs to the Deployment.
        let owner = &p.metadata.owner_references.as_ref().unwrap()[0];
        let rs_name = format!("myapp-{hash}");
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str(), owner.controller),
            ("ReplicaSet", rs_name.as_str(), Some(true))
        );
        let rs = Api::<ReplicaSet>::namespaced(c.client.clone(), "default")
            .get(&rs_name)
            .await?;
        let owner = &rs.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str(), owner.controller),
            ("Deployment", "myapp", Some(true))
        );
    }
    eventually("pods bound to the local node", || async {
        let pods = c.live_pods("app=myapp").await?;
        let unbound = pods
            .iter()
            .filter(|p| {
                p.spec.as_ref().and_then(|s| s.node_name.as_deref()) != Some("svcnet-test-node")
            })
            .count();
        Ok((unbound != 0).then(|| format!("{unbound} unbound")))
    })
    .await?;
    eventually("status.replicas = 3", || async {
        let d = deploys.get("myapp").await?;
        let st = d.status.unwrap_or_default();
        Ok((st.replicas != Some(3) || st.updated_replicas != Some(3)).then(|| format!("{st:?}")))
    })
    .await?;

    deploys
        .patch(
            "myapp",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 1}})),
        )
        .await?;
    eventually("1 pod", || async {
        let pods = c.live_pods("app=myapp").await?;
        Ok((pods.len() != 1).then(|| format!("{} pods", pods.len())))
    })
    .await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(c.live_pods("app=myapp").await?.len(), 1, "stays at 1");
    c.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statefulset_creates_pods_in_order() -> Result<()> {
    let c = Cluster::start().await?;
    let sets: Api<StatefulSet> = c.api();
    let s: StatefulSet = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {"replicas": 3, "serviceName": "nginx", "selector": {"matchLabels": {"app": "nginx"}},
                 "template": {"metadata": {"labels": {"app": "nginx"}},
                              "spec": {"containers": [{"name": "c", "image": "nginx"}]}}}
    }))?;
    sets.create(&PostParams::default(), &s).await?;
    let names = || async {
        let mut v: Vec<String> = c
            .live_pods("app=nginx")
            .await?
            .into_iter()
            .filter_map(|p| p.metadata.name)
            .collect();
        v.sort();
        Ok::<_, anyhow::Error>(v)
    };
    for (i, ip) in ["10.244.1.10", "10.244.1.11", "10.244.1.12"]
        .into_iter()
        .enumerate()
    {
        let want: Vec<String> = (0..=i).map(|n| format!("web-{n}")).collect();
        eventually(&format!("pods {want:?}"), || async {
            let got = names().await?;
            Ok((got != want).then(|| format!("{got:?}")))
        })
        .await?;
        // The next pod does not appear while this one is not Running and Ready.
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert_eq!(names().await?, want, "ordered creation");
        let pod = format!("web-{i}");
        c.set_pod_status(&pod, ip, true).await?;
    }
    let pods: Api<Pod> = c.api();
    let p = pods.get("web-1").await?;
    let spec = p.spec.unwrap();
    assert_eq!(
        (spec.hostname.as_deref(), spec.subdomain.as_deref()),
        (Some("web-1"), Some("nginx"))
    );
    let labels: BTreeMap<String, String> = p.metadata.labels.unwrap();
    assert_eq!(labels["statefulset.kubernetes.io/pod-name"], "web-1");
    assert_eq!(labels["apps.kubernetes.io/pod-index"], "1");
    eventually("status readyReplicas = 3", || async {
        let st = sets.get("web").await?.status.unwrap_or_default();
        Ok((st.ready_replicas != Some(3) || st.replicas != 3).then(|| format!("{st:?}")))
    })
    .await?;
    c.stop().await
}
