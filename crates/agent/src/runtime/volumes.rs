//! Pod volumes on a process runtime: each volume becomes a directory or file on the node, and
//! each container's `volumeMounts` become bind mounts in the container's private mount
//! namespace (read-only where asked). Served: `emptyDir` (a directory in the pod's directory,
//! removed with the pod; `medium: Memory` is not a tmpfs here), `hostPath` with every `type`
//! check of the kubelet (`DirectoryOrCreate` and `FileOrCreate` create; type `""`, unchecked,
//! creates a missing source as a directory, as Docker and containerd do), and `configMap` (the
//! keys, or `items`, as files with `defaultMode`/`mode`, written when the pod starts; not
//! refreshed while it runs), and `projected` with `serviceAccountToken` (a token of the pod's
//! ServiceAccount bound to the pod, from the TokenRequest API), `configMap` and `downwardAPI`
//! sources. Other sources are refused with a message naming them.
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
        let path = prepare_one(client, pod, ns, v, pod_dir)
            .await
            .map_err(|e| format!("volume {:?}: {e}", v.name))?;
        out.insert(v.name.clone(), path);
    }
    Ok(out)
}

async fn prepare_one(
    client: &Client,
    pod: &Pod,
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
        let files = config_map_files(
            client,
            ns,
            &cm.name,
            cm.optional.unwrap_or(false),
            cm.items.as_deref(),
            cm.default_mode.unwrap_or(0o644),
        )
        .await?;
        write_volume(&own_dir, files)?;
        return Ok(own_dir);
    }
    if let Some(projected) = &v.projected {
        let default_mode = projected.default_mode.unwrap_or(0o644);
        let mut files = Vec::new();
        for source in projected.sources.iter().flatten() {
            if let Some(cm) = &source.config_map {
                files.extend(
                    config_map_files(
                        client,
                        ns,
                        &cm.name,
                        cm.optional.unwrap_or(false),
                        cm.items.as_deref(),
                        default_mode,
                    )
                    .await?,
                );
            } else if let Some(d) = &source.downward_api {
                for item in d.items.iter().flatten() {
                    let field = item.field_ref.as_ref().ok_or_else(|| {
                        format!("downwardAPI item {:?}: only fieldRef is served", item.path)
                    })?;
                    let value = downward_value(pod, &field.field_path).ok_or_else(|| {
                        format!("downwardAPI fieldPath {:?} is not served", field.field_path)
                    })?;
                    files.push((
                        relative(&item.path, "downwardAPI path")?,
                        value,
                        item.mode.unwrap_or(default_mode),
                    ));
                }
            } else if let Some(t) = &source.service_account_token {
                let token =
                    request_token(client, pod, t.audience.as_deref(), t.expiration_seconds).await?;
                files.push((
                    relative(&t.path, "serviceAccountToken path")?,
                    token,
                    default_mode,
                ));
            } else {
                return Err(
                    "a projected source other than serviceAccountToken, configMap or downwardAPI"
                        .into(),
                );
            }
        }
        write_volume(&own_dir, files)?;
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
        "volume source {kind} is not supported by svcnet's process runtime (emptyDir, hostPath, configMap and projected are)"
    ))
}

/// A ConfigMap's keys (or `items`) as (path, content, mode) files.
async fn config_map_files(
    client: &Client,
    ns: &str,
    name: &str,
    optional: bool,
    items: Option<&[k8s_openapi::api::core::v1::KeyToPath]>,
    default_mode: i32,
) -> Result<Vec<(PathBuf, String, i32)>, String> {
    let found = Api::<ConfigMap>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await
        .map_err(|e| format!("reading ConfigMap {ns}/{name}: {e}"))?;
    let data = match found {
        Some(obj) => obj.data.unwrap_or_default(),
        None if optional => BTreeMap::new(),
        None => return Err(format!("configmap \"{name}\" not found")),
    };
    match items {
        Some(items) => items
            .iter()
            .map(|item| {
                let value = match data.get(&item.key) {
                    Some(v) => v.clone(),
                    None if optional => return Ok(None),
                    None => {
                        return Err(format!("configmap \"{name}\" has no key {:?}", item.key));
                    }
                };
                Ok(Some((
                    relative(&item.path, "items[].path")?,
                    value,
                    item.mode.unwrap_or(default_mode),
                )))
            })
            .filter_map(Result::transpose)
            .collect(),
        None => data
            .iter()
            .map(|(k, v)| Ok((relative(k, "key")?, v.clone(), default_mode)))
            .collect(),
    }
}

/// Writes a volume's files afresh into `dir` (its old content goes).
fn write_volume(dir: &Path, files: Vec<(PathBuf, String, i32)>) -> Result<(), String> {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    for (rel, value, mode) in files {
        write_file(&dir.join(rel), &value, mode)?;
    }
    Ok(())
}

/// Writes one file through a rename (a reader never sees half a token), with `mode`.
fn write_file(path: &Path, value: &str, mode: i32) -> Result<(), String> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|e| format!("create {}: {e}", parent.display()))?;
    }
    let tmp = path.with_extension("svcnet-tmp");
    std::fs::write(&tmp, value).map_err(|e| format!("write {}: {e}", tmp.display()))?;
    let mode = u32::try_from(mode & 0o777).unwrap_or(0o644);
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode))
        .map_err(|e| format!("chmod {}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, path).map_err(|e| format!("rename to {}: {e}", path.display()))
}

/// The downward API's value of `field_path` for a file (labels and annotations as
/// `key="value"` lines, as the kubelet writes them).
fn downward_value(pod: &Pod, field_path: &str) -> Option<String> {
    let m = &pod.metadata;
    let pairs = |map: &Option<BTreeMap<String, String>>| {
        map.iter()
            .flatten()
            .map(|(k, v)| format!("{k}={v:?}"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    match field_path {
        "metadata.name" => m.name.clone(),
        "metadata.namespace" => Some(m.namespace.clone().unwrap_or_else(|| "default".into())),
        "metadata.uid" => m.uid.clone(),
        "metadata.labels" => Some(pairs(&m.labels)),
        "metadata.annotations" => Some(pairs(&m.annotations)),
        "spec.nodeName" => pod.spec.as_ref().and_then(|s| s.node_name.clone()),
        "spec.serviceAccountName" => pod
            .spec
            .as_ref()
            .and_then(|s| s.service_account_name.clone()),
        _ => None,
    }
}

/// The seconds a projected token asks for when the volume names none (upstream's default).
const TOKEN_SECONDS: i64 = 3600;

/// A token of the pod's ServiceAccount bound to the pod, from the TokenRequest API (what the
/// kubelet asks for a projected `serviceAccountToken`).
pub async fn request_token(
    client: &Client,
    pod: &Pod,
    audience: Option<&str>,
    expiration_seconds: Option<i64>,
) -> Result<String, String> {
    use k8s_openapi::api::authentication::v1::{
        BoundObjectReference, TokenRequest, TokenRequestSpec,
    };
    use k8s_openapi::api::core::v1::ServiceAccount;
    let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
    let sa = pod
        .spec
        .as_ref()
        .and_then(|s| s.service_account_name.clone())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "default".into());
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: audience.map(|a| vec![a.to_string()]).unwrap_or_default(),
            expiration_seconds: Some(expiration_seconds.unwrap_or(TOKEN_SECONDS)),
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: pod.metadata.name.clone(),
                uid: pod.metadata.uid.clone(),
            }),
        },
        ..Default::default()
    };
    let got = Api::<ServiceAccount>::namespaced(client.clone(), ns)
        .create_token_request(&sa, &Default::default(), &request)
        .await
        .map_err(|e| format!("requesting a token of ServiceAccount {ns}/{sa}: {e}"))?;
    got.status
        .map(|s| s.token)
        .ok_or_else(|| format!("the TokenRequest of ServiceAccount {ns}/{sa} returned no token"))
}

/// How long until the pod's projected tokens should be renewed: 80 % of the shortest
/// lifetime asked for, as the kubelet does; `None` without a projected token.
pub fn token_refresh_after(pod: &Pod) -> Option<std::time::Duration> {
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .filter_map(|v| v.projected.as_ref())
        .flat_map(|p| p.sources.iter().flatten())
        .filter_map(|s| s.service_account_token.as_ref())
        .map(|t| t.expiration_seconds.unwrap_or(TOKEN_SECONDS).max(1))
        .min()
        .map(|secs| std::time::Duration::from_millis(u64::try_from(secs * 800).unwrap_or(0)))
}

/// Writes fresh tokens into the pod's projected token files (in place, by rename: the
/// containers see the new file through their mount of the volume's directory).
pub async fn refresh_tokens(client: &Client, pod: &Pod, pod_dir: &Path) -> Result<(), String> {
    for v in pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
        let Some(projected) = &v.projected else {
            continue;
        };
        let mode = projected.default_mode.unwrap_or(0o644);
        for t in projected
            .sources
            .iter()
            .flatten()
            .filter_map(|s| s.service_account_token.as_ref())
        {
            let token =
                request_token(client, pod, t.audience.as_deref(), t.expiration_seconds).await?;
            let path = pod_dir
                .join("volumes")
                .join(&v.name)
                .join(relative(&t.path, "serviceAccountToken path")?);
            write_file(&path, &token, mode)?;
        }
    }
    Ok(())
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
    if kind.is_empty() && !path.exists() {
        // Type "" does no check; the container runtime (Docker, containerd's CRI) creates a
        // missing source as an empty directory (root, 0755), and so does svcnet.
        std::fs::create_dir_all(path).map_err(|e| format!("create {}: {e}", path.display()))?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_path_types_check_and_create_as_the_runtime_does() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("lib/modules");
        // Type "" checks nothing and a missing source becomes an empty directory.
        assert_eq!(host_path(&missing, "").unwrap(), missing);
        assert!(missing.is_dir());
        let file = dir.path().join("f");
        std::fs::write(&file, "x").unwrap();
        assert_eq!(host_path(&file, "").unwrap(), file);
        assert!(
            host_path(&file, "Directory")
                .unwrap_err()
                .contains("is not a directory")
        );
        assert!(host_path(&dir.path().join("nope"), "File").is_err());
        assert!(
            host_path(Path::new("rel"), "")
                .unwrap_err()
                .contains("absolute")
        );
    }

    #[test]
    fn tokens_are_renewed_at_four_fifths_of_the_shortest_lifetime() {
        let pod = |sources: serde_json::Value| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "p"},
                "spec": {"containers": [], "volumes": [
                    {"name": "a", "projected": {"sources": sources}},
                    {"name": "b", "emptyDir": {}},
                ]},
            }))
            .unwrap()
        };
        let secs = |s: u64| Some(std::time::Duration::from_secs(s));
        assert_eq!(
            token_refresh_after(&pod(
                serde_json::json!([{"serviceAccountToken": {"path": "t"}}])
            )),
            secs(2880)
        );
        assert_eq!(
            token_refresh_after(&pod(serde_json::json!([
                {"serviceAccountToken": {"path": "t", "expirationSeconds": 3607}},
                {"serviceAccountToken": {"path": "u", "expirationSeconds": 600}},
            ]))),
            secs(480)
        );
        assert_eq!(
            token_refresh_after(&pod(serde_json::json!([{"configMap": {"name": "x"}}]))),
            None
        );
    }
}
