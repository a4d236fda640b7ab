//! Raw requests through kube-rs's client, and snapshots of the whole store, for the tests that
//! check a refused request changes nothing.

use std::collections::BTreeMap;

use http_body_util::BodyExt;
use serde_json::Value;

/// A raw request through kube-rs's client (real TLS, the written kubeconfig).
pub struct Raw {
    pub client: kube::Client,
}

pub struct Reply {
    pub code: u16,
    pub body: Value,
}

impl Raw {
    pub async fn send(&self, method: &str, path: &str, content_type: &str, body: &[u8]) -> Reply {
        let req = http::Request::builder()
            .method(method)
            .uri(path)
            .header("content-type", content_type)
            .header("accept", "application/json")
            .body(kube::client::Body::from(body.to_vec()))
            .unwrap();
        let resp = self.client.send(req).await.unwrap();
        let code = resp.status().as_u16();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        let body = serde_json::from_slice(&bytes)
            .unwrap_or(Value::String(String::from_utf8_lossy(&bytes).into_owned()));
        Reply { code, body }
    }

    pub async fn json(&self, method: &str, path: &str, body: &Value) -> Reply {
        self.send(
            method,
            path,
            "application/json",
            body.to_string().as_bytes(),
        )
        .await
    }

    pub async fn get(&self, path: &str) -> Reply {
        self.send("GET", path, "application/json", b"").await
    }

    /// Every served list, by discovery: the store's revision and every object in it.
    pub async fn world(&self) -> (String, BTreeMap<String, Value>) {
        let mut paths = vec!["/api/v1".to_string()];
        let groups = self.get("/apis").await.body;
        for g in groups["groups"].as_array().unwrap() {
            paths.push(format!(
                "/apis/{}",
                g["preferredVersion"]["groupVersion"].as_str().unwrap()
            ));
        }
        let mut objects = BTreeMap::new();
        let mut revision = String::new();
        for gv in paths {
            let list = self.get(&gv).await.body;
            for r in list["resources"].as_array().unwrap() {
                let name = r["name"].as_str().unwrap();
                if name.contains('/') {
                    continue;
                }
                let l = self.get(&format!("{gv}/{name}")).await;
                assert_eq!(l.code, 200, "{gv}/{name}: {}", l.body);
                let rv = l.body["metadata"]["resourceVersion"]
                    .as_str()
                    .unwrap()
                    .to_string();
                revision = revision.max(rv);
                for item in l.body["items"].as_array().unwrap() {
                    let key = format!(
                        "{gv}/{name}/{}/{}",
                        item["metadata"]["namespace"].as_str().unwrap_or(""),
                        item["metadata"]["name"].as_str().unwrap()
                    );
                    objects.insert(key, item.clone());
                }
            }
        }
        (revision, objects)
    }

    /// Waits until background work (the namespace and garbage collectors) has stopped
    /// changing the store.
    pub async fn settle(&self) {
        let mut last = self.world().await;
        for _ in 0..50 {
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            let now = self.world().await;
            if now == last {
                return;
            }
            last = now;
        }
        panic!("the store kept changing");
    }

    /// Sends a request that must be refused with `code`, and checks that it changed nothing.
    pub async fn refused(
        &self,
        code: u16,
        method: &str,
        path: &str,
        ct: &str,
        body: &[u8],
    ) -> Value {
        let before = self.world().await;
        let r = self.send(method, path, ct, body).await;
        let shown: String = r.body.to_string().chars().take(400).collect();
        assert_eq!(r.code, code, "{method} {path}: {shown}");
        assert_eq!(r.body["kind"], "Status", "{method} {path}: {shown}");
        let after = self.world().await;
        assert_eq!(
            before.0, after.0,
            "{method} {path} moved the store's revision"
        );
        assert!(
            before.1 == after.1,
            "{method} {path} changed stored objects"
        );
        r.body
    }
}

pub async fn raw(ts: &super::TestServer) -> Raw {
    Raw {
        client: ts.client().await,
    }
}

pub const NS: &str = "/api/v1/namespaces";
