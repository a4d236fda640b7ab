//! Pod volumes on a process runtime: each volume becomes a directory or file on the node, and
//! each container's `volumeMounts` become bind mounts in the container's private mount
//! namespace (read-only where asked). Served: `emptyDir` (a directory in the pod's directory,
//! removed with the pod; `medium: Memory` is not a tmpfs here), `hostPath` with every `type`
//! check of the kubelet (`DirectoryOrCreate` and `FileOrCreate` create), and `configMap` (the
//! keys, or `items`, as files with `defaultMode`/`mode`, written when the pod starts; not
//! refreshed while it runs). Other sources are refused with a message naming them.
//!
//! Containers share the node's root file system (there are no images), so a mount point must
//! exist on the node: a missing one is created (a directory, or an empty file when the source
//! is a file) and left in place (see [`ensure_mount_points`]).

use std::collections::BTreeMap;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use k8s_openapi::api::core::v1::{ConfigMap, Container, Pod, Volume};
use kube::{Api, Client};
use serde::{Deserialize, Serialize};

/// One bind mount of a container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mount {
    pub source: PathBuf,
    pub target: PathBuf,
    pub read_only: bool,
}

/// The node paths of a pod's volumes, by volume name.
pub type Volumes = BTreeMap<String, PathBuf>;

/// A relative path without `..` (a `subPath` or an item's `path`).
fn relative(path: &str, what: &str) -> Result<PathBuf, String> {
    let p = Path::new(path);
    if p.is_absolute()
        || p.components()
            .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
    {
        return Err(format!(
            "{what} {path:?} must be a relative path without '..'"
        ));
    }
    Ok(p.to_path_buf())
}

/// Makes every volume of `pod` exist on the node (under `pod_dir` for emptyDir and
/// configMap). An error names the volume, as the kubelet's FailedMount does.
pub async fn prepare(client: &Client, pod: &Pod, pod_dir: &Path) -> Result<Volumes, String> {
    let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
    let mut out = Volumes::new();
    for v in pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
        let path = prepare_one(client, ns, v, pod_dir)
            .await
            .map_err(|e| format!("volume {:?}: {e}", v.name))?;
        out.insert(v.name.clone(), path);
    }
    Ok(out)
}

async fn prepare_one(
    client: &Client,
    ns: &str,
    v: &Volume,
    pod_dir: &Path,
) -> Result<PathBuf, String> {
    let own_dir = pod_dir.join("volumes").join(&v.name);
    if v.empty_dir.is_some() {
        std::fs::create_dir_all(&own_dir)
            .map_err(|e| format!("create {}: {e}", own_dir.display()))?;
        return Ok(own_dir);
    }
    if let Some(hp) = &v.host_path {
        return host_path(Path::new(&hp.path), hp.type_.as_deref().unwrap_or(""));
    }
    if let Some(cm) = &v.config_map {
        let optional = cm.optional.unwrap_or(false);
        let found = Api::<ConfigMap>::namespaced(client.clone(), ns)
            .get_opt(&cm.name)
            .await
            .map_err(|e| format!("reading ConfigMap {ns}/{}: {e}", cm.name))?;
        let data = match found {
            Some(obj) => obj.data.unwrap_or_default(),
            None if optional => BTreeMap::new(),
            None => return Err(format!("configmap \"{}\" not found", cm.name)),
        };
        let default_mode = cm.default_mode.unwrap_or(0o644);
        let files: Vec<(PathBuf, String, i32)> = match &cm.items {
            Some(items) => items
                .iter()
                .map(|item| {
                    let value = match data.get(&item.key) {
                        Some(v) => v.clone(),
                        None if optional => return Ok(None),
                        None => {
                            return Err(format!(
                                "configmap \"{}\" has no key {:?}",
                                cm.name, item.key
                            ));
                        }
                    };
                    Ok(Some((
                        relative(&item.path, "items[].path")?,
                        value,
                        item.mode.unwrap_or(default_mode),
                    )))
                })
                .filter_map(Result::transpose)
                .collect::<Result<_, String>>()?,
            None => data
                .iter()
                .map(|(k, v)| Ok((relative(k, "key")?, v.clone(), default_mode)))
                .collect::<Result<_, String>>()?,
        };
        // Rewritten whole on every start of the pod's sandbox.
        let _ = std::fs::remove_dir_all(&own_dir);
        for (rel, value, mode) in files {
            let path = own_dir.join(rel);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent)
                    .map_err(|e| format!("create {}: {e}", parent.display()))?;
            }
            std::fs::write(&path, value).map_err(|e| format!("write {}: {e}", path.display()))?;
            let mode = u32::try_from(mode & 0o777).unwrap_or(0o644);
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
                .map_err(|e| format!("chmod {}: {e}", path.display()))?;
        }
        std::fs::create_dir_all(&own_dir)
            .map_err(|e| format!("create {}: {e}", own_dir.display()))?;
        return Ok(own_dir);
    }
    let kind = serde_json::to_value(v)
        .ok()
        .and_then(|v| {
            v.as_object()
                .and_then(|o| o.keys().find(|k| *k != "name").cloned())
        })
        .unwrap_or_else(|| "(none)".into());
    Err(format!(
        "volume source {kind} is not supported by svcnet's process runtime (emptyDir, hostPath and configMap are)"
    ))
}

/// A hostPath volume: the kubelet's checks per `type`, creating for the `…OrCreate` types.
fn host_path(path: &Path, kind: &str) -> Result<PathBuf, String> {
    if !path.is_absolute() {
        return Err(format!("hostPath {} must be absolute", path.display()));
    }
    let meta = std::fs::metadata(path).ok();
    let fail = |what: &str| {
        Err(format!(
            "hostPath type check failed: {} is not {what}",
            path.display()
        ))
    };
    match kind {
        "" => {}
        "DirectoryOrCreate" => {
            if meta.is_none() {
                std::fs::create_dir_all(path)
                    .and_then(|()| {
                        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
                    })
                    .map_err(|e| format!("create {}: {e}", path.display()))?;
            } else if !meta.as_ref().is_some_and(|m| m.is_dir()) {
                return fail("a directory");
            }
        }
        "Directory" if !meta.as_ref().is_some_and(|m| m.is_dir()) => return fail("a directory"),
        "FileOrCreate" => {
            if meta.is_none() {
                if let Some(parent) = path.parent() {
                    std::fs::create_dir_all(parent)
                        .map_err(|e| format!("create {}: {e}", parent.display()))?;
                }
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .and_then(|f| f.set_permissions(std::fs::Permissions::from_mode(0o644)))
                    .map_err(|e| format!("create {}: {e}", path.display()))?;
            } else if !meta.as_ref().is_some_and(|m| m.is_file()) {
                return fail("a file");
            }
        }
        "File" if !meta.as_ref().is_some_and(|m| m.is_file()) => return fail("a file"),
        "Socket" if !meta.as_ref().is_some_and(|m| m.file_type().is_socket()) => {
            return fail("a socket");
        }
        "CharDevice"
            if !meta
                .as_ref()
                .is_some_and(|m| m.file_type().is_char_device()) =>
        {
            return fail("a character device");
        }
        "BlockDevice"
            if !meta
                .as_ref()
                .is_some_and(|m| m.file_type().is_block_device()) =>
        {
            return fail("a block device");
        }
        "Directory" | "File" | "Socket" | "CharDevice" | "BlockDevice" => {}
        other => return Err(format!("hostPath type {other:?} is not a known type")),
    }
    if !path.exists() {
        // Type "" mounts whatever is there; nothing there is the kubelet's error too.
        return Err(format!("hostPath {} does not exist", path.display()));
    }
    Ok(path.to_path_buf())
}

/// The bind mounts of container `c` over the pod's prepared `volumes`.
pub fn mounts(c: &Container, volumes: &Volumes) -> Result<Vec<Mount>, String> {
    c.volume_mounts
        .iter()
        .flatten()
        .map(|m| {
            let base = volumes.get(&m.name).ok_or_else(|| {
                format!(
                    "spec.containers[{}].volumeMounts: volume {:?} is not in spec.volumes",
                    c.name, m.name
                )
            })?;
            let source = match m.sub_path.as_deref().filter(|s| !s.is_empty()) {
                Some(sub) => base.join(relative(sub, "subPath")?),
                None => base.clone(),
            };
            let target = PathBuf::from(&m.mount_path);
            if !target.is_absolute() {
                return Err(format!(
                    "spec.containers[{}].volumeMounts[{}].mountPath must be absolute",
                    c.name, m.name
                ));
            }
            Ok(Mount {
                source,
                target,
                read_only: m.read_only.unwrap_or(false),
            })
        })
        .collect()
}

/// Creates the missing mount points of `mounts` on the node: a directory, or an empty file for
/// a file source. They stay when the pod goes: another pod (the same DaemonSet's on another
/// node, which shares this file system) may have its mount there, and removing a mount point
/// detaches the mounts on it in every mount namespace.
pub fn ensure_mount_points(mounts: &[Mount]) -> Result<(), String> {
    for m in mounts {
        if m.target.exists() {
            continue;
        }
        if m.source.is_dir() {
            std::fs::create_dir_all(&m.target)
        } else {
            m.target
                .parent()
                .map_or(Ok(()), std::fs::create_dir_all)
                .and_then(|()| std::fs::File::create(&m.target).map(|_| ()))
        }
        .map_err(|e| format!("create mount point {}: {e}", m.target.display()))?;
    }
    Ok(())
}
