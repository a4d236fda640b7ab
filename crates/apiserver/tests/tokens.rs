//! ServiceAccount tokens end to end: tokens from `kubectl create token` in a kubeconfig and in
//! kube-rs authenticate and are authorized as their ServiceAccount; expired, forged, edited,
//! other-audience and orphaned tokens get 401; a token's connection outlives the limits of
//! unauthenticated ones.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use base64::Engine;
use common::kubectl::{KUBECTL_1_33 as KUBECTL, Kubectl};
use common::rbac::*;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ListParams, PostParams};
use serde_json::{Value, json};

/// A ClusterIP Service of one port.
fn service(name: &str) -> Service {
    serde_json::from_value(json!({"metadata": {"name": name}, "spec": {"ports": [{"port": 80}]}}))
        .unwrap()
}

/// The claims of a token (its payload, not verified).
fn claims_of(token: &str) -> Value {
    let payload = token.split('.').nth(1).unwrap();
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload)
        .unwrap();
    serde_json::from_slice(&bytes).unwrap()
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
                Some("apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: rb-a, finalizers: [example.com/hold]}\nspec:\n  serviceAccountName: proxy\n  containers: [{name: c, image: busybox}]\n"),
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
    // Terminating (held by its finalizer), deleted less than the leeway ago: a pod keeps
    // its credentials while it shuts down, as upstream's.
    let r = status_of("terminating", bound.clone()).await;
    assert_eq!(r.code, 200, "token of a terminating pod: {}", r.body);
    env.blocking(|k| {
        k.ok(&[
            "patch",
            "pod",
            "p",
            "-n",
            "rb-a",
            "--type=merge",
            "-p",
            r#"{"metadata":{"finalizers":null}}"#,
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
