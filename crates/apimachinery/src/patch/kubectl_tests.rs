//! Patches captured from a real `kubectl.1.33 apply` (see `testdata/capture-kubectl-patch.py`):
//! the live object, the manifest applied, and the body kubectl sent.

use serde_json::Value;

use super::{PatchType, apply};

fn fixture(name: &str) -> Value {
    let text = match name {
        "service-live" => include_str!("testdata/service-live.json"),
        "service-manifest" => include_str!("testdata/service-manifest.json"),
        "deployment-live" => include_str!("testdata/deployment-live.json"),
        "deployment-manifest" => include_str!("testdata/deployment-manifest.json"),
        other => panic!("no fixture {other}"),
    };
    serde_json::from_str(text).unwrap()
}

/// Everything the manifest says must hold in the result (kubectl apply's promise).
fn assert_contains(result: &Value, manifest: &Value, path: &str) {
    match (result, manifest) {
        (Value::Object(r), Value::Object(m)) => {
            for (k, v) in m {
                let got = r.get(k).unwrap_or_else(|| panic!("{path}.{k} missing"));
                assert_contains(got, v, &format!("{path}.{k}"));
            }
        }
        (Value::Array(r), Value::Array(m)) => {
            assert_eq!(r.len(), m.len(), "{path}: {r:?} vs {m:?}");
            for (i, (a, b)) in r.iter().zip(m).enumerate() {
                assert_contains(a, b, &format!("{path}[{i}]"));
            }
        }
        _ => assert_eq!(result, manifest, "{path}"),
    }
}

#[test]
fn service_port_change_and_label_removal() {
    let live = fixture("service-live");
    let body = include_bytes!("testdata/service-kubectl-apply.patch.json");
    let out = apply("Service", &live, PatchType::StrategicMerge, body).unwrap();
    assert_contains(&out, &fixture("service-manifest"), "");
    // Removed from the manifest: gone. Set by the server: kept.
    assert_eq!(
        out["metadata"]["labels"],
        serde_json::json!({"app": "myapp"})
    );
    assert_eq!(out["spec"]["clusterIP"], "10.96.0.20");
    assert_eq!(out["spec"]["ipFamilyPolicy"], "SingleStack");
    assert_eq!(out["metadata"]["uid"], "u1");
    let last = out["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"]
        .as_str()
        .unwrap();
    assert!(last.contains("\"port\":8080"), "{last}");
}

#[test]
fn deployment_image_port_env_strategy_volume_change() {
    let live = fixture("deployment-live");
    let body = include_bytes!("testdata/deployment-kubectl-apply.patch.json");
    let out = apply("Deployment", &live, PatchType::StrategicMerge, body).unwrap();
    assert_contains(&out, &fixture("deployment-manifest"), "");
    assert_eq!(
        out["spec"]["strategy"],
        serde_json::json!({"type": "Recreate"})
    );
    let spec = &out["spec"]["template"]["spec"];
    assert_eq!(
        spec["volumes"],
        serde_json::json!([{"name": "data", "configMap": {"name": "cfg"}}])
    );
    // Server defaults inside merged list items survive.
    assert_eq!(spec["containers"][0]["imagePullPolicy"], "IfNotPresent");
    assert_eq!(spec["containers"][1]["terminationMessagePolicy"], "File");
    assert_eq!(spec["restartPolicy"], "Always");
    assert_eq!(out["spec"]["revisionHistoryLimit"], 10);
    assert_eq!(out["status"]["readyReplicas"], 2);
    // Re-applying the same patch changes nothing.
    let again = apply("Deployment", &out, PatchType::StrategicMerge, body).unwrap();
    assert_eq!(again, out);
}
