//! The README is a contract (needs root): its worked example is run as written, from a
//! directory of its own laid out like a fresh clone, with the default data dir. The commands
//! come from the README itself: every ```` ```sh ```` block of the "Worked example" section, in
//! order, in one shell; the ```` ```text ```` block after each is what it must print, compared
//! by shape (see [`shape`]): pod names, pod IPs, ages, counts and client ports vary from run to
//! run, everything else (cluster IPs, node ports, headers, the number of lines) must be as the
//! README shows. A README edit that breaks the example fails this test.
//!
//! What the test changes, and only this: `scripts/up.sh` runs the binary this test was built
//! with (`SVCNET_BIN`) instead of building a release one, the background `up.sh` line writes
//! its log to a file, and cluster DNS gets a closed upstream (`SVCNET_DNS_UPSTREAM`), so that
//! the ExternalName lookup never leaves the machine. Everything else uses the README's
//! defaults (API 127.0.0.1:6443, DNS 127.0.0.1:1053, underlay 172.30.0.0/24, service CIDR
//! 10.96.0.0/12, pod CIDR 10.244.0.0/16, prefix `svcnet`), which no other test uses.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{free_udp_port, is_root};

/// One ```` ```sh ```` block and the ```` ```text ```` block after it.
#[derive(Debug)]
struct Step {
    commands: String,
    expected: Option<String>,
}

/// The README's worked example: its sh blocks with their expected output.
fn worked_example(readme: &str) -> Vec<Step> {
    let start = readme
        .find("\n## Worked example")
        .expect("the README has a '## Worked example' section");
    let rest = &readme[start + 1..];
    let end = rest[3..].find("\n## ").map_or(rest.len(), |i| i + 3);
    let section = &rest[..end];
    let mut steps: Vec<Step> = Vec::new();
    let mut lines = section.lines();
    while let Some(line) = lines.next() {
        let kind = match line.trim_end() {
            "```sh" => "sh",
            "```text" => "text",
            _ => continue,
        };
        let mut body = String::new();
        for l in lines.by_ref() {
            if l.trim_end() == "```" {
                break;
            }
            body.push_str(l);
            body.push('\n');
        }
        match kind {
            "sh" => steps.push(Step {
                commands: body,
                expected: None,
            }),
            _ => {
                let last = steps.last_mut().expect("a text block follows an sh block");
                assert!(
                    last.expected.is_none(),
                    "two text blocks after one sh block"
                );
                last.expected = Some(body);
            }
        }
    }
    steps
}

/// A line of output reduced to what must not vary between runs. Tokens are whitespace-split;
/// within a token, parts split at `,` `=` `:` and `/` are classed separately:
/// - a pod name with a ReplicaSet hash (`myapp-deploy-84f7699f48-cd7ls`) keeps its prefix;
/// - an address in the pod CIDR 10.244.0.0/16 becomes `10.244.N.H`, keeping `.1` (a node's
///   bridge, the masquerade address) as it is;
/// - a node name keeps `svcnet-node`; an age (`7s`, `2m10s`) and a token that is only a
///   number (a count, RESTARTS) become `N`; numbers inside a token (ports) stay;
/// - the address after `client=` is `POD` (a pod's own address) or `NODE` (a node's bridge or
///   underlay address, or the host's: masqueraded or routed from outside the pod network),
///   and its port, an ephemeral one, `P`;
/// - a node's underlay address 172.30.0.x becomes `172.30.0.N`.
///
/// Everything else (cluster IPs, LB IPs, node ports, words, headers) is compared as it is.
fn shape(line: &str) -> String {
    line.split_whitespace()
        .map(|tok| {
            if tok.bytes().all(|b| b.is_ascii_digit()) {
                return "N".to_string();
            }
            if let Some(addr) = tok.strip_prefix("client=") {
                let ip = addr.rsplit_once(':').map_or(addr, |(ip, _)| ip);
                let who = match class(ip).as_str() {
                    "10.244.N.H" => "POD",
                    _ => "NODE",
                };
                return format!("client={who}:P");
            }
            let mut out = String::new();
            let mut part = String::new();
            for c in tok.chars().chain(std::iter::once('\0')) {
                if matches!(c, ',' | '=' | ':' | '/' | '\0') {
                    out.push_str(&class(&part));
                    part.clear();
                    if c != '\0' {
                        out.push(c);
                    }
                } else {
                    part.push(c);
                }
            }
            out
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn class(part: &str) -> String {
    let is_num = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if is_age(part) {
        return "N".into();
    }
    if let Some(rest) = part.strip_prefix("10.244.") {
        let octets: Vec<&str> = rest.split('.').collect();
        if octets.len() == 2 && octets.iter().all(|o| is_num(o)) {
            let host = if octets[1] == "1" { "1" } else { "H" };
            return format!("10.244.N.{host}");
        }
    }
    if let Some(host) = part.strip_prefix("172.30.0.")
        && is_num(host)
    {
        return "172.30.0.N".into();
    }
    if let Some(n) = part.strip_prefix("svcnet-node")
        && is_num(n)
    {
        return "svcnet-nodeN".into();
    }
    let segs: Vec<&str> = part.rsplitn(3, '-').collect();
    if segs.len() == 3 && segs[0].len() == 5 && (6..=10).contains(&segs[1].len()) {
        let alnum = |s: &str| {
            s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        };
        if alnum(segs[0]) && alnum(segs[1]) {
            return format!("{}-HASH-ID", segs[2]);
        }
    }
    part.to_string()
}

/// `7s`, `12m`, `2m10s`, `3h`, `4d`.
fn is_age(s: &str) -> bool {
    let mut digits = false;
    let mut any_unit = false;
    for c in s.chars() {
        if c.is_ascii_digit() {
            digits = true;
        } else if matches!(c, 's' | 'm' | 'h' | 'd') && digits {
            digits = false;
            any_unit = true;
        } else {
            return false;
        }
    }
    any_unit && !digits
}

/// The sum of a block's `uniq -c` counts (lines that start with blanks and a number): shapes
/// turn each count into `N`, so this is what says that all 30 requests of the README's
/// load-balancing step were answered, not only that each pod answered some.
fn tally(text: &str) -> u64 {
    text.lines()
        .filter(|l| l.starts_with(' '))
        .filter_map(|l| l.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// The shapes of a block's lines, sorted: tables and `sort`ed output may order rows by names
/// that vary from run to run, so rows are compared as a multiset.
fn shapes(text: &str) -> Vec<String> {
    let mut v: Vec<String> = text.lines().map(shape).filter(|l| !l.is_empty()).collect();
    v.sort();
    v
}

/// A directory laid out like a fresh clone for what the walkthrough touches: `scripts/`,
/// `examples/` and `target/release/svcnet` (this test's binary).
fn fresh_checkout(repo: &Path) -> tempfile::TempDir {
    fn copy_tree(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        for entry in std::fs::read_dir(from).unwrap() {
            let entry = entry.unwrap();
            let target = to.join(entry.file_name());
            if entry.file_type().unwrap().is_dir() {
                copy_tree(&entry.path(), &target);
            } else {
                std::fs::copy(entry.path(), target).unwrap();
            }
        }
    }
    let dir = tempfile::tempdir().unwrap();
    for sub in ["scripts", "examples"] {
        copy_tree(&repo.join(sub), &dir.path().join(sub));
    }
    let release = dir.path().join("target/release");
    std::fs::create_dir_all(&release).unwrap();
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_svcnet"), release.join("svcnet")).unwrap();
    dir
}

/// Stops the background `svcnet up` (as Ctrl-C does) and runs `svcnet down`, whatever happened.
struct Teardown {
    pid_file: PathBuf,
    data_dir: PathBuf,
}

impl Teardown {
    fn stop(&self) -> Option<bool> {
        let pid = std::fs::read_to_string(&self.pid_file).ok()?;
        let pid = pid.trim().to_string();
        let _ = Command::new("kill").args(["-INT", &pid]).status();
        let deadline = Instant::now() + Duration::from_secs(60);
        while Path::new(&format!("/proc/{pid}")).exists() {
            if Instant::now() > deadline {
                let _ = Command::new("kill").args(["-KILL", &pid]).status();
                return Some(false);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = std::fs::remove_file(&self.pid_file);
        Some(true)
    }
}

impl Drop for Teardown {
    fn drop(&mut self) {
        self.stop();
        let _ = Command::new(env!("CARGO_BIN_EXE_svcnet"))
            .args(["down", "--data-dir"])
            .arg(&self.data_dir)
            .stdout(Stdio::null())
            .status();
    }
}

/// What `svcnet up` (prefix `svcnet`, the README's ranges) has on the host.
fn leftovers() -> Vec<String> {
    let mut found = Vec::new();
    for args in [&["netns", "list"][..], &["-o", "link"][..], &["route"][..]] {
        let out = Command::new("ip").args(args).output().unwrap();
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let ours = line.starts_with("svcnet-")
                || line.contains(" svcnet0")
                || ["172.30.0.", "10.96.0.0/12", "10.244.", "10.200.0."]
                    .iter()
                    .any(|s| line.contains(s));
            if ours {
                found.push(line.to_string());
            }
        }
    }
    found
}

#[test]
fn the_readme_worked_example_runs_as_written() {
    if !is_root() {
        eprintln!("skipped: needs root (CI runs as root)");
        return;
    }
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let readme = std::fs::read_to_string(repo.join("README.md")).unwrap();
    let steps = worked_example(&readme);
    assert!(
        steps.len() >= 5,
        "the worked example has too few sh blocks: {steps:?}"
    );
    let before = leftovers();
    assert!(
        before.is_empty(),
        "svcnet's default ranges are in use on this host: {before:?}"
    );

    let checkout = fresh_checkout(&repo);
    let root = checkout.path();
    let pid_file = root.join("up.pid");
    let _teardown = Teardown {
        pid_file: pid_file.clone(),
        data_dir: root.join("svcnet-data"),
    };
    // One shell runs every block in order; markers separate the blocks' output.
    let mut script = String::from("exec 2>&1\n");
    for (i, step) in steps.iter().enumerate() {
        script.push_str(&format!("echo '@@step {i}@@'\n"));
        for line in step.commands.lines() {
            let code = line.split(" #").next().unwrap_or("").trim_end();
            if let Some(bg) = code.strip_suffix('&') {
                // The background start: its log to a file, its pid for the teardown.
                script.push_str(&format!("{bg} > up.log 2>&1 &\necho $! > up.pid\n"));
            } else {
                script.push_str(line);
                script.push('\n');
            }
        }
    }
    script.push_str("echo '@@end@@'\n");
    let upstream = free_udp_port(); // closed: no DNS question leaves the machine
    let mut child = Command::new("bash")
        .arg("-c")
        .arg(&script)
        .current_dir(root)
        .env_remove("KUBECONFIG")
        .env("SVCNET_BIN", env!("CARGO_BIN_EXE_svcnet"))
        .env("SVCNET_DNS_UPSTREAM", upstream.to_string())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // Bounded: the walkthrough takes about a minute.
    let deadline = Instant::now() + Duration::from_secs(420);
    let out = loop {
        if child.try_wait().unwrap().is_some() {
            break child.wait_with_output().unwrap();
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "the walkthrough did not finish in 7 minutes; it printed:\n{}\nsvcnet up's log:\n{}",
                String::from_utf8_lossy(&out.stdout),
                std::fs::read_to_string(root.join("up.log")).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let log = || std::fs::read_to_string(root.join("up.log")).unwrap_or_default();
    assert!(
        text.contains("@@end@@"),
        "the walkthrough stopped early:\n{text}\nlog:\n{}",
        log()
    );
    for (i, step) in steps.iter().enumerate() {
        let begin = format!("@@step {i}@@\n");
        let from = text.find(&begin).unwrap() + begin.len();
        let to = text[from..].find("@@").map_or(text.len(), |j| from + j);
        let got = &text[from..to];
        let want = step.expected.as_deref().unwrap_or("");
        assert_eq!(
            shapes(got),
            shapes(want),
            "step {i} printed something else than the README shows.\ncommands:\n{}\nprinted:\n{got}\nREADME:\n{want}\nsvcnet up's log (tail):\n{}",
            step.commands,
            log().lines().rev().take(30).collect::<Vec<_>>().join("\n")
        );
        assert_eq!(
            tally(got),
            tally(want),
            "step {i}: the counts add up to something else than the README's (requests without an answer?).\ncommands:\n{}\nprinted:\n{got}",
            step.commands
        );
    }
    // The default data dir, relative, under the directory up.sh ran from.
    assert!(root.join("svcnet-data/kubeconfig").exists());
    // Ctrl-C stops it and it removes everything it made.
    assert_eq!(
        _teardown.stop(),
        Some(true),
        "svcnet up did not stop on SIGINT"
    );
    let after = leftovers();
    assert!(after.is_empty(), "left behind: {after:?}");
}

#[test]
fn shapes_keep_what_must_not_vary() {
    assert_eq!(
        shape(
            "myapp-deploy-84f7699f48-cd7ls   1/1     Running   0          7s    10.244.1.3   svcnet-node1"
        ),
        "myapp-deploy-HASH-ID 1/1 Running N N 10.244.N.H svcnet-nodeN"
    );
    assert_eq!(
        shape("pod=myapp-deploy-84f7699f48-cd7ls ip=10.244.1.3 client=10.244.1.1:51703"),
        "pod=myapp-deploy-HASH-ID ip=10.244.N.H client=NODE:P"
    );
    assert_eq!(
        shape("pod=web-0 ip=10.244.1.3 client=172.30.0.2:6157"),
        shape("pod=web-1 ip=10.244.2.3 client=10.244.2.1:1").replace("web-1", "web-0")
    );
    assert_eq!(
        shape("pod=a ip=10.244.1.3 client=10.244.2.2:60740"),
        "pod=a ip=10.244.N.H client=POD:P"
    );
    assert_eq!(
        shape("myapp   10.244.1.2:80,10.244.1.3:80,10.244.2.2:80   7s"),
        "myapp 10.244.N.H:80,10.244.N.H:80,10.244.N.H:80 N"
    );
    assert_eq!(
        shape(
            "myapp-loadbalance   LoadBalancer   10.96.1.1    10.200.0.1      8765:30086/TCP   7s"
        ),
        "myapp-loadbalance LoadBalancer 10.96.1.1 10.200.0.1 8765:30086/TCP N"
    );
    assert_eq!(shape("     11 pod=web-0"), "N pod=web-0");
    assert_eq!(tally("     11 pod=a\n      9 pod=b\n     10 pod=c\n"), 30);
    assert_eq!(
        tally("      8 pod=a\n     11 pod=b\n      5 pod=c\nNAME   READY\n"),
        24,
        "six requests without an answer must not look like the README's 30"
    );
    assert_eq!(
        shape("MYAPP_SERVICE_HOST=10.96.1.0"),
        "MYAPP_SERVICE_HOST=10.96.1.0"
    );
    assert_ne!(
        shape("10.96.1.0"),
        shape("10.96.1.1"),
        "cluster IPs are compared as they are"
    );
    assert_ne!(
        shapes("a\nb\n"),
        shapes("a\n"),
        "the number of lines is part of the shape"
    );
}

#[test]
fn the_worked_example_is_found() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let readme = std::fs::read_to_string(repo.join("README.md")).unwrap();
    let steps = worked_example(&readme);
    assert!(steps.len() >= 5, "{steps:?}");
    assert!(
        steps[0].commands.contains("./scripts/up.sh"),
        "{:?}",
        steps[0]
    );
    assert!(
        steps.iter().all(|s| s.expected.is_some()),
        "every sh block shows its output"
    );
    // The run command: it names the package and binary to run (a bare `cargo run` is
    // ambiguous in this workspace, which also builds the agent's test server).
    let up = std::fs::read_to_string(repo.join("scripts/up.sh")).unwrap();
    let cargo = up
        .lines()
        .find(|l| l.trim_start().starts_with("exec cargo run"))
        .expect("up.sh runs cargo");
    assert!(
        cargo.contains("-p svcnet") && cargo.contains("--bin svcnet"),
        "{cargo}"
    );
}
