//! Where the agent keeps each pod's files, and finding a container's log: what `svcnet exec`
//! and a `pods/log` subresource (`kubectl logs`) read.
//!
//! Layout: `<data_dir>/agent/<node>/pods/<ns>_<name>_<uid>/` holds `pod.json` (the
//! [`crate::runtime::pod::PodRecord`]), `resolv.conf`, `hosts` and
//! `logs/<container>/<restartCount>.log` (stdout and stderr interleaved, appended as written).
//! The uid in the directory name keeps a pod recreated under the same name (a StatefulSet's
//! `web-0`) apart from its terminating predecessor.

use std::path::{Path, PathBuf};

/// The directory of one pod on one node.
pub fn pod_dir(pods_dir: &Path, namespace: &str, name: &str, uid: &str) -> PathBuf {
    pods_dir.join(format!("{namespace}_{name}_{uid}"))
}

/// Every directory of pod `namespace/name` on any node of the data dir, newest first.
pub fn find_pod_dirs(data_dir: &Path, namespace: &str, name: &str) -> Vec<PathBuf> {
    let prefix = format!("{namespace}_{name}_");
    let mut found: Vec<(std::time::SystemTime, PathBuf)> = Vec::new();
    for node in std::fs::read_dir(data_dir.join("agent"))
        .into_iter()
        .flatten()
        .flatten()
    {
        for entry in std::fs::read_dir(node.path().join("pods"))
            .into_iter()
            .flatten()
            .flatten()
        {
            let file_name = entry.file_name();
            let Some(rest) = file_name.to_str().and_then(|n| n.strip_prefix(&prefix)) else {
                continue;
            };
            // Namespaces and names cannot contain '_', uids contain no '_': an exact match.
            if rest.contains('_') {
                continue;
            }
            let modified = entry
                .metadata()
                .and_then(|m| m.modified())
                .unwrap_or(std::time::UNIX_EPOCH);
            found.push((modified, entry.path()));
        }
    }
    found.sort_by_key(|f| std::cmp::Reverse(f.0));
    found.into_iter().map(|(_, p)| p).collect()
}

/// Why a log cannot be served.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LogError {
    #[error("pod {0} has no logs on this machine")]
    NoPod(String),
    #[error("a container name must be specified for pod {pod}, choose one of: [{}]", containers.join(" "))]
    ChooseContainer {
        pod: String,
        containers: Vec<String>,
    },
    #[error("container {container:?} in pod {pod} has no logs")]
    NoContainer { pod: String, container: String },
    /// Upstream's words, which name the pod without its namespace.
    #[error("previous terminated container {container:?} in pod {:?} not found", pod.rsplit('/').next().unwrap_or(pod))]
    NoPrevious { pod: String, container: String },
}

/// The log file of a container of pod `namespace/name` (its current run, or the previous one
/// with `previous`), with kubectl's error messages. The newest pod of that name wins.
pub fn find_log(
    data_dir: &Path,
    namespace: &str,
    name: &str,
    container: Option<&str>,
    previous: bool,
) -> Result<PathBuf, LogError> {
    let pod = format!("{namespace}/{name}");
    let dir = find_pod_dirs(data_dir, namespace, name)
        .into_iter()
        .next()
        .ok_or_else(|| LogError::NoPod(pod.clone()))?;
    let logs = dir.join("logs");
    let mut containers: Vec<String> = std::fs::read_dir(&logs)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str().map(str::to_string))
        .collect();
    containers.sort();
    let container = match container {
        Some(c) => c.to_string(),
        None if containers.len() == 1 => containers[0].clone(),
        None => return Err(LogError::ChooseContainer { pod, containers }),
    };
    let mut runs: Vec<u32> = std::fs::read_dir(logs.join(&container))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            e.file_name()
                .to_str()
                .and_then(|n| n.strip_suffix(".log"))
                .and_then(|n| n.parse().ok())
        })
        .collect();
    runs.sort_unstable();
    let run = if previous {
        runs.iter()
            .rev()
            .nth(1)
            .copied()
            .ok_or_else(|| LogError::NoPrevious {
                pod: pod.clone(),
                container: container.clone(),
            })?
    } else {
        runs.last().copied().ok_or_else(|| LogError::NoContainer {
            pod: pod.clone(),
            container: container.clone(),
        })?
    };
    Ok(logs.join(&container).join(format!("{run}.log")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_current_and_previous_logs_with_kubectl_errors() {
        let data = tempfile::tempdir().unwrap();
        let dir = pod_dir(
            &data.path().join("agent/node1/pods"),
            "default",
            "web",
            "u1",
        );
        for (c, run) in [("a", 0), ("a", 1), ("a", 2), ("b", 0)] {
            let d = dir.join("logs").join(c);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join(format!("{run}.log")), "x").unwrap();
        }
        let find = |c, prev| find_log(data.path(), "default", "web", c, prev);
        assert_eq!(find(Some("a"), false).unwrap(), dir.join("logs/a/2.log"));
        assert_eq!(find(Some("a"), true).unwrap(), dir.join("logs/a/1.log"));
        assert_eq!(
            find(Some("b"), true).unwrap_err(),
            LogError::NoPrevious {
                pod: "default/web".into(),
                container: "b".into()
            }
        );
        assert_eq!(
            find(None, false).unwrap_err().to_string(),
            "a container name must be specified for pod default/web, choose one of: [a b]"
        );
        assert_eq!(
            find_log(data.path(), "default", "we", None, false).unwrap_err(),
            LogError::NoPod("default/we".into())
        );
    }
}
