//! Raw HTTPS behaviour with curl (a real TLS client outside Rust): authentication, probes and
//! the Status objects of protocol-level errors.
#![allow(clippy::unwrap_used)]

mod common;

use std::process::Command;

struct Reply {
    code: u16,
    body: String,
}

fn curl(args: &[&str]) -> Reply {
    let out = Command::new("curl")
        .args(["-s", "-w", "\n%{http_code}"])
        .args(args)
        .output()
        .expect("curl runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap();
    Reply {
        code: code.trim().parse().unwrap_or(0),
        body: body.to_string(),
    }
}

fn status(r: &Reply) -> serde_json::Value {
    let v: serde_json::Value = serde_json::from_str(&r.body)
        .unwrap_or_else(|_| panic!("not JSON (HTTP {}): {}", r.code, r.body));
    assert_eq!(v["kind"], "Status", "{v}");
    assert_eq!(v["code"], r.code, "{v}");
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authentication_probes_and_error_statuses() {
    let ts = common::TestServer::start().await;
    let pki = ts.dir.path().join("pki");
    let base = format!("https://{}", ts.server().addr());
    let ca = pki.join("ca.crt");
    let (cert, key) = (pki.join("admin.crt"), pki.join("admin.key"));
    let (ca, cert, key) = (
        ca.to_str().unwrap().to_string(),
        cert.to_str().unwrap().to_string(),
        key.to_str().unwrap().to_string(),
    );
    tokio::task::spawn_blocking(move || {
        let anon = |path: &str, extra: &[&str]| {
            let url = format!("{base}{path}");
            let mut args = vec!["--cacert", &ca];
            args.extend_from_slice(extra);
            args.push(&url);
            curl(&args)
        };
        let authed = |path: &str, extra: &[&str]| {
            let url = format!("{base}{path}");
            let mut args = vec!["--cacert", &ca, "--cert", &cert, "--key", &key];
            args.extend_from_slice(extra);
            args.push(&url);
            curl(&args)
        };
        // Probes need no credentials; everything else does (the server certificate verifies
        // against the CA for 127.0.0.1 without -k).
        let r = anon("/readyz", &[]);
        assert_eq!((r.code, r.body.as_str()), (200, "ok"));
        let r = anon("/api/v1/namespaces", &[]);
        assert_eq!(r.code, 401);
        assert_eq!(status(&r)["reason"], "Unauthorized");
        // A certificate from another CA is refused in the handshake.
        let other = rcgen::generate_simple_self_signed(vec!["x".to_string()]).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let (oc, ok) = (dir.path().join("c.pem"), dir.path().join("k.pem"));
        std::fs::write(&oc, other.cert.pem()).unwrap();
        std::fs::write(&ok, other.signing_key.serialize_pem()).unwrap();
        let r = anon(
            "/api/v1/namespaces",
            &[
                "--cert",
                oc.to_str().unwrap(),
                "--key",
                ok.to_str().unwrap(),
            ],
        );
        assert!(
            r.code == 0 || r.code == 401,
            "foreign certificate accepted: {}",
            r.code
        );

        let r = authed("/api/v1/namespaces/default", &[]);
        assert_eq!(r.code, 200, "{}", r.body);
        let r = authed("/version", &[]);
        assert!(r.body.contains("v1.33"));
        let r = authed("/no/such/path", &[]);
        assert_eq!(
            (r.code, status(&r)["reason"].as_str().unwrap()),
            (404, "NotFound")
        );
        let r = authed(
            "/api/v1/namespaces/default/services/kubernetes",
            &["-X", "POST", "-d", "{}"],
        );
        assert_eq!(
            (r.code, status(&r)["reason"].as_str().unwrap()),
            (405, "MethodNotAllowed")
        );
        let json_ct = ["-H", "Content-Type: application/json"];
        let r = authed(
            "/api/v1/namespaces/default/configmaps",
            &[&json_ct[..], &["-X", "POST", "-d", "{not json"]].concat(),
        );
        assert_eq!(
            (r.code, status(&r)["reason"].as_str().unwrap()),
            (400, "BadRequest")
        );
        let big = dir.path().join("big.json");
        std::fs::write(
            &big,
            format!("{{\"data\": {{\"k\": \"{}\"}}}}", "x".repeat(4 << 20)),
        )
        .unwrap();
        let at_big = format!("@{}", big.display());
        let r = authed(
            "/api/v1/namespaces/default/configmaps",
            &[&json_ct[..], &["-X", "POST", "--data-binary", &at_big]].concat(),
        );
        assert_eq!(
            (r.code, status(&r)["reason"].as_str().unwrap()),
            (413, "RequestEntityTooLarge")
        );
        let r = authed(
            "/api/v1/namespaces/default/services",
            &[
                &json_ct[..],
                &[
                    "-X",
                    "POST",
                    "-d",
                    r#"{"metadata":{"name":"bad"},"spec":{"ports":[{"port":70000}]}}"#,
                ],
            ]
            .concat(),
        );
        let s = status(&r);
        assert_eq!((r.code, s["reason"].as_str().unwrap()), (422, "Invalid"));
        assert_eq!(s["details"]["causes"][0]["field"], "spec.ports[0].port");
        assert_eq!(s["details"]["causes"][0]["reason"], "FieldValueInvalid");
        let r = authed(
            "/api/v1/namespaces/default/services?fieldValidation=Strict",
            &[
                &json_ct[..],
                &[
                    "-X",
                    "POST",
                    "-d",
                    r#"{"metadata":{"name":"odd"},"spec":{"foo":1,"ports":[{"port":80}]}}"#,
                ],
            ]
            .concat(),
        );
        assert_eq!(r.code, 400);
        assert!(
            status(&r)["message"]
                .as_str()
                .unwrap()
                .contains("strict decoding error: unknown field \"spec.foo\""),
            "{}",
            r.body
        );
        let r = authed(
            "/api/v1/namespaces/default/services/kubernetes",
            &["-X", "PATCH", "-H", "Content-Type: text/plain", "-d", "{}"],
        );
        assert_eq!(r.code, 415);
        // Discovery and the OpenAPI v3 document that lets kubectl validate on the server.
        let r = authed("/api/v1", &[]);
        assert!(r.body.contains("\"shortNames\":[\"svc\"]"), "{}", r.body);
        let r = authed("/openapi/v3/api/v1", &[]);
        assert!(r.body.contains("fieldValidation"));
    })
    .await
    .unwrap();
    ts.stop().await;
}
