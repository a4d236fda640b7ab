//! The real kubectl against a test server: one binary, one kubeconfig, optional stdin and
//! environment.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

pub const KUBECTL_1_33: &str = "/usr/lib/google-cloud-sdk/bin/kubectl.1.33";
pub const KUBECTL_1_27: &str = "/usr/lib/google-cloud-sdk/bin/kubectl.1.27";

pub struct Kubectl {
    pub bin: &'static str,
    pub kubeconfig: PathBuf,
    pub env: Vec<(String, String)>,
}

pub struct Out {
    pub ok: bool,
    pub stdout: String,
    pub stderr: String,
}

impl Kubectl {
    pub fn new(bin: &'static str, kubeconfig: &Path) -> Kubectl {
        assert!(Path::new(bin).exists(), "{bin} is missing");
        Kubectl {
            bin,
            kubeconfig: kubeconfig.to_path_buf(),
            env: Vec::new(),
        }
    }

    /// The command, with this kubeconfig and environment, not started.
    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(self.bin);
        c.args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("HOME", self.kubeconfig.parent().unwrap())
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        c
    }

    pub fn run(&self, args: &[&str], stdin: Option<&str>) -> Out {
        let mut child = self
            .cmd(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("kubectl runs");
        if let Some(input) = stdin {
            child
                .stdin
                .take()
                .unwrap()
                .write_all(input.as_bytes())
                .unwrap();
        }
        drop(child.stdin.take());
        let out = child.wait_with_output().unwrap();
        Out {
            ok: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// Runs and asserts success; the standard output.
    pub fn ok(&self, args: &[&str]) -> String {
        self.ok_in(args, None)
    }

    /// Runs with `stdin` and asserts success; the standard output.
    pub fn ok_in(&self, args: &[&str], stdin: Option<&str>) -> String {
        let o = self.run(args, stdin);
        assert!(
            o.ok,
            "{} {args:?} failed:\n{}\n{}",
            self.bin, o.stdout, o.stderr
        );
        o.stdout
    }

    /// Runs and asserts failure; the standard error.
    pub fn fails(&self, args: &[&str]) -> String {
        self.fails_with(args, None)
    }

    /// Runs with `stdin` and asserts failure; the standard error.
    pub fn fails_in(&self, args: &[&str], stdin: &str) -> String {
        self.fails_with(args, Some(stdin))
    }

    fn fails_with(&self, args: &[&str], stdin: Option<&str>) -> String {
        let o = self.run(args, stdin);
        assert!(!o.ok, "{} {args:?} should fail:\n{}", self.bin, o.stdout);
        o.stderr
    }

    /// `kubectl <args…> -o json`, parsed.
    pub fn json(&self, args: &[&str]) -> Value {
        let mut all = args.to_vec();
        all.extend(["-o", "json"]);
        serde_json::from_str(&self.ok(&all)).unwrap()
    }

    /// `kubectl get <what…> -o json`, parsed.
    pub fn get_json(&self, what: &[&str]) -> Value {
        let args: Vec<&str> = std::iter::once("get").chain(what.iter().copied()).collect();
        self.json(&args)
    }
}
