//! End to end (needs root): the real `kubectl exec` and `kubectl cp` against `svcnet up`, over
//! the WebSocket channel protocol: output and exit codes carried back, stdin to end of file,
//! container choice, a terminal driven through a pseudo-terminal (`script`), files copied both
//! ways, clear errors for unknown pods and containers, and nothing left behind by a client
//! that drops the stream. Address ranges and the name prefix are this test's own.
#![allow(clippy::unwrap_used)]

mod common;

use std::io::Write;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{KUBECTL, Net, Up, free_udp_port, is_root, wait_for};

const POD: &str = r#"
apiVersion: v1
kind: Pod
metadata:
  name: shell
spec:
  containers:
  - name: first
    image: busybox
    env: [{name: WHO, value: first}]
    ports: [{containerPort: 8080}]
  - name: second
    image: busybox
    env: [{name: WHO, value: second}]
    ports: [{containerPort: 8081}]
"#;

fn kubectl(up: &Up) -> Command {
    let mut c = Command::new(KUBECTL);
    c.env("KUBECONFIG", up.kubeconfig());
    c
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn exec(up: &Up, args: &[&str]) -> Output {
    kubectl(up).arg("exec").args(args).output().unwrap()
}

#[test]
fn kubectl_exec_and_cp() {
    if !is_root() {
        eprintln!("skipped: needs root (CI runs as root)");
        return;
    }
    let net = Net {
        prefix: "e2eex",
        underlay: "172.29.11.0/24",
        pods: "10.156.0.0/16",
        services: "10.146.0.0/16",
        lb: "10.147.0.0/24",
    };
    let mut up = net.up("1", free_udp_port());
    let manifest = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(manifest.path(), POD).unwrap();
    up.ok(&["apply", "-f", manifest.path().to_str().unwrap()]);
    wait_for("the pod running", || {
        let phase = up.ok(&["get", "pod", "shell", "-o", "jsonpath={.status.phase}"]);
        (phase == "Running").then_some(phase)
    });

    // Output on both streams, and the exit code carried back.
    let out = exec(
        &up,
        &["shell", "--", "sh", "-c", "echo out; echo err >&2; exit 3"],
    );
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert_eq!(text(&out.stdout), "out\n");
    assert!(text(&out.stderr).contains("err"), "{}", text(&out.stderr));
    let out = exec(&up, &["shell", "--", "false"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let out = exec(&up, &["shell", "--", "hostname"]);
    assert_eq!(
        (out.status.code(), text(&out.stdout)),
        (Some(0), "shell\n".into())
    );

    // The first container by default, another with -c: each with its own environment.
    let out = exec(&up, &["shell", "--", "sh", "-c", "echo $WHO"]);
    assert_eq!(text(&out.stdout), "first\n", "{out:?}");
    let out = exec(
        &up,
        &["shell", "-c", "second", "--", "sh", "-c", "echo $WHO"],
    );
    assert_eq!(text(&out.stdout), "second\n", "{out:?}");

    // stdin to its end: the process sees end of file and exits.
    let mut child = kubectl(&up)
        .args(["exec", "-i", "shell", "--", "sh", "-c", "cat; echo done"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"hello\nworld\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(text(&out.stdout), "hello\nworld\ndone\n", "{out:?}");
    assert!(out.status.success());

    // A terminal: kubectl -it under a pseudo-terminal of 33 rows and 101 columns.
    let script = format!(
        "stty rows 33 cols 101; KUBECONFIG={} {KUBECTL} exec -it shell -- sh -c 'tty; stty size; exit 4'",
        up.kubeconfig().display()
    );
    let out = Command::new("script")
        .args(["-qec", &script, "/dev/null"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let shown = text(&out.stdout);
    assert!(
        shown.contains("/dev/pts/"),
        "no terminal in the pod: {shown:?}"
    );
    assert!(
        shown.contains("33 101"),
        "the terminal's size did not reach the pod: {shown:?}"
    );
    assert_eq!(out.status.code(), Some(4), "{shown:?}");

    // Clear errors naming what does not exist.
    let out = exec(&up, &["nope", "--", "true"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("pods \"nope\" not found"),
        "{}",
        text(&out.stderr)
    );
    let out = exec(&up, &["shell", "-c", "third", "--", "true"]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("third"), "{}", text(&out.stderr));
    let out = exec(&up, &["shell", "--", "/no/such/program"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("/no/such/program"),
        "{}",
        text(&out.stderr)
    );

    // kubectl cp (tar over exec), both ways. The pod sees the host's file system here.
    let dir = tempfile::tempdir().unwrap();
    let (src, back) = (dir.path().join("src.txt"), dir.path().join("back.txt"));
    std::fs::write(&src, "copied through exec\n").unwrap();
    let in_pod = format!("shell:{}/in-pod.txt", dir.path().display());
    let out = kubectl(&up)
        .args(["cp", src.to_str().unwrap(), &in_pod])
        .output()
        .unwrap();
    assert!(out.status.success(), "cp into the pod: {out:?}");
    let out = kubectl(&up)
        .args(["cp", &in_pod, back.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "cp out of the pod: {out:?}");
    assert_eq!(
        std::fs::read_to_string(&back).unwrap(),
        "copied through exec\n"
    );

    // A client that goes away mid-stream takes the process with it.
    let marker = "301.123";
    let mut child = kubectl(&up)
        .args(["exec", "shell", "--", "sleep", marker])
        .spawn()
        .unwrap();
    let running = || {
        Command::new("pgrep")
            .args(["-f", &format!("sleep {marker}")])
            .output()
            .unwrap()
            .status
            .success()
    };
    wait_for("the exec'd process", || running().then(String::new));
    child.kill().unwrap();
    let _ = child.wait();
    let deadline = Instant::now() + Duration::from_secs(10);
    while running() {
        assert!(Instant::now() < deadline, "the process outlived its client");
        std::thread::sleep(Duration::from_millis(100));
    }
    net.stop(&mut up);
}
