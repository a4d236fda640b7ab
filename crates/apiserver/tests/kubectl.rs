//! End to end with the real kubectl 1.33: apply (with its default strict validation), get in
//! every output format, label, scale, delete, and the error messages of bad manifests.
#![allow(clippy::unwrap_used)]

mod common;

use common::kubectl::Kubectl;

use common::kubectl::KUBECTL_1_33 as KUBECTL;

/// Runs `f` with kubectl 1.33 against a fresh server, on a blocking thread.
async fn with_kubectl(f: impl FnOnce(&Kubectl) + Send + 'static) {
    let ts = common::TestServer::start().await;
    let kubeconfig = ts.server().kubeconfig_path().to_path_buf();
    tokio::task::spawn_blocking(move || f(&Kubectl::new(KUBECTL, &kubeconfig)))
        .await
        .unwrap();
    ts.stop().await;
}

const APP: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
spec:
  replicas: 2
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      containers:
      - name: web
        image: nginx:1.7.9
        ports:
        - {name: http, containerPort: 80}
---
apiVersion: v1
kind: Service
metadata:
  name: web
spec:
  selector: {app: web}
  ports:
  - {name: http, port: 80, targetPort: http}
---
apiVersion: v1
kind: Service
metadata:
  name: web-np
spec:
  type: NodePort
  selector: {app: web}
  ports:
  - {port: 8080, targetPort: 80}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_drives_the_server() {
    let ts = common::TestServer::start().await;
    let dir = ts.dir.path().to_path_buf();
    let kubeconfig = ts.server().kubeconfig_path().to_path_buf();
    let manifest = dir.join("app.yaml");
    std::fs::write(&manifest, APP).unwrap();

    tokio::task::spawn_blocking(move || {
        let k = Kubectl::new(KUBECTL, &kubeconfig);
        // Server version drives kubectl's behaviour; it must look like 1.33.
        assert!(k.ok(&["version", "-o", "json"]).contains("\"gitVersion\": \"v1.33"));

        // apply with validation on (kubectl's default), twice: the second is a no-op.
        let out = k.ok(&["apply", "-f", &manifest.to_string_lossy()]);
        assert!(out.contains("deployment.apps/web created"), "{out}");
        assert!(out.contains("service/web created"), "{out}");
        let out = k.ok(&["apply", "-f", &manifest.to_string_lossy()]);
        assert!(out.contains("service/web unchanged"), "{out}");
        assert!(out.contains("deployment.apps/web unchanged"), "{out}");

        // Table output with upstream's columns.
        let out = k.ok(&["get", "svc"]);
        let header = out.lines().next().unwrap();
        for col in ["NAME", "TYPE", "CLUSTER-IP", "EXTERNAL-IP", "PORT(S)", "AGE"] {
            assert!(header.contains(col), "{out}");
        }
        let web = out.lines().find(|l| l.starts_with("web ")).unwrap();
        assert!(web.contains("ClusterIP") && web.contains("80/TCP"), "{out}");
        let np = out.lines().find(|l| l.starts_with("web-np ")).unwrap();
        assert!(np.contains("NodePort") && np.contains("8080:3"), "{out}");
        let out = k.ok(&["get", "svc", "web", "-o", "wide"]);
        assert!(out.contains("SELECTOR") && out.contains("app=web"), "{out}");

        // The allocated cluster IP is in the service CIDR and not a reserved address.
        let ip = k.ok(&["get", "svc", "web", "-o", "jsonpath={.spec.clusterIP}"]);
        assert!(ip.starts_with("10.9") && ip != "10.96.0.1" && ip != "10.96.0.10", "{ip}");
        let svc = k.get_json(&["svc", "web"]);
        assert_eq!(svc["spec"]["ports"][0]["targetPort"], "http");
        assert_eq!(svc["spec"]["sessionAffinity"], "None");
        let yaml = k.ok(&["get", "deploy", "web", "-o", "yaml"]);
        assert!(yaml.contains("replicas: 2") && yaml.contains("kind: Deployment"), "{yaml}");

        // The kubernetes service exists from the start.
        let out = k.ok(&["get", "svc", "kubernetes", "-o", "jsonpath={.spec.clusterIP}"]);
        assert_eq!(out, "10.96.0.1");
        let out = k.ok(&["get", "endpoints", "kubernetes"]);
        assert!(out.contains("127.0.0.1:"), "{out}");

        // label, label selectors, scale, get all, describe.
        assert!(k.ok(&["label", "svc", "web", "tier=front"]).contains("service/web labeled"));
        let out = k.ok(&["get", "svc", "-l", "tier=front", "-o", "name"]);
        assert_eq!(out.trim(), "service/web");
        let out = k.ok(&["get", "svc", "-l", "tier!=front", "-o", "name"]);
        assert!(!out.contains("service/web\n") && out.contains("service/web-np"), "{out}");
        assert!(k.ok(&["scale", "deployment", "web", "--replicas=3"]).contains("scaled"));
        assert_eq!(k.ok(&["get", "deploy", "web", "-o", "jsonpath={.spec.replicas}"]), "3");
        let out = k.ok(&["get", "all"]);
        assert!(out.contains("service/web") && out.contains("deployment.apps/web"), "{out}");
        let out = k.ok(&["describe", "svc", "web"]);
        assert!(out.contains("Selector:") && out.contains("app=web"), "{out}");
        let out = k.ok(&["get", "svc", "--field-selector", "metadata.name=web-np", "-o", "name"]);
        assert_eq!(out.trim(), "service/web-np");

        // Bad manifests: invalid fields (422 with causes), unknown fields (strict validation).
        let bad = dir.join("bad.yaml");
        std::fs::write(
            &bad,
            "apiVersion: v1\nkind: Service\nmetadata:\n  name: broken\nspec:\n  ports:\n  - {name: http, port: 0}\n  - {name: http, port: 8080}\n",
        )
        .unwrap();
        let err = k.fails(&["apply", "-f", &bad.to_string_lossy()]);
        assert!(err.contains("The Service \"broken\" is invalid"), "{err}");
        assert!(err.contains("spec.ports[0].port: Invalid value: 0"), "{err}");
        assert!(err.contains("spec.ports[1].name: Duplicate value: \"http\""), "{err}");
        let unknown = dir.join("unknown.yaml");
        std::fs::write(
            &unknown,
            "apiVersion: v1\nkind: Service\nmetadata:\n  name: odd\nspec:\n  bogus: 1\n  ports:\n  - {port: 80}\n",
        )
        .unwrap();
        let err = k.fails(&["apply", "-f", &unknown.to_string_lossy()]);
        assert!(err.contains("unknown field \"spec.bogus\""), "{err}");
        let err = k.fails(&["get", "svc", "nope"]);
        assert!(err.contains("services \"nope\" not found"), "{err}");
        let err = k.fails(&["get", "widgets"]);
        assert!(err.contains("the server doesn't have a resource type \"widgets\""), "{err}");

        // Patch the status subresource, as tests of controllers do.
        k.ok(&["patch", "deploy", "web", "--subresource=status", "--type=merge", "-p", r#"{"status":{"replicas":3}}"#]);
        assert_eq!(k.ok(&["get", "deploy", "web", "-o", "jsonpath={.status.replicas}"]), "3");

        // Delete (kubectl waits for the object to disappear through a watch).
        let out = k.ok(&["delete", "-f", &manifest.to_string_lossy()]);
        assert!(out.contains("service \"web\" deleted"), "{out}");
        let err = k.fails(&["get", "svc", "web"]);
        assert!(err.contains("not found"), "{err}");
        // Namespaces: create (kubectl sends protobuf), fill, delete (contents go with it).
        let out = k.ok(&["create", "namespace", "scratch"]);
        assert!(out.contains("namespace/scratch created"), "{out}");
        let ns = dir.join("ns.yaml");
        std::fs::write(
            &ns,
            "apiVersion: v1\nkind: Service\nmetadata:\n  name: tmp\n  namespace: scratch\nspec:\n  ports:\n  - {port: 80}\n",
        )
        .unwrap();
        k.ok(&["apply", "-f", &ns.to_string_lossy()]);
        assert!(k.ok(&["-n", "scratch", "get", "svc", "-o", "name"]).contains("service/tmp"));
        let out = k.ok(&["delete", "namespace", "scratch", "--timeout=30s"]);
        assert!(out.contains("namespace \"scratch\" deleted"), "{out}");
        let err = k.fails(&["get", "ns", "scratch"]);
        assert!(err.contains("not found"), "{err}");
    })
    .await
    .unwrap();
    ts.stop().await;
}

/// `kubectl explain` reads the served OpenAPI v3 documents: every served kind has its field
/// schema with the Kubernetes API's descriptions, down to nested fields.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_explains_the_served_kinds() {
    with_kubectl(|k| {
        let out = k.ok(&["explain", "svc"]);
        for want in [
            "KIND:       Service",
            "VERSION:    v1",
            "Service is a named abstraction of software service",
            "spec\t<ServiceSpec>",
            "status\t<ServiceStatus>",
        ] {
            assert!(out.contains(want), "{want:?} missing from:\n{out}");
        }
        let out = k.ok(&["explain", "svc.spec.ports.targetPort"]);
        assert!(out.contains("FIELD: targetPort <IntOrString>"), "{out}");
        assert!(
            out.contains("Number or name of the port to access on the pods"),
            "{out}"
        );
        let out = k.ok(&["explain", "svc.spec.publishNotReadyAddresses"]);
        assert!(out.contains("<boolean>"), "{out}");
        let out = k.ok(&["explain", "endpointslices.endpoints.conditions"]);
        for want in [
            "GROUP:      discovery.k8s.io",
            "ready\t<boolean>",
            "serving\t<boolean>",
            "terminating\t<boolean>",
            "publishNotReadyAddresses",
        ] {
            assert!(out.contains(want), "{want:?} missing from:\n{out}");
        }
        let out = k.ok(&["explain", "deploy.spec", "--recursive"]);
        assert!(out.contains("replicas\t<integer>"), "{out}");
        assert!(
            out.contains("selector\t<LabelSelector> -required-"),
            "{out}"
        );
        // Every served kind, by the name kubectl resolves through discovery.
        for kind in [
            "namespaces",
            "nodes",
            "pods",
            "services",
            "endpoints",
            "events",
            "configmaps",
            "serviceaccounts",
            "endpointslices",
            "deployments",
            "statefulsets",
            "replicasets",
            "events --api-version=events.k8s.io/v1",
            "leases",
            "networkpolicies",
        ] {
            let args: Vec<&str> = std::iter::once("explain").chain(kind.split(' ')).collect();
            let out = k.ok(&args);
            for want in ["KIND:", "DESCRIPTION:", "FIELDS:", "metadata\t<ObjectMeta>"] {
                assert!(out.contains(want), "{kind}: {want:?} missing from:\n{out}");
            }
            if kind.contains("events.k8s.io") {
                assert!(out.contains("GROUP:      events.k8s.io"), "{out}");
            }
        }
        let err = k.fails(&["explain", "svc.spec.nosuch"]);
        assert!(err.contains("nosuch"), "{err}");
    })
    .await;
}

/// `limit` and `continue`: pages of one revision (an object created between pages is not in
/// them, and every page carries the first page's resourceVersion), repeatable and refused bad
/// tokens, and
/// kubectl's own chunked listing (`--chunk-size`) in every output.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_come_in_pages_of_one_snapshot() {
    with_kubectl(|k| {
        k.ok(&["create", "namespace", "paged"]);
        for i in 0..5 {
            k.ok(&[
                "create",
                "service",
                "clusterip",
                &format!("s{i}"),
                "--tcp=80",
                "-n",
                "paged",
            ]);
        }
        let get = |query: &str| -> serde_json::Value {
            let out = k.ok(&[
                "get",
                "--raw",
                &format!("/api/v1/namespaces/paged/services?{query}"),
            ]);
            serde_json::from_str(&out).unwrap()
        };
        let names = |list: &serde_json::Value| -> Vec<String> {
            list["items"]
                .as_array()
                .unwrap()
                .iter()
                .map(|o| o["metadata"]["name"].as_str().unwrap().to_string())
                .collect()
        };
        let first = get("limit=2");
        assert_eq!(names(&first), ["s0", "s1"]);
        assert_eq!(first["metadata"]["remainingItemCount"], 3);
        let rv = first["metadata"]["resourceVersion"].clone();
        let token = first["metadata"]["continue"].as_str().unwrap().to_string();
        // Created after the first page: not part of this list.
        k.ok(&[
            "create",
            "service",
            "clusterip",
            "s5",
            "--tcp=80",
            "-n",
            "paged",
        ]);
        let second = get(&format!("limit=2&continue={token}"));
        assert_eq!(names(&second), ["s2", "s3"]);
        assert_eq!(second["metadata"]["resourceVersion"], rv);
        let token = second["metadata"]["continue"].as_str().unwrap().to_string();
        let last = get(&format!("limit=2&continue={token}"));
        assert_eq!(names(&last), ["s4"]);
        assert!(last["metadata"].get("continue").is_none(), "{last}");
        // A selector leaves the remaining count unknown; a limit that fits makes no token.
        let sel = get("limit=1&fieldSelector=metadata.namespace%3Dpaged");
        assert!(sel["metadata"]["continue"].is_string());
        assert!(sel["metadata"].get("remainingItemCount").is_none(), "{sel}");
        assert!(get("limit=100")["metadata"].get("continue").is_none());
        // Across namespaces with a selector the first read holds other namespaces' Services:
        // the server reads on until the page is full, and the pages walk every match once.
        let (mut walked, mut sizes, mut next) = (Vec::new(), Vec::new(), String::new());
        for _ in 0..10 {
            let more = if next.is_empty() {
                String::new()
            } else {
                format!("&continue={next}")
            };
            let out = k.ok(&[
                "get",
                "--raw",
                &format!("/api/v1/services?limit=2&fieldSelector=metadata.namespace%3Dpaged{more}"),
            ]);
            let page: serde_json::Value = serde_json::from_str(&out).unwrap();
            let got = names(&page);
            sizes.push(got.len());
            walked.extend(got);
            match page["metadata"]["continue"].as_str() {
                Some(t) => next = t.to_string(),
                None => break,
            }
        }
        assert_eq!(walked, ["s0", "s1", "s2", "s3", "s4", "s5"]);
        assert_eq!(
            sizes[..3],
            [2, 2, 2],
            "full pages, then at most an empty last one"
        );
        assert!(sizes[3..].iter().all(|n| *n == 0), "{sizes:?}");
        // Bad tokens, and a token with a resourceVersion.
        let err = k.fails(&[
            "get",
            "--raw",
            "/api/v1/namespaces/paged/services?continue=bm9wZQ",
        ]);
        assert!(err.contains("continue key is not valid"), "{err}");
        let err = k.fails(&[
            "get",
            "--raw",
            &format!("/api/v1/namespaces/paged/services?continue={token}&resourceVersion=1"),
        ]);
        assert!(err.contains("not allowed when using continue"), "{err}");
        // A token names a revision and a key, as upstream's: the same token gives the same
        // page again (nothing is held between pages), and it belongs to its own list only.
        let again = get(&format!("limit=2&continue={token}"));
        assert_eq!(names(&again), ["s4"]);
        assert_eq!(again["metadata"]["resourceVersion"], rv);
        let fresh = get("limit=1")["metadata"]["continue"]
            .as_str()
            .unwrap()
            .to_string();
        let err = k.fails(&[
            "get",
            "--raw",
            &format!("/api/v1/services?continue={fresh}"),
        ]);
        assert!(err.contains("continue key is not valid"), "{err}");
        // resourceVersion 0 (any) may come with a token, as kube-rs watchers send it.
        let zero = get(&format!("limit=1&continue={fresh}&resourceVersion=0"));
        assert_eq!(names(&zero), ["s1"]);
        // Without a token, version 0 is answered whole, limit or not (kube-apiserver's watch
        // cache does; informers list so), also asked "NotOlderThan".
        let whole = get("limit=2&resourceVersion=0");
        assert_eq!(names(&whole), ["s0", "s1", "s2", "s3", "s4", "s5"]);
        assert!(whole["metadata"].get("continue").is_none(), "{whole}");
        let older = get("limit=2&resourceVersion=0&resourceVersionMatch=NotOlderThan");
        assert_eq!(names(&older).len(), 6, "{older}");
        // kubectl's chunked lists: every object, in pages (its requests carry the tokens).
        let o = k.run(
            &[
                "get",
                "services",
                "-n",
                "paged",
                "--chunk-size=2",
                "-o",
                "name",
                "-v=6",
            ],
            None,
        );
        assert!(o.ok, "{}", o.stderr);
        let got: Vec<&str> = o.stdout.lines().collect();
        let want: Vec<String> = (0..6).map(|i| format!("service/s{i}")).collect();
        assert_eq!(got, want, "{}", o.stderr);
        assert!(o.stderr.matches("continue=").count() >= 2, "{}", o.stderr);
        let table = k.ok(&["get", "services", "-n", "paged", "--chunk-size=4"]);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 7, "{table}");
        assert!(lines[0].starts_with("NAME"), "{table}");
        assert_eq!(table.matches("NAME").count(), 1, "{table}");
    })
    .await;
}

/// kubectl's typed `create` and `run` commands send protobuf: ConfigMaps (text and binary
/// data), ServiceAccounts and Pods decode into the objects kubectl meant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_create_and_run_send_protobuf() {
    with_kubectl(|k| {
        let blob = k.kubeconfig.parent().unwrap().join("blob.bin");
        std::fs::write(&blob, [0u8, 159, 255, 10]).unwrap();
        k.ok(&[
            "create",
            "configmap",
            "settings",
            "--from-literal=mode=fast",
            &format!("--from-file=blob={}", blob.display()),
        ]);
        let cm = k.get_json(&["configmap", "settings"]);
        assert_eq!(cm["data"]["mode"], "fast", "{cm}");
        assert_eq!(cm["binaryData"]["blob"], "AJ//Cg==", "{cm}");

        k.ok(&["create", "serviceaccount", "robot"]);
        assert!(
            k.ok(&["get", "serviceaccount", "-o", "name"])
                .contains("serviceaccount/robot")
        );

        k.ok(&[
            "run",
            "web",
            "--image=nginx:1.25",
            "--port=80",
            "--labels=app=web",
            "--env=MODE=fast",
        ]);
        let pod = k.get_json(&["pod", "web"]);
        let c = &pod["spec"]["containers"][0];
        assert_eq!(c["image"], "nginx:1.25", "{pod}");
        assert_eq!(c["ports"][0]["containerPort"], 80, "{pod}");
        assert_eq!(
            c["env"][0],
            serde_json::json!({"name": "MODE", "value": "fast"})
        );
        assert_eq!(pod["metadata"]["labels"]["app"], "web", "{pod}");

        k.ok(&[
            "run",
            "once",
            "--image=busybox",
            "--restart=Never",
            "--",
            "echo",
            "hi",
        ]);
        let pod = k.get_json(&["pod", "once"]);
        assert_eq!(pod["spec"]["restartPolicy"], "Never", "{pod}");
        assert_eq!(
            pod["spec"]["containers"][0]["args"],
            serde_json::json!(["echo", "hi"])
        );
    })
    .await;
}

/// What kubectl's first-hour commands get where svcnet serves nothing: an answer (auth can-i),
/// or an error that says what to use instead, and never a kubectl panic (kubectl debug reads
/// the details of a 404).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsupported_commands_say_what_to_do() {
    with_kubectl(|k| {
        assert_eq!(k.ok(&["auth", "can-i", "create", "pods"]).trim(), "yes");
        assert_eq!(
            k.ok(&["auth", "can-i", "delete", "nodes", "-A"]).trim(),
            "yes"
        );
        let rules = k.ok(&["auth", "can-i", "--list"]);
        assert!(rules.contains("*.*"), "{rules}");
        k.ok(&["run", "p", "--image=nginx", "--restart=Never"]);
        // No node agent here: the pod is marked running by hand, as a kubelet would.
        k.ok(&[
            "patch",
            "pod",
            "p",
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"phase":"Running"}}"#,
        ]);
        for args in [
            &["attach", "p"][..],
            &["port-forward", "pod/p", "18080:80"][..],
        ] {
            // Served, but nothing runs pods here: the error says so.
            let err = k.fails(args);
            assert!(
                err.contains("runs without a node agent"),
                "kubectl {args:?}: {err}"
            );
        }
        let o = k.run(&["debug", "p", "--image=busybox", "-it=false"], None);
        assert!(!o.ok);
        assert!(
            !o.stderr.contains("panic"),
            "kubectl debug panicked:\n{}",
            o.stderr
        );
        assert!(o.stderr.contains("ephemeral containers"), "{}", o.stderr);
    })
    .await;
}
