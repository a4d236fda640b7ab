//! Core `v1` and `events.k8s.io/v1` Events are one stored object, as upstream: an Event
//! written through kube-rs's recorder (events.k8s.io) is a core Event for `kubectl events`
//! and `kubectl get events`, and a core Event reads back through events.k8s.io.
#![allow(clippy::unwrap_used)]

mod common;

use common::kubectl::{KUBECTL_1_33, Kubectl};
use k8s_openapi::api::core::v1::{Event as CoreEvent, ObjectReference};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::events::{Event as Note, EventType, Recorder, Reporter};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_written_through_either_api_are_one_object() {
    let ts = common::TestServer::start().await;
    let client = ts.client().await;
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "svcnet-test".into(),
            instance: Some("node-1".into()),
        },
    );
    let regarding = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Service".into()),
        name: Some("web".into()),
        namespace: Some("default".into()),
        uid: Some("1234".into()),
        ..Default::default()
    };
    let note = Note {
        type_: EventType::Warning,
        reason: "NoEndpoints".into(),
        note: Some("service web has no ready endpoints".into()),
        action: "Sync".into(),
        secondary: None,
    };
    // Twice: the second is a merge patch of the series through events.k8s.io.
    recorder.publish(&note, &regarding).await.unwrap();
    recorder.publish(&note, &regarding).await.unwrap();

    let new: Api<Event> = Api::namespaced(client.clone(), "default");
    let written = new.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(written.len(), 1);
    let written = &written[0];
    assert_eq!(written.series.as_ref().unwrap().count, 2);
    let name = written.metadata.name.clone().unwrap();

    let core: Api<CoreEvent> = Api::namespaced(client.clone(), "default");
    let seen = core.get(&name).await.unwrap();
    assert_eq!(seen.metadata.uid, written.metadata.uid);
    assert_eq!(
        seen.metadata.resource_version,
        written.metadata.resource_version
    );
    assert_eq!(
        seen.message.as_deref(),
        Some("service web has no ready endpoints")
    );
    assert_eq!(seen.reason.as_deref(), Some("NoEndpoints"));
    assert_eq!(seen.type_.as_deref(), Some("Warning"));
    assert_eq!(seen.involved_object.name.as_deref(), Some("web"));
    assert_eq!(seen.involved_object.kind.as_deref(), Some("Service"));
    assert_eq!(seen.reporting_component.as_deref(), Some("svcnet-test"));
    assert_eq!(seen.reporting_instance.as_deref(), Some("node-1"));
    assert_eq!(seen.series.as_ref().unwrap().count, Some(2));

    // A core Event reads back through events.k8s.io with upstream's field names.
    let core_event: CoreEvent = serde_json::from_value(json!({
        "metadata": {"name": "web.core"},
        "involvedObject": {"kind": "Service", "name": "web", "namespace": "default"},
        "reason": "Created", "message": "created by hand", "type": "Normal",
        "source": {"component": "tester"},
        "firstTimestamp": "2026-01-01T00:00:00Z", "lastTimestamp": "2026-01-01T00:00:00Z",
        "count": 1
    }))
    .unwrap();
    core.create(&PostParams::default(), &core_event)
        .await
        .unwrap();
    let read = new.get("web.core").await.unwrap();
    assert_eq!(read.note.as_deref(), Some("created by hand"));
    assert_eq!(
        read.regarding.as_ref().unwrap().name.as_deref(),
        Some("web")
    );
    assert_eq!(
        read.deprecated_source
            .as_ref()
            .unwrap()
            .component
            .as_deref(),
        Some("tester")
    );
    assert_eq!(read.deprecated_count, Some(1));
    assert_eq!(
        core.list(&ListParams::default()).await.unwrap().items.len(),
        2
    );
    assert_eq!(
        new.list(&ListParams::default()).await.unwrap().items.len(),
        2
    );

    // kubectl reads core Events: both show, and so does the Service's describe listing.
    let kc = ts.server().kubeconfig_path().to_path_buf();
    tokio::task::spawn_blocking(move || {
        let k = Kubectl::new(KUBECTL_1_33, &kc);
        let out = k.ok(&["events"]);
        assert!(
            out.contains("NoEndpoints") && out.contains("service web has no ready endpoints"),
            "{out}"
        );
        assert!(out.contains("created by hand"), "{out}");
        let out = k.ok(&[
            "get",
            "events",
            "--field-selector",
            "reason=NoEndpoints",
            "-o",
            "name",
        ]);
        assert_eq!(out.trim(), format!("event/{name}"));
        let out = k.ok(&["get", "events.events.k8s.io", "-o", "name"]);
        assert_eq!(out.lines().count(), 2, "{out}");
    })
    .await
    .unwrap();

    // Deleting through one API deletes the other's view.
    new.delete("web.core", &Default::default()).await.unwrap();
    assert!(core.get_opt("web.core").await.unwrap().is_none());
    ts.stop().await;
}
