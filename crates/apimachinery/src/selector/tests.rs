use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1 as metav1;
use proptest::prelude::*;
use serde_json::json;

use super::*;

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn label_parse_and_print() {
    // (input, canonical form: requirements sorted by key, values sorted)
    let cases = [
        ("", ""),
        ("app=web", "app=web"),
        ("app==web", "app==web"),
        ("app!=web", "app!=web"),
        ("  app  =  web , tier ", "app=web,tier"),
        ("tier in (b, a,a)", "tier in (a,b)"),
        ("tier notin (x)", "tier notin (x)"),
        ("!canary", "!canary"),
        ("z,a=1,m!=2", "a=1,m!=2,z"),
        ("app=", "app="),
        ("a in ()", "a in ()"),
        ("gen>3,gen<10", "gen>3,gen<10"),
        (
            "app.kubernetes.io/name=web,kubernetes.io/service-name=x",
            "app.kubernetes.io/name=web,kubernetes.io/service-name=x",
        ),
    ];
    for (input, want) in cases {
        let sel = LabelSelector::parse(input).unwrap_or_else(|e| panic!("{input:?}: {e}"));
        assert_eq!(sel.to_string(), want, "{input:?}");
        assert_eq!(LabelSelector::parse(want).unwrap(), sel, "{input:?}");
    }
}

#[test]
fn label_parse_errors() {
    let cases = [
        ("app=web,", "identifier after ','"),
        ("=web", "expected: !, identifier"),
        ("app web", "expected: in, notin, ="),
        ("app in web", "expected: '('"),
        ("app in (a b)", "expected: ',', or ')'"),
        ("app=(x)", "expected: identifier"),
        ("app=a=b", "expected: ',' or 'end of string'"),
        ("-app=x", "name part must consist of alphanumeric"),
        ("a/b/c=x", "a qualified name must consist"),
        ("app=-x", "Invalid value: \"-x\""),
        ("app>x", "must be an integer"),
        ("!", "expected: identifier"),
        ("app in (a", "expected: ',', or ')'"),
    ];
    for (input, want) in cases {
        let err = LabelSelector::parse(input).expect_err(input).to_string();
        assert!(err.contains(want), "{input:?}: {err}");
    }
}

#[test]
fn label_matches() {
    let l = labels(&[("app", "web"), ("tier", "front"), ("gen", "7")]);
    let cases = [
        ("", true),
        ("app=web", true),
        ("app==web", true),
        ("app=db", false),
        ("app!=db", true),
        ("missing!=x", true),
        ("app in (db,web)", true),
        ("app notin (db,web)", false),
        ("missing notin (x)", true),
        ("missing in (x)", false),
        ("tier", true),
        ("missing", false),
        ("!missing", true),
        ("!app", false),
        ("gen>6", true),
        ("gen>7", false),
        ("gen<8", true),
        ("app>1", false),
        ("app=web,tier=back", false),
        ("app=web,tier in (front)", true),
    ];
    for (sel, want) in cases {
        assert_eq!(
            LabelSelector::parse(sel).unwrap().matches(&l),
            want,
            "{sel}"
        );
    }
}

#[test]
fn label_from_map_and_k8s() {
    let svc_selector = labels(&[("app", "web"), ("env", "prod")]);
    let sel = LabelSelector::from_map(&svc_selector);
    assert_eq!(sel.to_string(), "app=web,env=prod");
    assert!(sel.matches(&labels(&[("app", "web"), ("env", "prod"), ("x", "y")])));
    assert!(!sel.matches(&labels(&[("app", "web")])));
    assert!(LabelSelector::from_map(&BTreeMap::new()).is_empty());

    let k: metav1::LabelSelector = serde_json::from_value(json!({
        "matchLabels": {"app": "web"},
        "matchExpressions": [
            {"key": "tier", "operator": "In", "values": ["front", "edge"]},
            {"key": "canary", "operator": "DoesNotExist"},
            {"key": "zone", "operator": "Exists"},
            {"key": "env", "operator": "NotIn", "values": ["dev"]},
        ]
    }))
    .unwrap();
    let sel = LabelSelector::from_k8s(&k).unwrap();
    assert_eq!(
        sel.to_string(),
        "app=web,!canary,env notin (dev),tier in (edge,front),zone"
    );
    assert!(sel.matches(&labels(&[("app", "web"), ("tier", "edge"), ("zone", "a")])));
    assert!(!sel.matches(&labels(&[("app", "web"), ("tier", "edge")])));

    assert!(
        LabelSelector::from_k8s(&metav1::LabelSelector::default())
            .unwrap()
            .is_empty()
    );
    for (expr, want) in [
        (
            json!({"key": "a", "operator": "Gte", "values": ["1"]}),
            "not a valid label selector operator",
        ),
        (
            json!({"key": "a", "operator": "In", "values": []}),
            "can't be empty",
        ),
        (
            json!({"key": "a", "operator": "Exists", "values": ["x"]}),
            "must be empty",
        ),
        (json!({"key": "a b", "operator": "Exists"}), "name part"),
    ] {
        let k: metav1::LabelSelector =
            serde_json::from_value(json!({"matchExpressions": [expr]})).unwrap();
        let err = LabelSelector::from_k8s(&k).unwrap_err().to_string();
        assert!(err.contains(want), "{err}");
    }
}

fn key_strategy() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z][a-z0-9]{0,5}",
        "[a-z]{1,4}\\.io/[a-z][a-z0-9_.-]{0,4}[a-z0-9]",
    ]
}

fn value_strategy() -> impl Strategy<Value = String> {
    prop_oneof![
        "",
        "[A-Za-z0-9]",
        "[A-Za-z0-9][A-Za-z0-9_.-]{0,6}[A-Za-z0-9]"
    ]
}

fn requirement_strategy() -> impl Strategy<Value = String> {
    (
        key_strategy(),
        0..9u8,
        proptest::collection::vec(value_strategy(), 1..4),
        -50i64..50,
    )
        .prop_map(|(k, op, vals, n)| match op {
            0 => format!("{k}={}", vals[0]),
            1 => format!("{k}=={}", vals[0]),
            2 => format!("{k} != {}", vals[0]),
            3 => format!("{k} in ({})", vals.join(", ")),
            4 => format!("{k} notin ({})", vals.join(",")),
            5 => k,
            6 => format!("!{k}"),
            7 => format!("{k}>{n}"),
            _ => format!("{k}<{n}"),
        })
}

proptest! {
    /// Printing a parsed selector and parsing it again gives the same selector, and the
    /// printed form is a fixed point.
    #[test]
    fn label_round_trip(reqs in proptest::collection::vec(requirement_strategy(), 0..5)) {
        let input = reqs.join(",");
        let sel = LabelSelector::parse(&input).unwrap();
        let printed = sel.to_string();
        let again = LabelSelector::parse(&printed).unwrap();
        prop_assert_eq!(&again, &sel);
        prop_assert_eq!(again.to_string(), printed);
    }

    /// A selector built from a map matches exactly the label sets that contain the map.
    #[test]
    fn from_map_matches_supersets(
        sel in proptest::collection::btree_map("[a-c]", "[x-z]", 0..3),
        labels in proptest::collection::btree_map("[a-d]", "[x-z]", 0..4),
    ) {
        let want = sel.iter().all(|(k, v)| labels.get(k) == Some(v));
        prop_assert_eq!(LabelSelector::from_map(&sel).matches(&labels), want);
        let printed = LabelSelector::from_map(&sel).to_string();
        prop_assert_eq!(LabelSelector::parse(&printed).unwrap().matches(&labels), want);
    }

    /// Field selector values with any characters survive escape → parse → print.
    #[test]
    fn field_round_trip(value in "[a-z=,\\\\.-]{0,8}", field in "[a-z]{1,5}(\\.[a-z]{1,5})?") {
        let text = format!("{field}={}", escape_value(&value));
        let sel = FieldSelector::parse(&text).unwrap();
        prop_assert_eq!(sel.requirements().len(), 1);
        prop_assert_eq!(&sel.requirements()[0].value, &value);
        prop_assert_eq!(sel.to_string(), text);
    }
}

#[test]
fn field_parse() {
    let cases = [
        ("", ""),
        ("metadata.name=web", "metadata.name=web"),
        ("metadata.name==web", "metadata.name=web"),
        ("spec.nodeName!=", "spec.nodeName!="),
        (
            "status.phase=Running,spec.nodeName=n1",
            "spec.nodeName=n1,status.phase=Running",
        ),
        ("a=x\\,y\\=z\\\\", "a=x\\,y\\=z\\\\"),
        ("a=b,", "a=b"),
    ];
    for (input, want) in cases {
        let sel = FieldSelector::parse(input).unwrap_or_else(|e| panic!("{input}: {e}"));
        assert_eq!(sel.to_string(), want);
    }
    let sel = FieldSelector::parse("a=x\\,y").unwrap();
    assert_eq!(sel.requirements()[0].value, "x,y");
    for (input, want) in [
        ("metadata.name", "can't understand 'metadata.name'"),
        ("a=b=c", "unescaped character"),
        ("a=b\\x", "invalid escape sequence"),
    ] {
        let err = FieldSelector::parse(input).unwrap_err().to_string();
        assert!(err.contains(want), "{input}: {err}");
    }
}

#[test]
fn field_values_by_kind() {
    let pod = json!({
        "metadata": {"name": "web-0", "namespace": "default"},
        "spec": {"nodeName": "node-1", "restartPolicy": "Always", "hostNetwork": true},
        "status": {"phase": "Running", "podIP": "10.244.0.5",
                   "podIPs": [{"ip": "10.244.0.5"}, {"ip": "fd00::5"}]}
    });
    let cases = [
        ("Pod", "metadata.name", Some("web-0")),
        ("Pod", "metadata.namespace", Some("default")),
        ("Pod", "spec.nodeName", Some("node-1")),
        ("Pod", "spec.host", Some("node-1")),
        ("Pod", "spec.restartPolicy", Some("Always")),
        ("Pod", "spec.schedulerName", Some("")),
        ("Pod", "spec.hostNetwork", Some("true")),
        ("Pod", "status.phase", Some("Running")),
        ("Pod", "status.podIP", Some("10.244.0.5")),
        ("Pod", "status.podIPs", Some("10.244.0.5,fd00::5")),
        ("Pod", "spec.containers", None),
        ("Service", "spec.type", Some("")),
        ("Node", "spec.unschedulable", Some("false")),
        ("Node", "metadata.namespace", None),
        ("Endpoints", "metadata.name", Some("web-0")),
        ("Endpoints", "status.phase", None),
    ];
    for (kind, field, want) in cases {
        assert_eq!(
            field_value(kind, &pod, field).as_deref(),
            want,
            "{kind} {field}"
        );
    }
    let ev = json!({
        "metadata": {"name": "e1", "namespace": "default"},
        "involvedObject": {"kind": "Pod", "name": "web-0", "uid": "u1"},
        "reason": "Started", "type": "Normal", "reportingComponent": "kubelet",
        "source": {}
    });
    assert_eq!(
        field_value("Event", &ev, "involvedObject.kind").as_deref(),
        Some("Pod")
    );
    assert_eq!(
        field_value("Event", &ev, "involvedObject.uid").as_deref(),
        Some("u1")
    );
    assert_eq!(
        field_value("Event", &ev, "source").as_deref(),
        Some("kubelet")
    );
    assert_eq!(field_value("Event", &ev, "type").as_deref(), Some("Normal"));
}

#[test]
fn field_matches_and_unsupported() {
    let svc = json!({"metadata": {"name": "web", "namespace": "prod"},
                     "spec": {"type": "NodePort", "clusterIP": "10.96.0.7"}});
    let get = |f: &str| field_value("Service", &svc, f);
    let cases = [
        ("metadata.name=web", true),
        ("metadata.name=db", false),
        ("metadata.name!=db,metadata.namespace=prod", true),
        ("spec.type=NodePort,spec.clusterIP=10.96.0.7", true),
        ("spec.type!=NodePort", false),
        ("", true),
    ];
    for (sel, want) in cases {
        assert_eq!(
            FieldSelector::parse(sel).unwrap().matches(get),
            want,
            "{sel}"
        );
    }
    let sel = FieldSelector::parse("metadata.name=web,spec.ports=80").unwrap();
    assert_eq!(sel.unsupported_field("Service"), Some("spec.ports"));
    let sel = FieldSelector::parse("spec.nodeName=n1").unwrap();
    assert_eq!(sel.unsupported_field("Pod"), None);
    assert_eq!(sel.unsupported_field("Service"), Some("spec.nodeName"));
}
