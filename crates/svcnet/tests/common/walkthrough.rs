//! The README's worked example as a test harness (needs root): its sh blocks run as written,
//! from a directory of its own laid out like a fresh clone, with the default data dir; the
//! text block after each is what it must print, compared by shape (see [`shape`]). Used by
//! `readme.rs` (the README as written, with svcnet's built-in proxy and DNS) and
//! `e2e_addon.rs` (the same walkthrough with the proxy and DNS as the add-on's pods).
//!
//! What the harness changes, and only this: `scripts/up.sh` runs the binary the test was
//! built with (`SVCNET_BIN`) instead of building a release one, the background `up.sh` line
//! writes its log to a file, and cluster DNS gets a closed upstream (`SVCNET_DNS_UPSTREAM`),
//! so that the ExternalName lookup never leaves the machine. Everything else uses the
//! README's defaults (API 127.0.0.1:6443, DNS 127.0.0.1:1053, underlay 172.30.0.0/24, service
//! CIDR 10.96.0.0/12, pod CIDR 10.244.0.0/16, prefix `svcnet`), which only these tests use;
//! they run one at a time (nextest's `whole-system` group).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::free_udp_port;

/// One ```` ```sh ```` block and the ```` ```text ```` block after it.
#[derive(Debug)]
pub struct Step {
    pub commands: String,
    pub expected: Option<String>,
}

/// The README's worked example: its sh blocks with their expected output.
pub fn worked_example(readme: &str) -> Vec<Step> {
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
/// - the address after `client=` is `POD` (a pod's own address) or `NODE` (a node's bridge,
///   VTEP or underlay address, or the host's: masqueraded or routed from outside the pod
///   network; over flannel's VXLAN a node reaches other nodes' pods from its VTEP's `.0`), and
///   its port, an ephemeral one, `P`;
/// - a node's underlay address 172.30.0.x becomes `172.30.0.N`.
///
/// Everything else (cluster IPs, LB IPs, node ports, words, headers) is compared as it is.
pub fn shape(line: &str) -> String {
    line.split_whitespace()
        .map(|tok| {
            if tok.bytes().all(|b| b.is_ascii_digit()) {
                return "N".to_string();
            }
            if let Some(addr) = tok.strip_prefix("client=") {
                let ip = addr.rsplit_once(':').map_or(addr, |(ip, _)| ip);
                let who = match class(ip).as_str() {
                    "10.244.N.H" if !ip.ends_with(".0") => "POD",
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

pub fn class(part: &str) -> String {
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
pub fn is_age(s: &str) -> bool {
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
pub fn tally(text: &str) -> u64 {
    text.lines()
        .filter(|l| l.starts_with(' '))
        .filter_map(|l| l.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// The shapes of a block's lines, sorted: tables and `sort`ed output may order rows by names
/// that vary from run to run, so rows are compared as a multiset.
pub fn shapes(text: &str) -> Vec<String> {
    let mut v: Vec<String> = text.lines().map(shape).filter(|l| !l.is_empty()).collect();
    v.sort();
    v
}

/// A directory laid out like a fresh clone for what the walkthrough touches: `scripts/`,
/// `examples/`, `deploy/` and `target/release/svcnet` (this test's binary).
pub fn fresh_checkout(repo: &Path) -> tempfile::TempDir {
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
    for sub in ["scripts", "examples", "deploy"] {
        copy_tree(&repo.join(sub), &dir.path().join(sub));
    }
    let release = dir.path().join("target/release");
    std::fs::create_dir_all(&release).unwrap();
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_svcnet"), release.join("svcnet")).unwrap();
    dir
}

/// Stops the background `svcnet up` (as Ctrl-C does) and runs `svcnet down`, whatever happened.
pub struct Teardown {
    pub pid_file: PathBuf,
    pub data_dir: PathBuf,
}

impl Teardown {
    pub fn stop(&self) -> Option<bool> {
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
pub fn leftovers() -> Vec<String> {
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

/// A README walkthrough that ran to its end, its `svcnet up` still running (stopped, and
/// `svcnet down` run, on drop).
pub struct Ran {
    pub teardown: Teardown,
    pub checkout: tempfile::TempDir,
}

impl Ran {
    pub fn root(&self) -> &Path {
        self.checkout.path()
    }

    /// `svcnet up`'s log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.root().join("up.log")).unwrap_or_default()
    }

    /// Runs `script` with bash in the checkout, with the walkthrough's kubeconfig and PATH:
    /// its output (stdout and stderr together) and whether it succeeded.
    pub fn sh(&self, script: &str) -> (bool, String) {
        let root = self.root();
        let path = format!(
            "{}:{}",
            root.join("target/release").display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let out = Command::new("bash")
            .arg("-c")
            .arg(format!("exec 2>&1\n{script}"))
            .current_dir(root)
            .env("KUBECONFIG", root.join("svcnet-data/kubeconfig"))
            .env("PATH", path)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    }

    /// [`Ran::sh`] that must succeed.
    pub fn ok(&self, script: &str) -> String {
        let (ok, out) = self.sh(script);
        assert!(ok, "{script} failed:\n{out}");
        out
    }
}

/// Runs the README's worked example from a fresh checkout with the default data dir, each
/// sh block's commands passed through `edit` (its index and text) first, and checks every
/// block's output against the README's by shape. Panics on any difference.
pub fn run_worked_example(edit: impl Fn(usize, &str) -> String) -> Ran {
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
    let root_dir = checkout.path().to_path_buf();
    let root = root_dir.as_path();
    let pid_file = root.join("up.pid");
    let teardown = Teardown {
        pid_file: pid_file.clone(),
        data_dir: root.join("svcnet-data"),
    };
    // One shell runs every block in order; markers separate the blocks' output.
    let mut script = String::from("exec 2>&1\n");
    for (i, step) in steps.iter().enumerate() {
        script.push_str(&format!("echo '@@step {i}@@'\n"));
        for line in edit(i, &step.commands).lines() {
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
            edit(i, &step.commands),
            log().lines().rev().take(30).collect::<Vec<_>>().join("\n")
        );
        assert_eq!(
            tally(got),
            tally(want),
            "step {i}: the counts add up to something else than the README's (requests without an answer?).\ncommands:\n{}\nprinted:\n{got}",
            edit(i, &step.commands)
        );
    }
    Ran { teardown, checkout }
}
