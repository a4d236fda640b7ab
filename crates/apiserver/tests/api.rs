//! The API server driven by kube-rs over real TLS with the written kubeconfig: CRUD and
//! conflicts, watch semantics, selectors, restarts, allocation under concurrency, finalizers
//! and garbage collection.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::HashSet;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::core::Status as ErrorResponse;
use serde_json::json;

fn svc(name: &str, extra: serde_json::Value) -> Service {
    let mut v = json!({"metadata": {"name": name, "labels": {"app": name}}, "spec": {"selector": {"app": name}, "ports": [{"port": 80}]}});
    json_patch_merge(&mut v, extra);
    serde_json::from_value(v).unwrap()
}

fn json_patch_merge(a: &mut serde_json::Value, b: serde_json::Value) {
    if let (Some(am), serde_json::Value::Object(bm)) = (a.as_object_mut(), b.clone()) {
        for (k, v) in bm {
            match am.get_mut(&k) {
                Some(existing) if existing.is_object() && v.is_object() => {
                    json_patch_merge(existing, v)
                }
                _ => {
                    am.insert(k, v);
                }
            }
        }
    }
}

fn api_err(e: kube::Error) -> ErrorResponse {
    match e {
        kube::Error::Api(s) => *s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

#[tokio::test]
async fn crud_conflicts_and_status_errors() {
    let ts = common::TestServer::start().await;
    let svcs: Api<Service> = Api::namespaced(ts.client().await, "default");
    let pp = PostParams::default();

    let created = svcs.create(&pp, &svc("web", json!({}))).await.unwrap();
    let meta = &created.metadata;
    assert!(meta.uid.is_some() && meta.creation_timestamp.is_some());
    // Services have no generation (upstream's strategy sets none; Deployments below do).
    assert_eq!(meta.generation, None);
    let spec = created.spec.clone().unwrap();
    assert!(
        spec.cluster_ip.unwrap().starts_with("10."),
        "allocated a cluster IP"
    );
    assert_eq!(spec.type_.as_deref(), Some("ClusterIP"), "defaulted");

    let err = api_err(svcs.create(&pp, &svc("web", json!({}))).await.unwrap_err());
    assert_eq!((err.code, err.reason.as_str()), (409, "AlreadyExists"));
    assert_eq!(err.message, "services \"web\" already exists");

    // Optimistic concurrency: a replace with a stale resourceVersion is a 409 Conflict.
    let mut fresh = created.clone();
    fresh.metadata.labels = Some([("v".to_string(), "2".to_string())].into());
    let updated = svcs.replace("web", &pp, &fresh).await.unwrap();
    assert_ne!(
        updated.metadata.resource_version,
        created.metadata.resource_version
    );
    assert_eq!(updated.metadata.generation, None);
    let err = api_err(svcs.replace("web", &pp, &fresh).await.unwrap_err());
    assert_eq!((err.code, err.reason.as_str()), (409, "Conflict"));
    assert!(
        err.message.contains("the object has been modified"),
        "{}",
        err.message
    );

    // A spec change is written; the cluster IP is immutable (422 naming the field).
    let patched = svcs
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"ports": [{"port": 81}]}})),
        )
        .await
        .unwrap();
    assert_eq!(patched.metadata.generation, None);
    assert_eq!(
        patched.spec.as_ref().unwrap().ports.as_ref().unwrap()[0].port,
        81
    );
    let err = api_err(
        svcs.patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"clusterIP": "10.96.5.5"}})),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!((err.code, err.reason.as_str()), (422, "Invalid"));
    assert!(
        err.message
            .starts_with("Service \"web\" is invalid: spec.clusterIP"),
        "{}",
        err.message
    );

    // Invalid on create: 422 with upstream's message.
    let err = api_err(
        svcs.create(&pp, &svc("bad", json!({"spec": {"ports": [{"port": 0}]}})))
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 422);
    assert!(
        err.message.contains("spec.ports[0].port: Invalid value: 0"),
        "{}",
        err.message
    );

    // generateName
    let generated = svcs
        .create(
            &pp,
            &serde_json::from_value(
                json!({"metadata": {"generateName": "gen-"}, "spec": {"ports": [{"port": 80}]}}),
            )
            .unwrap(),
        )
        .await
        .unwrap();
    assert!(generated.metadata.name.unwrap().starts_with("gen-"));

    // A missing namespace, a missing object.
    let other: Api<Service> = Api::namespaced(ts.client().await, "nowhere");
    let err = api_err(other.create(&pp, &svc("x", json!({}))).await.unwrap_err());
    assert_eq!(
        (err.code, err.message.as_str()),
        (404, "namespaces \"nowhere\" not found")
    );
    let err = api_err(svcs.get("missing").await.unwrap_err());
    assert_eq!((err.code, err.reason.as_str()), (404, "NotFound"));
    assert!(svcs.get_opt("missing").await.unwrap().is_none());

    // Delete returns the object; a second delete is 404.
    svcs.delete("web", &DeleteParams::default()).await.unwrap();
    assert!(svcs.get_opt("web").await.unwrap().is_none());
    let err = api_err(
        svcs.delete("web", &DeleteParams::default())
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 404);
    ts.stop().await;
}

#[tokio::test]
async fn status_subresource_and_scale() {
    let ts = common::TestServer::start().await;
    let deps: Api<Deployment> = Api::namespaced(ts.client().await, "default");
    let d: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "d"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"a": "b"}},
                 "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}}},
        "status": {"replicas": 7}
    }))
    .unwrap();
    let d = deps.create(&PostParams::default(), &d).await.unwrap();
    assert_eq!(
        d.status.as_ref().and_then(|s| s.replicas),
        None,
        "status is reset on create"
    );
    let st = deps
        .patch_status(
            "d",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"replicas": 3}, "spec": {"replicas": 9}})),
        )
        .await
        .unwrap();
    assert_eq!(st.status.unwrap().replicas, Some(3));
    assert_eq!(
        st.spec.unwrap().replicas,
        Some(1),
        "a status write does not change spec"
    );
    let main = deps
        .patch(
            "d",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"replicas": 0}, "spec": {"replicas": 2}})),
        )
        .await
        .unwrap();
    assert_eq!(
        main.status.unwrap().replicas,
        Some(3),
        "a main write does not change status"
    );
    assert_eq!(main.metadata.generation, Some(2));
    let scale = deps.get_scale("d").await.unwrap();
    assert_eq!(scale.spec.unwrap().replicas, Some(2));
    deps.patch_scale(
        "d",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"replicas": 5}})),
    )
    .await
    .unwrap();
    assert_eq!(deps.get("d").await.unwrap().spec.unwrap().replicas, Some(5));
    ts.stop().await;
}

async fn next_event<K>(
    stream: &mut (impl futures::Stream<Item = kube::Result<WatchEvent<K>>> + Unpin),
) -> WatchEvent<K> {
    tokio::time::timeout(Duration::from_secs(10), stream.next())
        .await
        .expect("an event within 10s")
        .expect("stream open")
        .expect("no error")
}

/// The resourceVersion of a list of `api`: where a watch that misses nothing starts.
async fn list_revision<K>(api: &Api<K>) -> String
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let list = api.list(&ListParams::default()).await.unwrap();
    list.metadata.resource_version.unwrap()
}

fn cm(name: &str, labels: serde_json::Value) -> ConfigMap {
    serde_json::from_value(
        json!({"metadata": {"name": name, "labels": labels}, "data": {"k": "v"}}),
    )
    .unwrap()
}

#[tokio::test]
async fn watch_resumes_bookmarks_and_expires() {
    let ts = common::TestServer::start_with(|c| c.watch_history = 30).await;
    let cms: Api<ConfigMap> = Api::namespaced(ts.client().await, "default");
    let pp = PostParams::default();
    let start = list_revision(&cms).await;
    let mut rvs = Vec::new();
    for i in 0..3 {
        rvs.push(
            cms.create(&pp, &cm(&format!("c{i}"), json!({})))
                .await
                .unwrap()
                .metadata
                .resource_version
                .unwrap(),
        );
    }
    // From the list's version: exactly the three creates, in order.
    let mut w = cms
        .watch(&WatchParams::default(), &start)
        .await
        .unwrap()
        .boxed();
    for (i, rv) in rvs.iter().enumerate() {
        match next_event(&mut w).await {
            WatchEvent::Added(c) => {
                assert_eq!(c.metadata.name.unwrap(), format!("c{i}"));
                assert_eq!(&c.metadata.resource_version.unwrap(), rv);
            }
            other => panic!("{other:?}"),
        }
    }
    // Resuming from the second create's version gives only the third.
    let mut w2 = cms
        .watch(&WatchParams::default(), &rvs[1])
        .await
        .unwrap()
        .boxed();
    match next_event(&mut w2).await {
        WatchEvent::Added(c) => assert_eq!(c.metadata.name.unwrap(), "c2"),
        other => panic!("{other:?}"),
    }
    // Live modifications and deletes follow.
    cms.patch(
        "c0",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"k": "w"}})),
    )
    .await
    .unwrap();
    assert!(
        matches!(next_event(&mut w).await, WatchEvent::Modified(c) if c.data.as_ref().unwrap()["k"] == "w")
    );
    cms.delete("c0", &DeleteParams::default()).await.unwrap();
    assert!(
        matches!(next_event(&mut w).await, WatchEvent::Deleted(c) if c.metadata.name.as_deref() == Some("c0"))
    );

    // Bookmarks arrive when asked for, carrying a resourceVersion.
    let mut wb = cms
        .watch(
            &WatchParams {
                bookmarks: true,
                ..WatchParams::default()
            },
            &rvs[2],
        )
        .await
        .unwrap()
        .boxed();
    let mut saw_bookmark = false;
    for _ in 0..5 {
        if let WatchEvent::Bookmark(b) = next_event(&mut wb).await {
            assert!(!b.metadata.resource_version.is_empty());
            saw_bookmark = true;
            break;
        }
    }
    assert!(saw_bookmark);

    // resourceVersion "0": synthetic ADDED events for the current state.
    let mut w0 = cms
        .watch(&WatchParams::default(), "0")
        .await
        .unwrap()
        .boxed();
    let mut names = HashSet::new();
    for _ in 0..2 {
        if let WatchEvent::Added(c) = next_event(&mut w0).await {
            names.insert(c.metadata.name.unwrap());
        }
    }
    assert_eq!(names, HashSet::from(["c1".to_string(), "c2".to_string()]));

    // After more writes than the history keeps, an old version is 410 Gone.
    for i in 0..60 {
        cms.create(&pp, &cm(&format!("f{i}"), json!({})))
            .await
            .unwrap();
    }
    let mut old = cms
        .watch(&WatchParams::default(), &start)
        .await
        .unwrap()
        .boxed();
    match next_event(&mut old).await {
        WatchEvent::Error(e) => assert_eq!((e.code, e.reason.as_str()), (410, "Expired")),
        other => panic!("expected 410, got {other:?}"),
    }
    ts.stop().await;
}

/// A watch of a quiet resource (a node proxy's Services) is kept past the store's history by
/// its bookmarks: they carry how far the watch got through every write, not the revision of
/// its own last event, which the store compacts away as other resources are written. Resuming
/// from a bookmark then goes on; resuming from the list's revision is 410 and a re-list.
#[tokio::test]
async fn bookmarks_keep_a_quiet_watch_within_the_history() {
    let ts = common::TestServer::start_with(|c| c.watch_history = 30).await;
    let client = ts.client().await;
    let quiet: Api<Service> = Api::namespaced(client.clone(), "default");
    let busy: Api<ConfigMap> = Api::namespaced(client, "default");
    let listed = list_revision(&quiet).await;
    let bookmarks = WatchParams {
        bookmarks: true,
        ..WatchParams::default()
    };
    let mut w = quiet.watch(&bookmarks, &listed).await.unwrap().boxed();
    // More writes of another resource than the history keeps.
    let mut last = String::new();
    for i in 0..60 {
        last = busy
            .create(&PostParams::default(), &cm(&format!("b{i}"), json!({})))
            .await
            .unwrap()
            .metadata
            .resource_version
            .unwrap();
    }
    let last: u64 = last.parse().unwrap();
    let mut resume = None;
    for _ in 0..20 {
        match next_event(&mut w).await {
            WatchEvent::Bookmark(b) => {
                let rv: u64 = b.metadata.resource_version.parse().unwrap();
                if rv >= last {
                    resume = Some(b.metadata.resource_version);
                    break;
                }
            }
            other => panic!("nothing of the quiet resource changed: {other:?}"),
        }
    }
    let resume = resume.expect("a bookmark past the other resource's writes");
    let mut resumed = quiet.watch(&bookmarks, &resume).await.unwrap().boxed();
    quiet
        .create(&PostParams::default(), &svc("late", json!({})))
        .await
        .unwrap();
    loop {
        match next_event(&mut resumed).await {
            WatchEvent::Added(s) => {
                assert_eq!(s.metadata.name.as_deref(), Some("late"));
                break;
            }
            WatchEvent::Bookmark(_) => {}
            other => panic!("expected the create, got {other:?}"),
        }
    }
    // What the bookmark saved it from: the list's revision is gone from the history.
    let mut stale = quiet.watch(&bookmarks, &listed).await.unwrap().boxed();
    match next_event(&mut stale).await {
        WatchEvent::Error(e) => assert_eq!(e.code, 410),
        other => panic!("expected 410, got {other:?}"),
    }
    ts.stop().await;
}

#[tokio::test]
async fn selectors_on_list_and_watch() {
    let ts = common::TestServer::start().await;
    let client = ts.client().await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let pp = PostParams::default();
    cms.create(&pp, &cm("a", json!({"tier": "front", "env": "prod"})))
        .await
        .unwrap();
    cms.create(&pp, &cm("b", json!({"tier": "back", "env": "prod"})))
        .await
        .unwrap();
    cms.create(&pp, &cm("c", json!({"tier": "front", "env": "dev"})))
        .await
        .unwrap();
    let names = |l: kube::core::ObjectList<ConfigMap>| {
        let mut n: Vec<String> = l
            .items
            .into_iter()
            .map(|c| c.metadata.name.unwrap())
            .collect();
        n.sort();
        n
    };
    assert_eq!(
        names(
            cms.list(&ListParams::default().labels("tier=front"))
                .await
                .unwrap()
        ),
        ["a", "c"]
    );
    assert_eq!(
        names(
            cms.list(&ListParams::default().labels("tier=front,env!=dev"))
                .await
                .unwrap()
        ),
        ["a"]
    );
    assert_eq!(
        names(
            cms.list(&ListParams::default().labels("env in (dev,test)"))
                .await
                .unwrap()
        ),
        ["c"]
    );
    assert_eq!(
        names(
            cms.list(&ListParams::default().fields("metadata.name=b"))
                .await
                .unwrap()
        ),
        ["b"]
    );
    let err = api_err(
        cms.list(&ListParams::default().fields("spec.nodeName=x"))
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 400);
    let err = api_err(
        cms.list(&ListParams::default().labels("a in ("))
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 400);

    // Pods by node.
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    for (name, node) in [("p1", "n1"), ("p2", "n2")] {
        let p: Pod = serde_json::from_value(json!({"metadata": {"name": name}, "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}]}})).unwrap();
        pods.create(&pp, &p).await.unwrap();
    }
    let on_n1 = pods
        .list(&ListParams::default().fields("spec.nodeName=n1"))
        .await
        .unwrap();
    assert_eq!(on_n1.items.len(), 1);
    assert_eq!(on_n1.items[0].metadata.name.as_deref(), Some("p1"));
    let pending = pods
        .list(&ListParams::default().fields("status.phase=Pending"))
        .await
        .unwrap();
    assert_eq!(pending.items.len(), 2);

    // A filtered watch sees an object leave (DELETED) and enter (ADDED) its selection.
    let rv = cms
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut w = cms
        .watch(&WatchParams::default().labels("tier=front"), &rv)
        .await
        .unwrap()
        .boxed();
    cms.patch(
        "b",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"x": "1"}})),
    )
    .await
    .unwrap(); // not selected
    cms.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"tier": "back"}}})),
    )
    .await
    .unwrap();
    assert!(
        matches!(next_event(&mut w).await, WatchEvent::Deleted(c) if c.metadata.name.as_deref() == Some("a"))
    );
    cms.patch(
        "b",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"tier": "front"}}})),
    )
    .await
    .unwrap();
    assert!(
        matches!(next_event(&mut w).await, WatchEvent::Added(c) if c.metadata.name.as_deref() == Some("b"))
    );
    cms.patch(
        "c",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"x": "2"}})),
    )
    .await
    .unwrap();
    assert!(
        matches!(next_event(&mut w).await, WatchEvent::Modified(c) if c.metadata.name.as_deref() == Some("c"))
    );

    // kube-runtime's watcher (list + watch) works against the server.
    let stream = kube::runtime::watcher(
        cms.clone(),
        kube::runtime::watcher::Config::default().labels("tier=front"),
    );
    let mut objs = kube::runtime::WatchStreamExt::applied_objects(stream).boxed();
    let mut seen = HashSet::new();
    while seen.len() < 2 {
        let c = tokio::time::timeout(Duration::from_secs(10), objs.try_next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        seen.insert(c.metadata.name.unwrap());
    }
    assert_eq!(seen, HashSet::from(["b".to_string(), "c".to_string()]));
    ts.stop().await;
}

#[tokio::test]
async fn restart_keeps_objects_and_allocations() {
    let mut ts = common::TestServer::start().await;
    let svcs: Api<Service> = Api::namespaced(ts.client().await, "default");
    let pp = PostParams::default();
    let a = svcs
        .create(&pp, &svc("a", json!({"spec": {"type": "NodePort"}})))
        .await
        .unwrap();
    let before_rv = a.metadata.resource_version.clone();
    let a_ip = a.spec.as_ref().unwrap().cluster_ip.clone().unwrap();
    let a_port = a.spec.as_ref().unwrap().ports.as_ref().unwrap()[0]
        .node_port
        .unwrap();
    let kubeconfig_before = std::fs::read_to_string(ts.server().kubeconfig_path()).unwrap();

    ts.restart().await;
    assert_eq!(
        std::fs::read_to_string(ts.server().kubeconfig_path())
            .unwrap()
            .len(),
        kubeconfig_before.len()
    );
    let svcs: Api<Service> = Api::namespaced(ts.client().await, "default");
    let again = svcs.get("a").await.unwrap();
    assert_eq!(again.metadata.uid, a.metadata.uid);
    assert_eq!(again.metadata.resource_version, before_rv);
    assert_eq!(
        again.spec.as_ref().unwrap().cluster_ip.as_deref(),
        Some(a_ip.as_str())
    );
    // Asking for the same IP or node port again is refused: the allocations survived.
    let err = api_err(
        svcs.create(&pp, &svc("b", json!({"spec": {"clusterIP": a_ip}})))
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 422, "{}", err.message);
    let err = api_err(
        svcs.create(
            &pp,
            &svc(
                "c",
                json!({"spec": {"type": "NodePort", "ports": [{"port": 80, "nodePort": a_port}]}}),
            ),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(err.code, 422, "{}", err.message);
    // Deleting releases: the IP can then be requested.
    svcs.delete("a", &DeleteParams::default()).await.unwrap();
    let b = svcs
        .create(&pp, &svc("b", json!({"spec": {"clusterIP": a_ip}})))
        .await
        .unwrap();
    assert_eq!(b.spec.unwrap().cluster_ip.unwrap(), a_ip);
    ts.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_creates_get_distinct_allocations() {
    let ts = common::TestServer::start().await;
    let svcs: Api<Service> = Api::namespaced(ts.client().await, "default");
    let tasks: Vec<_> = (0..50)
        .map(|i| {
            let svcs = svcs.clone();
            tokio::spawn(async move {
                let s = svc(&format!("s{i}"), json!({"spec": {"type": "NodePort"}}));
                svcs.create(&PostParams::default(), &s).await.unwrap()
            })
        })
        .collect();
    let mut ips = HashSet::new();
    let mut ports = HashSet::new();
    for t in tasks {
        let s = t.await.unwrap().spec.unwrap();
        ips.insert(s.cluster_ip.unwrap());
        ports.insert(s.ports.unwrap()[0].node_port.unwrap());
    }
    assert_eq!(ips.len(), 50, "every cluster IP distinct");
    assert_eq!(ports.len(), 50, "every node port distinct");
    assert!(!ips.contains("10.96.0.1") && !ips.contains("10.96.0.10"));
    ts.stop().await;
}

#[tokio::test]
async fn finalizers_and_garbage_collection() {
    let ts = common::TestServer::start().await;
    let client = ts.client().await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let pp = PostParams::default();
    let mut c = cm("held", json!({}));
    c.metadata.finalizers = Some(vec!["example.com/hold".into()]);
    cms.create(&pp, &c).await.unwrap();
    cms.delete("held", &DeleteParams::default()).await.unwrap();
    let held = cms.get("held").await.unwrap();
    assert!(
        held.metadata.deletion_timestamp.is_some(),
        "kept while a finalizer remains"
    );
    cms.patch(
        "held",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    assert!(
        cms.get_opt("held").await.unwrap().is_none(),
        "gone once finalizers are empty"
    );

    // Dependents go when their owner goes.
    let svcs: Api<Service> = Api::namespaced(client.clone(), "default");
    let owner = svcs.create(&pp, &svc("owner", json!({}))).await.unwrap();
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), "default");
    let slice: EndpointSlice = serde_json::from_value(json!({
        "metadata": {"generateName": "owner-", "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": "owner", "uid": owner.metadata.uid.unwrap(), "controller": true}]},
        "addressType": "IPv4", "endpoints": [], "ports": []
    }))
    .unwrap();
    let slice = slices.create(&pp, &slice).await.unwrap();
    let slice_name = slice.metadata.name.unwrap();
    svcs.delete("owner", &DeleteParams::default())
        .await
        .unwrap();
    let mut gone = false;
    for _ in 0..100 {
        if slices.get_opt(&slice_name).await.unwrap().is_none() {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        gone,
        "the garbage collector deleted the orphaned EndpointSlice"
    );
    ts.stop().await;
}

/// More objects than a kube-rs watcher's page (500): its initial list walks the pages with
/// the continue tokens (sending resourceVersion 0 on each) and sees every object once.
#[tokio::test]
async fn watchers_page_through_long_lists() {
    use kube::runtime::watcher;
    let ts = common::TestServer::start().await;
    let client = ts.client().await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let n = 1203;
    futures::stream::iter(0..n)
        .map(|i| {
            let cms = cms.clone();
            async move {
                let cm: ConfigMap =
                    serde_json::from_value(json!({"metadata": {"name": format!("cm-{i:04}")}}))
                        .unwrap();
                cms.create(&PostParams::default(), &cm).await.map(drop)
            }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<()>>()
        .await
        .unwrap();
    // A plain paged list: three pages of one snapshot.
    let first = cms.list(&ListParams::default().limit(500)).await.unwrap();
    assert_eq!(first.items.len(), 500);
    let token = first.metadata.continue_.clone().unwrap();
    assert_eq!(
        first.metadata.remaining_item_count,
        Some(n - 500 + existing(&cms).await)
    );
    let second = cms
        .list(&ListParams::default().limit(500).continue_token(&token))
        .await
        .unwrap();
    assert_eq!(second.items.len(), 500);
    assert_eq!(
        second.metadata.resource_version,
        first.metadata.resource_version
    );
    // The watcher: every object exactly once before InitDone.
    let mut seen = HashSet::new();
    let mut events = std::pin::pin!(watcher(cms.clone(), watcher::Config::default()));
    loop {
        match tokio::time::timeout(Duration::from_secs(30), events.try_next()).await {
            Ok(Ok(Some(watcher::Event::InitApply(cm)))) => {
                assert!(
                    seen.insert(cm.metadata.name.unwrap()),
                    "an object came twice"
                );
            }
            Ok(Ok(Some(watcher::Event::InitDone))) => break,
            Ok(Ok(Some(_))) => {}
            other => panic!("watcher ended before its initial list: {other:?}"),
        }
    }
    let ours = seen.iter().filter(|n| n.starts_with("cm-")).count();
    assert_eq!(ours, n as usize);
}

/// ConfigMaps in `default` besides the test's own (a controller may publish some).
async fn existing(cms: &Api<ConfigMap>) -> i64 {
    let all = cms.list(&ListParams::default()).await.unwrap();
    all.items
        .iter()
        .filter(|c| !c.metadata.name.as_deref().unwrap_or("").starts_with("cm-"))
        .count() as i64
}

/// A continue token names a revision: once the store's history no longer reaches it, the next
/// page is 410 Expired with upstream's message (the token it carries, continuing at the latest
/// revision, is checked in `paging`'s unit tests), and a new list starts over.
#[tokio::test]
async fn continue_tokens_expire_with_the_history() {
    let ts = common::TestServer::start_with(|c| c.watch_history = 30).await;
    let cms: Api<ConfigMap> = Api::namespaced(ts.client().await, "default");
    let pp = PostParams::default();
    for i in 0..3 {
        cms.create(&pp, &cm(&format!("p{i}"), json!({})))
            .await
            .unwrap();
    }
    let first = cms.list(&ListParams::default().limit(1)).await.unwrap();
    let token = first.metadata.continue_.clone().unwrap();
    // Still within the history: the same page twice.
    for _ in 0..2 {
        let page = cms
            .list(&ListParams::default().limit(1).continue_token(&token))
            .await
            .unwrap();
        assert_eq!(page.items.len(), 1);
        assert_eq!(
            page.metadata.resource_version,
            first.metadata.resource_version
        );
    }
    for i in 0..40 {
        cms.create(&pp, &cm(&format!("q{i:02}"), json!({})))
            .await
            .unwrap();
    }
    match cms
        .list(&ListParams::default().limit(1).continue_token(&token))
        .await
    {
        Err(kube::Error::Api(e)) => {
            assert_eq!((e.code, e.reason.as_str()), (410, "Expired"));
            assert!(
                e.message.starts_with(
                    "The provided continue parameter is too old to display a consistent list \
                     result. You can start a new list without the continue parameter, or use \
                     the continue token in this response"
                ),
                "{}",
                e.message
            );
        }
        other => panic!("a compacted continue token: {other:?}"),
    }
    assert!(cms.list(&ListParams::default().limit(1)).await.is_ok());
    ts.stop().await;
}
