use expect_test::{Expect, expect};
use jiff::Timestamp;
use serde_json::{Value, json};

use super::*;

fn now() -> Timestamp {
    "2025-06-01T12:00:00Z".parse().unwrap()
}

/// Prints a Table as `kubectl get -o wide` lays it out (upper-case headers, columns padded
/// to the widest cell plus three spaces), so snapshots read like terminal output.
fn render(table: &Value) -> String {
    let headers: Vec<String> = table["columnDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap().to_uppercase())
        .collect();
    let mut lines = vec![headers];
    for row in table["rows"].as_array().unwrap() {
        lines.push(
            row["cells"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| match c {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                })
                .collect(),
        );
    }
    let widths: Vec<usize> = (0..lines[0].len())
        .map(|i| lines.iter().map(|l| l[i].len()).max().unwrap())
        .collect();
    lines
        .iter()
        .map(|l| {
            l.iter()
                .enumerate()
                .map(|(i, c)| format!("{c:<w$}", w = widths[i] + 3))
                .collect::<String>()
                .trim_end()
                .to_string()
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn check(kind: &str, items: Vec<Value>, want: Expect) {
    let table = to_table_at(kind, &items, IncludeObject::None, now());
    for row in table["rows"].as_array().unwrap() {
        assert_eq!(
            row["cells"].as_array().unwrap().len(),
            columns(kind).len(),
            "{kind}: one cell per column"
        );
    }
    want.assert_eq(&render(&table));
}

fn meta(name: &str, created: &str) -> Value {
    json!({"name": name, "namespace": "default", "creationTimestamp": created, "uid": format!("uid-{name}")})
}

#[test]
fn services() {
    let items = vec![
        json!({"metadata": meta("kubernetes", "2025-05-01T12:00:00Z"),
               "spec": {"type": "ClusterIP", "clusterIP": "10.96.0.1", "clusterIPs": ["10.96.0.1"],
                        "ports": [{"name": "https", "port": 443, "protocol": "TCP", "targetPort": 6443}]}}),
        json!({"metadata": meta("myapp", "2025-06-01T11:59:15Z"),
               "spec": {"type": "NodePort", "clusterIP": "10.96.149.191", "clusterIPs": ["10.96.149.191"],
                        "selector": {"app": "myapp", "tier": "web"},
                        "ports": [{"port": 80, "protocol": "TCP", "nodePort": 30260},
                                  {"port": 53, "protocol": "UDP", "nodePort": 31000}]}}),
        json!({"metadata": meta("myapp-headless", "2025-06-01T09:30:00Z"),
               "spec": {"type": "ClusterIP", "clusterIP": "None", "clusterIPs": ["None"],
                        "selector": {"app": "myapp"}, "ports": [{"port": 80, "protocol": "TCP"}]}}),
        json!({"metadata": meta("mysql", "2025-05-29T12:00:00Z"),
               "spec": {"type": "ExternalName", "externalName": "mysql.example.com"}}),
        json!({"metadata": meta("lb-pending", "2025-06-01T11:55:00Z"),
               "spec": {"type": "LoadBalancer", "clusterIPs": ["10.96.0.50"],
                        "ports": [{"port": 80, "protocol": "TCP", "nodePort": 31500}]}}),
        json!({"metadata": meta("lb", "2025-06-01T11:55:00Z"),
               "spec": {"type": "LoadBalancer", "clusterIPs": ["10.96.0.51"], "externalIPs": ["192.0.2.9"],
                        "ports": [{"port": 80, "protocol": "TCP", "nodePort": 31501}]},
               "status": {"loadBalancer": {"ingress": [{"ip": "172.18.255.201"}, {"hostname": "lb.example.com"}, {"ip": "172.18.255.200"}]}}}),
        json!({"metadata": meta("ext-ips", "2025-06-01T11:55:00Z"),
               "spec": {"type": "ClusterIP", "clusterIPs": ["10.96.0.52"], "externalIPs": ["192.0.2.1", "192.0.2.2"], "ports": []}}),
    ];
    check(
        "Service",
        items,
        expect![[r#"
            NAME             TYPE           CLUSTER-IP      EXTERNAL-IP                                              PORT(S)                     AGE    SELECTOR
            kubernetes       ClusterIP      10.96.0.1       <none>                                                   443/TCP                     31d    <none>
            myapp            NodePort       10.96.149.191   <none>                                                   80:30260/TCP,53:31000/UDP   45s    app=myapp,tier=web
            myapp-headless   ClusterIP      None            <none>                                                   80/TCP                      150m   app=myapp
            mysql            ExternalName   <none>          mysql.example.com                                        <none>                      3d     <none>
            lb-pending       LoadBalancer   10.96.0.50      <pending>                                                80:31500/TCP                5m     <none>
            lb               LoadBalancer   10.96.0.51      172.18.255.200,172.18.255.201,lb.example.com,192.0.2.9   80:31501/TCP                5m     <none>
            ext-ips          ClusterIP      10.96.0.52      192.0.2.1,192.0.2.2                                      <none>                      5m     <none>"#]],
    );
}

#[test]
fn endpoints_and_slices() {
    let addrs = |ips: &[&str]| ips.iter().map(|ip| json!({"ip": ip})).collect::<Vec<_>>();
    let endpoints = vec![
        json!({"metadata": meta("myapp", "2025-06-01T11:00:00Z"),
               "subsets": [{"addresses": addrs(&["172.18.236.167", "172.18.236.168", "172.18.236.169", "172.18.236.170"]),
                            "ports": [{"port": 80, "protocol": "TCP"}]}]}),
        json!({"metadata": meta("two-ports", "2025-06-01T11:00:00Z"),
               "subsets": [{"addresses": addrs(&["10.0.0.1", "10.0.0.2"]),
                            "ports": [{"name": "a", "port": 80}, {"name": "b", "port": 443}]}]}),
        json!({"metadata": meta("small", "2025-06-01T11:00:00Z"),
               "subsets": [{"addresses": addrs(&["10.0.0.1"]), "ports": [{"port": 3306}]},
                           {"addresses": addrs(&["fd00::1"]), "ports": [{"port": 3306}]}]}),
        json!({"metadata": meta("headless-no-ports", "2025-06-01T11:00:00Z"),
               "subsets": [{"addresses": addrs(&["10.0.0.7", "10.0.0.8"])}]}),
        json!({"metadata": meta("empty", "2025-06-01T11:00:00Z")}),
    ];
    check(
        "Endpoints",
        endpoints,
        expect![[r#"
            NAME                ENDPOINTS                                                           AGE
            myapp               172.18.236.167:80,172.18.236.168:80,172.18.236.169:80 + 1 more...   60m
            two-ports           10.0.0.1:80,10.0.0.2:80,10.0.0.1:443 + 1 more...                    60m
            small               10.0.0.1:3306,[fd00::1]:3306                                        60m
            headless-no-ports   10.0.0.7,10.0.0.8                                                   60m
            empty               <none>                                                              60m"#]],
    );
    let slices = vec![
        json!({"metadata": meta("myapp-abc12", "2025-06-01T11:00:00Z"), "addressType": "IPv4",
               "ports": [{"name": "", "port": 80, "protocol": "TCP"}],
               "endpoints": [{"addresses": ["172.18.236.167"]}, {"addresses": ["172.18.236.168"]},
                             {"addresses": ["172.18.236.169"]}, {"addresses": ["172.18.236.170"]}]}),
        json!({"metadata": meta("many-ports", "2025-06-01T11:00:00Z"), "addressType": "IPv6",
               "ports": [{"port": 1}, {"port": 2}, {"name": "named"}, {}, {"port": 5}],
               "endpoints": [{"addresses": ["fd00::1"]}]}),
        json!({"metadata": meta("none", "2025-06-01T11:00:00Z"), "addressType": "IPv4", "endpoints": []}),
    ];
    check(
        "EndpointSlice",
        slices,
        expect![[r#"
            NAME          ADDRESSTYPE   PORTS                   ENDPOINTS                                                  AGE
            myapp-abc12   IPv4          80                      172.18.236.167,172.18.236.168,172.18.236.169 + 1 more...   60m
            many-ports    IPv6          1,2,named + 2 more...   fd00::1                                                    60m
            none          IPv4          <unset>                 <unset>                                                    60m"#]],
    );
}

fn pod(name: &str, extra: Value) -> Value {
    let mut p = json!({
        "metadata": meta(name, "2025-06-01T10:00:00Z"),
        "spec": {"nodeName": "node-1", "containers": [{"name": "web", "image": "nginx"}]},
        "status": {"phase": "Running", "podIP": "10.244.0.5", "podIPs": [{"ip": "10.244.0.5"}],
                   "conditions": [{"type": "Ready", "status": "True"}],
                   "containerStatuses": [{"name": "web", "ready": true, "restartCount": 0,
                                          "state": {"running": {"startedAt": "2025-06-01T10:00:05Z"}}}]}
    });
    json_patch::merge(&mut p, &extra);
    p
}

#[test]
fn pods() {
    let items = vec![
        pod("running", json!({})),
        pod(
            "pending",
            json!({"spec": {"nodeName": null}, "status": {"phase": "Pending", "podIP": null, "podIPs": null,
            "conditions": null, "containerStatuses": null}}),
        ),
        pod(
            "crashing",
            json!({"status": {"containerStatuses": [{"name": "web", "ready": false, "restartCount": 4,
            "lastState": {"terminated": {"exitCode": 1, "finishedAt": "2025-06-01T11:58:00Z"}},
            "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]}}),
        ),
        pod(
            "completed",
            json!({"status": {"phase": "Succeeded", "containerStatuses": [{"name": "web", "ready": false,
            "restartCount": 0, "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}]}}),
        ),
        pod(
            "killed",
            json!({"status": {"phase": "Failed", "containerStatuses": [{"name": "web", "ready": false,
            "restartCount": 0, "state": {"terminated": {"exitCode": 137, "signal": 9}}}]}}),
        ),
        pod(
            "terminating",
            json!({"metadata": {"deletionTimestamp": "2025-06-01T11:59:00Z"}}),
        ),
        pod(
            "init",
            json!({"spec": {"initContainers": [{"name": "setup", "image": "busybox"}]},
            "status": {"phase": "Pending", "initContainerStatuses": [{"name": "setup", "ready": false, "restartCount": 0,
            "state": {"running": {}}}], "containerStatuses": [{"name": "web", "ready": false, "restartCount": 0,
            "state": {"waiting": {"reason": "PodInitializing"}}}]}}),
        ),
        pod(
            "sidecar",
            json!({"spec": {"initContainers": [{"name": "proxy", "image": "envoy", "restartPolicy": "Always"}],
            "readinessGates": [{"conditionType": "example.com/lb"}]},
            "status": {"initContainerStatuses": [{"name": "proxy", "ready": true, "started": true, "restartCount": 1,
            "state": {"running": {}}}]}}),
        ),
    ];
    check(
        "Pod",
        items.clone(),
        expect![[r#"
            NAME          READY   STATUS             RESTARTS     AGE    IP           NODE     NOMINATED NODE   READINESS GATES
            running       1/1     Running            0            120m   10.244.0.5   node-1   <none>           <none>
            pending       0/1     Pending            0            120m   <none>       <none>   <none>           <none>
            crashing      0/1     CrashLoopBackOff   4 (2m ago)   120m   10.244.0.5   node-1   <none>           <none>
            completed     0/1     Completed          0            120m   10.244.0.5   node-1   <none>           <none>
            killed        0/1     Signal:9           0            120m   10.244.0.5   node-1   <none>           <none>
            terminating   1/1     Terminating        0            120m   10.244.0.5   node-1   <none>           <none>
            init          0/1     Init:0/1           0            120m   10.244.0.5   node-1   <none>           <none>
            sidecar       2/2     Running            1            120m   10.244.0.5   node-1   <none>           0/1"#]],
    );
    let table = to_table_at("Pod", &items, IncludeObject::None, now());
    assert_eq!(table["rows"][3]["conditions"][0]["reason"], "Succeeded");
    assert!(table["rows"][0].get("conditions").is_none());
}

#[test]
fn workloads_nodes_namespaces() {
    let template = json!({"metadata": {"labels": {"app": "web"}},
        "spec": {"containers": [{"name": "web", "image": "nginx:1.25"}, {"name": "log", "image": "busybox"}]}});
    check(
        "Deployment",
        vec![
            json!({"metadata": meta("web", "2025-06-01T11:50:00Z"),
                   "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"},
                            "matchExpressions": [{"key": "tier", "operator": "In", "values": ["a", "b"]}]},
                            "template": template},
                   "status": {"readyReplicas": 2, "updatedReplicas": 3, "availableReplicas": 2}}),
            json!({"metadata": meta("fresh", "2025-06-01T11:59:58Z"),
                   "spec": {"selector": {"matchLabels": {"app": "x"}}, "template": template}}),
        ],
        expect![[r#"
            NAME    READY   UP-TO-DATE   AVAILABLE   AGE   CONTAINERS   IMAGES               SELECTOR
            web     2/3     3            2           10m   web,log      nginx:1.25,busybox   app=web,tier in (a,b)
            fresh   0/1     0            0           2s    web,log      nginx:1.25,busybox   app=x"#]],
    );
    check(
        "StatefulSet",
        vec![json!({"metadata": meta("web", "2025-05-20T12:00:00Z"),
                    "spec": {"replicas": 2, "serviceName": "nginx", "template": template},
                    "status": {"readyReplicas": 2}})],
        expect![[r#"
            NAME   READY   AGE   CONTAINERS   IMAGES
            web    2/2     12d   web,log      nginx:1.25,busybox"#]],
    );
    check(
        "ReplicaSet",
        vec![
            json!({"metadata": meta("web-5d4f8c7b9", "2025-06-01T11:50:00Z"),
                    "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web", "pod-template-hash": "5d4f8c7b9"}},
                             "template": template},
                    "status": {"replicas": 3, "readyReplicas": 2}}),
            json!({"metadata": meta("web-old", "2025-06-01T11:00:00Z"),
                    "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "web"}}, "template": template},
                    "status": {"replicas": 0}}),
        ],
        expect![[r#"
            NAME            DESIRED   CURRENT   READY   AGE   CONTAINERS   IMAGES               SELECTOR
            web-5d4f8c7b9   3         3         2       10m   web,log      nginx:1.25,busybox   app=web,pod-template-hash=5d4f8c7b9
            web-old         0         0         0       60m   web,log      nginx:1.25,busybox   app=web"#]],
    );
    check(
        "ControllerRevision",
        vec![
            json!({"metadata": {"name": "web-7b4f9", "creationTimestamp": "2025-06-01T11:00:00Z",
                                 "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "web",
                                                      "uid": "u", "controller": true}]},
                    "revision": 2, "data": {}}),
            json!({"metadata": {"name": "loose", "creationTimestamp": "2025-06-01T11:00:00Z"}, "revision": 1}),
        ],
        expect![[r#"
            NAME        CONTROLLER             REVISION   AGE
            web-7b4f9   statefulset.apps/web   2          60m
            loose       <none>                 1          60m"#]],
    );
    check(
        "Node",
        vec![
            json!({"metadata": {"name": "node-1", "creationTimestamp": "2025-05-31T12:00:00Z",
                                "labels": {"node-role.kubernetes.io/control-plane": "", "kubernetes.io/role": "edge"}},
                   "status": {"conditions": [{"type": "MemoryPressure", "status": "False"}, {"type": "Ready", "status": "True"}],
                              "addresses": [{"type": "Hostname", "address": "node-1"}, {"type": "InternalIP", "address": "192.168.1.10"}],
                              "nodeInfo": {"kubeletVersion": "v1.33.0-svcnet", "osImage": "Debian GNU/Linux 12 (bookworm)",
                                           "kernelVersion": "6.1.0", "containerRuntimeVersion": "svcnet://0.1.0"}}}),
            json!({"metadata": {"name": "node-2", "creationTimestamp": "2025-05-31T12:00:00Z"},
                   "spec": {"unschedulable": true},
                   "status": {"conditions": [{"type": "Ready", "status": "Unknown"}]}}),
            json!({"metadata": {"name": "node-3"}}),
        ],
        expect![[r#"
            NAME     STATUS                        ROLES                AGE         VERSION          INTERNAL-IP    EXTERNAL-IP   OS-IMAGE                         KERNEL-VERSION   CONTAINER-RUNTIME
            node-1   Ready                         control-plane,edge   24h         v1.33.0-svcnet   192.168.1.10   <none>        Debian GNU/Linux 12 (bookworm)   6.1.0            svcnet://0.1.0
            node-2   NotReady,SchedulingDisabled   <none>               24h                          <none>         <none>        <unknown>                        <unknown>        <unknown>
            node-3   Unknown                       <none>               <unknown>                    <none>         <none>        <unknown>                        <unknown>        <unknown>"#]],
    );
    check(
        "Namespace",
        vec![
            json!({"metadata": {"name": "default", "creationTimestamp": "2025-04-01T12:00:00Z"}, "status": {"phase": "Active"}}),
            json!({"metadata": {"name": "going", "creationTimestamp": "2023-01-01T12:00:00Z"}, "status": {"phase": "Terminating"}}),
        ],
        expect![[r#"
            NAME      STATUS        AGE
            default   Active        61d
            going     Terminating   2y152d"#]],
    );
}

#[test]
fn events_configmaps_and_others() {
    check(
        "Event",
        vec![
            json!({"metadata": meta("web-0.1", "2025-06-01T11:00:00Z"),
                   "involvedObject": {"kind": "Pod", "name": "web-0", "fieldPath": "spec.containers{web}"},
                   "reason": "Started", "type": "Normal", "message": "Started container web\n",
                   "source": {"component": "kubelet", "host": "node-1"},
                   "firstTimestamp": "2025-06-01T11:00:00Z", "lastTimestamp": "2025-06-01T11:59:00Z", "count": 3}),
            json!({"metadata": meta("svc.2", "2025-06-01T11:59:30Z"),
                   "involvedObject": {"kind": "Service"}, "reason": "Sync", "type": "Warning",
                   "message": "x", "reportingComponent": "svcnet-controller", "eventTime": "2025-06-01T11:59:30.123456Z",
                   "series": {"count": 7, "lastObservedTime": "2025-06-01T11:59:50.000000Z"}}),
        ],
        expect![[r#"
            LAST SEEN   TYPE      REASON    OBJECT      SUBOBJECT              SOURCE              MESSAGE                 FIRST SEEN   COUNT   NAME
            60s         Normal    Started   pod/web-0   spec.containers{web}   kubelet, node-1     Started container web   60m          3       web-0.1
            10s         Warning   Sync      service                            svcnet-controller   x                       29s          7       svc.2"#]],
    );
    check(
        "ConfigMap",
        vec![
            json!({"metadata": meta("cfg", "2025-06-01T11:00:00Z"), "data": {"a": "1", "b": "2"}, "binaryData": {"c": "AA=="}}),
        ],
        expect![[r#"
            NAME   DATA   AGE
            cfg    3      60m"#]],
    );
    check(
        "Lease",
        vec![
            json!({"metadata": meta("lock", "2025-06-01T11:00:00Z")}),
            json!({"metadata": {"name": "no-time"}}),
        ],
        expect![[r#"
            NAME      AGE
            lock      60m
            no-time   <unknown>"#]],
    );
}

#[test]
fn network_policies() {
    check(
        "NetworkPolicy",
        vec![
            json!({"metadata": meta("deny-all", "2025-06-01T11:00:00Z"), "spec": {"podSelector": {}, "policyTypes": ["Ingress"]}}),
            json!({"metadata": meta("web", "2025-06-01T11:59:00Z"), "spec": {"podSelector": {"matchLabels": {"app": "web", "tier": "fe"}, "matchExpressions": [{"key": "env", "operator": "In", "values": ["prod", "dev"]}]}}}),
            json!({"metadata": meta("no-spec", "2025-06-01T11:59:00Z")}),
        ],
        expect![[r#"
            NAME       POD-SELECTOR                        AGE
            deny-all   <none>                              60m
            web        app=web,env in (dev,prod),tier=fe   60s
            no-spec    <none>                              60s"#]],
    );
}

#[test]
fn table_shape_and_include_object() {
    let svc = json!({"apiVersion": "v1", "kind": "Service",
                     "metadata": meta("web", "2025-06-01T11:00:00Z"),
                     "spec": {"type": "ClusterIP", "clusterIPs": ["10.96.0.9"], "ports": [{"port": 80, "protocol": "TCP"}]}});
    let t = to_table_at(
        "Service",
        std::slice::from_ref(&svc),
        IncludeObject::Metadata,
        now(),
    );
    assert_eq!(t["kind"], "Table");
    assert_eq!(t["apiVersion"], "meta.k8s.io/v1");
    let cols = t["columnDefinitions"].as_array().unwrap();
    assert_eq!(cols[0]["format"], "name");
    assert_eq!(cols[6]["name"], "Selector");
    assert_eq!(cols[6]["priority"], 1);
    for c in cols {
        for field in ["name", "type", "format", "description", "priority"] {
            assert!(c.get(field).is_some(), "{c} lacks {field}");
        }
    }
    assert_eq!(
        t["rows"][0]["object"],
        json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": svc["metadata"]})
    );
    let t = to_table_at(
        "Service",
        std::slice::from_ref(&svc),
        IncludeObject::Object,
        now(),
    );
    assert_eq!(t["rows"][0]["object"], svc);
    let t = to_table_at(
        "Service",
        std::slice::from_ref(&svc),
        IncludeObject::None,
        now(),
    );
    assert!(t["rows"][0].get("object").is_none());
    assert_eq!(
        to_table_at("Service", &[], IncludeObject::None, now())["rows"],
        json!([])
    );
    assert_eq!(IncludeObject::parse("Object"), Some(IncludeObject::Object));
    assert_eq!(IncludeObject::parse("object"), None);
    assert_eq!(IncludeObject::default(), IncludeObject::Metadata);
}
