//! End to end (needs root): the real `kubectl logs` (`-f`, `--tail`, `--since`,
//! `--since-time`, `--timestamps`, `--limit-bytes`, `--previous` and its error) and
//! `kubectl attach` (output, and `-i` into a container with `stdin: true`) against `svcnet up`,
//! and kubectl 1.29's `exec` and `attach` over SPDY.
//! Address ranges and the name prefix are this test's own.
#![allow(clippy::unwrap_used)]

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{KUBECTL, Net, Up, free_udp_port, is_root, wait_for};

const MANIFEST: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: talker}
spec:
  containers:
  - name: c
    image: busybox
    command: [sh, -c, 'i=0; while true; do echo line $i; i=$((i+1)); sleep 0.3; done']
---
apiVersion: v1
kind: Pod
metadata: {name: sincer}
spec:
  containers:
  - name: c
    image: busybox
    command: [sh, -c, 'echo early; sleep 4; echo late; exec sleep 3600']
---
apiVersion: v1
kind: Pod
metadata: {name: crasher}
spec:
  containers:
  - name: c
    image: busybox
    command: [sh, -c, 'echo started $(date +%s%N); sleep 1; exit 1']
---
apiVersion: v1
kind: Pod
metadata: {name: echoer}
spec:
  containers:
  - name: c
    image: busybox
    stdin: true
    command: [sh, -c, 'while read l; do echo got:$l; done']
---
apiVersion: v1
kind: Pod
metadata: {name: ttysh}
spec:
  # An interactive shell ignores SIGTERM; do not wait 30 s for it at the end.
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: busybox
    stdin: true
    tty: true
    command: [sh]
"#;

fn logs(up: &Up, args: &[&str]) -> Output {
    Command::new(KUBECTL)
        .env("KUBECONFIG", up.kubeconfig())
        .arg("logs")
        .args(args)
        .output()
        .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Reads lines from `child`'s stdout until `done` says enough (or 15 s pass).
fn read_until(
    out: &mut impl BufRead,
    what: &str,
    mut done: impl FnMut(&[String]) -> bool,
) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut lines = Vec::new();
    while !done(&lines) {
        assert!(Instant::now() < deadline, "{what}: only {lines:?}");
        let mut line = String::new();
        if out.read_line(&mut line).unwrap() == 0 {
            panic!("{what}: the stream ended after {lines:?}");
        }
        lines.push(line.trim_end().to_string());
    }
    lines
}

fn line_number(l: &str) -> u64 {
    l.strip_prefix("line ").unwrap().parse().unwrap()
}

#[test]
fn kubectl_logs_and_attach() {
    if !is_root() {
        eprintln!("skipped: needs root (CI runs as root)");
        return;
    }
    let net = Net {
        prefix: "e2elg",
        underlay: "172.29.18.0/24",
        pods: "10.165.0.0/16",
        services: "10.166.0.0/16",
        lb: "10.167.0.0/24",
    };
    let mut up = net.up("1", free_udp_port());
    let manifest = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(manifest.path(), MANIFEST).unwrap();
    up.ok(&["apply", "-f", manifest.path().to_str().unwrap()]);
    for pod in ["talker", "sincer", "echoer"] {
        wait_for(&format!("{pod} running"), || {
            let phase = up.ok(&["get", "pod", pod, "-o", "jsonpath={.status.phase}"]);
            (phase == "Running").then_some(phase)
        });
    }
    wait_for("talker's first lines", || {
        let out = logs(&up, &["talker"]);
        (text(&out.stdout).lines().count() >= 3).then(String::new)
    });

    // --tail, and --timestamps in RFC 3339 with nanoseconds as kubectl shows them.
    let out = logs(&up, &["talker", "--tail", "2"]);
    let tail: Vec<String> = text(&out.stdout).lines().map(str::to_string).collect();
    assert_eq!(tail.len(), 2, "{tail:?}");
    assert_eq!(line_number(&tail[1]), line_number(&tail[0]) + 1, "{tail:?}");
    let out = logs(&up, &["talker", "--tail", "1", "--timestamps"]);
    let stamped = text(&out.stdout);
    let (ts, rest) = stamped.trim_end().split_once(' ').unwrap();
    assert!(rest.starts_with("line "), "{stamped:?}");
    let parsed: k8s_openapi::jiff::Timestamp = ts.parse().unwrap();
    let age = k8s_openapi::jiff::Timestamp::now().duration_since(parsed);
    assert!(
        age.as_secs() < 10 && ts.ends_with('Z') && ts.contains('T'),
        "{stamped:?}"
    );

    // -f follows: lines written after it started arrive.
    let mut follow = Command::new(KUBECTL)
        .env("KUBECONFIG", up.kubeconfig())
        .args(["logs", "-f", "--tail", "1", "talker"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(follow.stdout.take().unwrap());
    let seen = read_until(&mut out, "logs -f", |l| l.len() >= 4);
    let numbers: Vec<u64> = seen.iter().map(|l| line_number(l)).collect();
    assert!(numbers.windows(2).all(|w| w[1] == w[0] + 1), "{numbers:?}");
    follow.kill().unwrap();
    let _ = follow.wait();

    // --since and --since-time leave out what came before; --limit-bytes cuts.
    wait_for("sincer's late line", || {
        text(&logs(&up, &["sincer"]).stdout)
            .contains("late")
            .then(String::new)
    });
    let out = logs(&up, &["sincer", "--since", "2s"]);
    assert_eq!(text(&out.stdout), "late\n", "{out:?}");
    let out = logs(&up, &["sincer", "--timestamps"]);
    let late_ts = text(&out.stdout)
        .lines()
        .find(|l| l.ends_with(" late"))
        .map(|l| l.split(' ').next().unwrap().to_string())
        .unwrap();
    let out = logs(&up, &["sincer", &format!("--since-time={late_ts}")]);
    assert_eq!(text(&out.stdout), "late\n", "{out:?}");
    let out = logs(&up, &["sincer", "--limit-bytes", "3"]);
    assert_eq!(text(&out.stdout), "ear", "{out:?}");

    // --previous: upstream's error before any restart, the last run's output after one.
    let out = logs(&up, &["talker", "--previous"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr)
            .contains("previous terminated container \"c\" in pod \"talker\" not found"),
        "{}",
        text(&out.stderr)
    );
    wait_for("crasher restarted", || {
        let n = up.ok(&[
            "get",
            "pod",
            "crasher",
            "-o",
            "jsonpath={.status.containerStatuses[0].restartCount}",
        ]);
        (n.parse::<u32>().unwrap_or(0) >= 1).then_some(n)
    });
    let out = logs(&up, &["crasher", "--previous"]);
    assert!(out.status.success(), "{out:?}");
    assert!(text(&out.stdout).starts_with("started "), "{out:?}");

    // attach: output as it is written, and -i into the container's stdin.
    let mut attach = Command::new(KUBECTL)
        .env("KUBECONFIG", up.kubeconfig())
        .args(["attach", "talker"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(attach.stdout.take().unwrap());
    let seen = read_until(&mut out, "attach", |l| {
        l.iter().filter(|x| x.starts_with("line ")).count() >= 2
    });
    assert!(seen.iter().any(|l| l.starts_with("line ")), "{seen:?}");
    attach.kill().unwrap();
    let _ = attach.wait();

    let mut attach = Command::new(KUBECTL)
        .env("KUBECONFIG", up.kubeconfig())
        .args(["attach", "-i", "echoer"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut input = attach.stdin.take().unwrap();
    let mut out = BufReader::new(attach.stdout.take().unwrap());
    // Input written before the stream is up waits in kubectl; write again until echoed.
    let deadline = Instant::now() + Duration::from_secs(15);
    let echoed = loop {
        input.write_all(b"hello\n").unwrap();
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        if line.contains("got:hello") {
            break line;
        }
        assert!(Instant::now() < deadline, "no echo: {line:?}");
    };
    assert_eq!(echoed.trim_end(), "got:hello");
    attach.kill().unwrap();
    let _ = attach.wait();
    // attach -it to a container with `tty: true`: it runs on a terminal, which takes the
    // client's size.
    wait_for("ttysh running", || {
        let phase = up.ok(&["get", "pod", "ttysh", "-o", "jsonpath={.status.phase}"]);
        (phase == "Running").then_some(phase)
    });
    let script = format!(
        "stty rows 19 cols 66; KUBECONFIG={} {KUBECTL} attach -it ttysh",
        up.kubeconfig().display()
    );
    let mut term = Command::new("script")
        .args(["-qec", &script, "/dev/null"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut keys = term.stdin.take().unwrap();
    let mut screen = term.stdout.take().unwrap();
    let (seen_tx, seen) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut all = Vec::new();
        let mut buf = [0u8; 4096];
        while let Ok(n) = std::io::Read::read(&mut screen, &mut buf) {
            if n == 0 {
                break;
            }
            all.extend_from_slice(&buf[..n]);
            let _ = seen_tx.send(text(&all));
        }
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut shown = String::new();
    while !(shown.contains("/dev/pts/") && shown.contains("19 66")) {
        assert!(Instant::now() < deadline, "no terminal in ttysh: {shown:?}");
        let _ = keys.write_all(b"tty; stty size\n");
        if let Ok(s) = seen.recv_timeout(Duration::from_secs(1)) {
            shown = s;
        }
    }
    let _ = term.kill();
    let _ = term.wait();

    // kubectl 1.29 speaks SPDY for exec and attach: output, exit codes, stdin to its end, a
    // terminal with its size, and attach -i.
    let old = "/usr/lib/google-cloud-sdk/bin/kubectl.1.29";
    let run = |args: &[&str]| {
        Command::new(old)
            .env("KUBECONFIG", up.kubeconfig())
            .args(args)
            .output()
            .unwrap()
    };
    let out = run(&[
        "exec",
        "talker",
        "--",
        "sh",
        "-c",
        "echo out; echo err >&2; exit 3",
    ]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert_eq!(text(&out.stdout), "out\n");
    assert!(text(&out.stderr).contains("err"), "{out:?}");
    let mut child = Command::new(old)
        .env("KUBECONFIG", up.kubeconfig())
        .args(["exec", "-i", "talker", "--", "sh", "-c", "cat; echo done"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"over spdy\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(text(&out.stdout), "over spdy\ndone\n", "{out:?}");
    assert!(out.status.success());
    let script = format!(
        "stty rows 21 cols 77; KUBECONFIG={} {old} exec -it talker -- sh -c 'tty; stty size; exit 5'",
        up.kubeconfig().display()
    );
    let out = Command::new("script")
        .args(["-qec", &script, "/dev/null"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let shown = text(&out.stdout);
    assert!(
        shown.contains("/dev/pts/") && shown.contains("21 77"),
        "{shown:?}"
    );
    assert_eq!(out.status.code(), Some(5), "{shown:?}");
    let mut attach = Command::new(old)
        .env("KUBECONFIG", up.kubeconfig())
        .args(["attach", "-i", "echoer"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut input = attach.stdin.take().unwrap();
    let mut out = BufReader::new(attach.stdout.take().unwrap());
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        input.write_all(b"spdy\n").unwrap();
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        if line.contains("got:spdy") {
            break;
        }
        assert!(Instant::now() < deadline, "no echo over SPDY: {line:?}");
    }
    attach.kill().unwrap();
    let _ = attach.wait();

    // kubectl cp (tar over exec) both ways over SPDY. The pod sees the host's file system.
    let dir = tempfile::tempdir().unwrap();
    let (src, back) = (dir.path().join("src.txt"), dir.path().join("back.txt"));
    std::fs::write(&src, "copied over spdy\n").unwrap();
    let in_pod = format!("talker:{}/in-pod.txt", dir.path().display());
    let out = run(&["cp", src.to_str().unwrap(), &in_pod]);
    assert!(out.status.success(), "cp into the pod: {out:?}");
    let out = run(&["cp", &in_pod, back.to_str().unwrap()]);
    assert!(out.status.success(), "cp out of the pod: {out:?}");
    assert_eq!(
        std::fs::read_to_string(&back).unwrap(),
        "copied over spdy\n"
    );

    // A SPDY client that goes away mid-stream takes its process with it.
    let marker = "302.456";
    let mut child = Command::new(old)
        .env("KUBECONFIG", up.kubeconfig())
        .args(["exec", "talker", "--", "sleep", marker])
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
        assert!(
            Instant::now() < deadline,
            "the process outlived its SPDY client"
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    // Detaching leaves the container running, its output in the log.
    assert!(text(&logs(&up, &["echoer"]).stdout).contains("got:hello"));
    let phase = up.ok(&["get", "pod", "echoer", "-o", "jsonpath={.status.phase}"]);
    assert_eq!(phase, "Running");
    net.stop(&mut up);
}
