//! The runtime's side of CNI, as a kubelet's container runtime drives a plugin (libcni): a
//! network configuration list, each plugin of it called with the `CNI_*` environment and its
//! configuration on stdin (the list's `name` and `cniVersion` added, and `prevResult` from the
//! plugin before), ADD in order and DEL in reverse, the last ADD result cached so that CHECK and
//! DEL get it as `prevResult`, and a failing plugin's error object read back from its stdout.
//!
//! The agent calls the pod network through this, so its pods take the same path a kubelet's
//! would: [`Plugin::Binary`] executes a plugin program (`svcnet` itself, which turns into the
//! plugin when started with `CNI_COMMAND` set and no arguments); [`Plugin::InProcess`] calls
//! [`super::invoke`] with the same environment and bytes, for tests of this crate whose own
//! executable is not svcnet.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{Value, json};

use super::types::{CniError, CniResult, ErrorCode, NetConf};
use super::{Invocation, invoke};

/// How a plugin of the list is run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plugin {
    /// This crate's plugin, called in process through [`super::invoke`].
    InProcess,
    /// A plugin program: executed for every call, as a kubelet's runtime does.
    Binary(PathBuf),
}

impl Plugin {
    /// Runs one call: `env` and `stdin` in, stdout out; a non-zero exit is the plugin's error
    /// object, decoded.
    fn call(&self, env: &BTreeMap<String, String>, stdin: &[u8]) -> Result<String, CniError> {
        let (stdout, code, stderr) = match self {
            Plugin::InProcess => {
                let (out, code) = invoke(env, stdin);
                (out, code, String::new())
            }
            Plugin::Binary(path) => run_binary(path, env, stdin)?,
        };
        if code == 0 {
            return Ok(stdout);
        }
        Err(decode_error(&stdout, &stderr, code))
    }
}

fn run_binary(
    path: &Path,
    env: &BTreeMap<String, String>,
    stdin: &[u8],
) -> Result<(String, i32, String), CniError> {
    let spawn_err = |e: std::io::Error| {
        CniError::new(
            ErrorCode::Io,
            format!("cannot run the CNI plugin {}", path.display()),
        )
        .with_details(e.to_string())
    };
    // The plugin gets the CNI variables and nothing of ours that could change its mode.
    let mut child = Command::new(path)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .envs(env)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(spawn_err)?;
    if let Some(mut input) = child.stdin.take() {
        // A plugin may exit without reading its stdin (a crash, `false`): its exit status and
        // output say what happened, not the broken pipe.
        match input.write_all(stdin) {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
            other => other.map_err(spawn_err)?,
        }
    }
    let out = child.wait_with_output().map_err(spawn_err)?;
    Ok((
        String::from_utf8_lossy(&out.stdout).into_owned(),
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).trim().to_string(),
    ))
}

/// The SPEC's error object from a failed plugin's stdout; a plugin that printed none (it
/// crashed, or is not a CNI plugin) is reported with its exit code and stderr.
fn decode_error(stdout: &str, stderr: &str, code: i32) -> CniError {
    let object: Option<Value> = serde_json::from_str(stdout).ok();
    let field = |k: &str| {
        object
            .as_ref()
            .and_then(|o| o.get(k))
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    match (
        object
            .as_ref()
            .and_then(|o| o.get("code"))
            .and_then(Value::as_u64),
        field("msg"),
    ) {
        (Some(c), Some(msg)) => match ErrorCode::from_wire(c) {
            Some(code) => CniError::new(code, msg),
            // Another plugin's own code: kept in the message.
            None => CniError::new(ErrorCode::Io, format!("CNI error {c}: {msg}")),
        }
        .with_details(field("details").unwrap_or_default()),
        _ => CniError::new(
            ErrorCode::Io,
            format!("the CNI plugin failed (exit code {code}) without an error object"),
        )
        .with_details(if stderr.is_empty() { stdout } else { stderr }.to_string()),
    }
}

/// A network configuration list (`*.conflist`) and where its runtime keeps results.
#[derive(Debug, Clone)]
pub struct NetworkList {
    pub cni_version: String,
    pub name: String,
    /// Each plugin's configuration, in order (their `type` names the plugin).
    pub plugins: Vec<Value>,
    /// Where the last ADD result of each attachment is cached (libcni's
    /// `/var/lib/cni/results`).
    pub cache_dir: PathBuf,
}

impl NetworkList {
    /// The list with one plugin: `conf`, this crate's plugin.
    pub fn single(conf: &NetConf, cache_dir: PathBuf) -> Result<Self, CniError> {
        let mut plugin = serde_json::to_value(conf).map_err(|e| {
            CniError::new(ErrorCode::Io, "cannot encode the plugin configuration")
                .with_details(e.to_string())
        })?;
        if let Some(obj) = plugin.as_object_mut() {
            obj.remove("cniVersion");
            obj.remove("name");
            obj.remove("prevResult");
        }
        Ok(Self {
            cni_version: conf.cni_version.clone(),
            name: conf.name.clone(),
            plugins: vec![plugin],
            cache_dir,
        })
    }

    /// The `.conflist` file's JSON.
    pub fn to_json(&self) -> Value {
        json!({"cniVersion": self.cni_version, "name": self.name, "plugins": self.plugins})
    }

    /// What plugin `index` reads on stdin: its configuration with the list's name and
    /// version, and `prevResult` when there is one.
    fn stdin_for(&self, index: usize, prev: Option<&Value>) -> Vec<u8> {
        let mut conf = self.plugins[index].clone();
        if let Some(obj) = conf.as_object_mut() {
            obj.insert("cniVersion".into(), json!(self.cni_version));
            obj.insert("name".into(), json!(self.name));
            match prev {
                Some(p) => obj.insert("prevResult".into(), p.clone()),
                None => obj.remove("prevResult"),
            };
        }
        conf.to_string().into_bytes()
    }

    fn env(&self, command: &str, inv: &Invocation) -> BTreeMap<String, String> {
        let netns = if inv.netns.is_empty() {
            String::new()
        } else {
            inv.netns_path()
        };
        [
            ("CNI_COMMAND", command.to_string()),
            ("CNI_CONTAINERID", inv.container_id.clone()),
            ("CNI_NETNS", netns),
            ("CNI_IFNAME", inv.ifname.clone()),
            ("CNI_PATH", String::new()),
        ]
        .into_iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    fn cache_path(&self, inv: &Invocation) -> PathBuf {
        self.cache_dir
            .join(format!("{}-{}-{}", self.name, inv.container_id, inv.ifname))
    }

    fn cached(&self, inv: &Invocation) -> Option<Value> {
        let bytes = std::fs::read(self.cache_path(inv)).ok()?;
        serde_json::from_slice(&bytes).ok()
    }

    /// ADD through every plugin in order; the last result is cached and returned. A failing
    /// plugin makes the runtime DEL what the list set up, as the SPEC asks.
    pub fn add(&self, plugin: &Plugin, inv: &Invocation) -> Result<CniResult, CniError> {
        let env = self.env("ADD", inv);
        let mut prev: Option<Value> = None;
        for index in 0..self.plugins.len() {
            let out = match plugin.call(&env, &self.stdin_for(index, prev.as_ref())) {
                Ok(out) => out,
                Err(e) => {
                    let _ = self.del(plugin, inv);
                    return Err(e);
                }
            };
            prev = Some(serde_json::from_str(&out).map_err(|e| {
                CniError::new(ErrorCode::Decode, "the CNI plugin's ADD result is not JSON")
                    .with_details(e.to_string())
            })?);
        }
        let result = prev.ok_or_else(|| {
            CniError::new(ErrorCode::InvalidConfig, "the network list has no plugin")
        })?;
        let typed: CniResult = serde_json::from_value(result.clone()).map_err(|e| {
            CniError::new(
                ErrorCode::Decode,
                "the CNI plugin's ADD result is malformed",
            )
            .with_details(e.to_string())
        })?;
        let path = self.cache_path(inv);
        let write = std::fs::create_dir_all(&self.cache_dir)
            .and_then(|()| std::fs::write(&path, result.to_string()));
        if let Err(e) = write {
            let _ = self.del(plugin, inv);
            return Err(CniError::new(
                ErrorCode::Io,
                format!("cannot cache the CNI result in {}", path.display()),
            )
            .with_details(e.to_string()));
        }
        Ok(typed)
    }

    /// DEL through every plugin in reverse order, with the cached result as `prevResult`;
    /// the cache entry goes last. Idempotent, as every plugin's DEL is.
    pub fn del(&self, plugin: &Plugin, inv: &Invocation) -> Result<(), CniError> {
        let env = self.env("DEL", inv);
        let prev = self.cached(inv);
        for index in (0..self.plugins.len()).rev() {
            plugin.call(&env, &self.stdin_for(index, prev.as_ref()))?;
        }
        match std::fs::remove_file(self.cache_path(inv)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(CniError::new(
                ErrorCode::Io,
                "cannot remove the cached CNI result",
            )
            .with_details(e.to_string())),
            _ => Ok(()),
        }
    }

    /// CHECK through every plugin in order, with the cached result as `prevResult`.
    pub fn check(&self, plugin: &Plugin, inv: &Invocation) -> Result<(), CniError> {
        let env = self.env("CHECK", inv);
        let prev = self.cached(inv).ok_or_else(|| {
            CniError::new(
                ErrorCode::CheckFailed,
                format!("no cached ADD result for container {}", inv.container_id),
            )
        })?;
        for index in 0..self.plugins.len() {
            plugin.call(&env, &self.stdin_for(index, Some(&prev)))?;
        }
        Ok(())
    }
}
