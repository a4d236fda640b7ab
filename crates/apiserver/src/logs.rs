//! The `pods/log` subresource (`kubectl logs`): a container's output as `text/plain`, from the
//! file the configured [`LogSource`](crate::LogSource) locates.
//!
//! The container is resolved from the pod's spec with upstream's messages (the only container
//! when none is named; 400 naming the choices otherwise). `tailLines` and `limitBytes` cut the
//! output; `follow` keeps streaming appended bytes until the client goes, the pod is gone (or
//! replaced under the same name), the container's run ends (the locator names another file),
//! or the server stops. The agent records each line with its time (the CRI logging format,
//! read by [`crate::logformat`]), which `timestamps`, `sinceSeconds` and `sinceTime` use;
//! `limitBytes` counts what the client receives.

use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use bytes::Bytes;
use futures::StreamExt;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncSeekExt};
use tokio::sync::mpsc;

use crate::config::{LogSource, LogTarget};
use crate::logformat::{LogFormat, LogReader};
use crate::objects::meta_str;
use crate::request::LogQuery;
use crate::request::ResourceRequest;
use crate::state::SharedState;
use crate::status::ApiError;

/// How often a follower looks for appended bytes.
const POLL: Duration = Duration::from_millis(200);
/// How often a follower checks that the pod and the container's run are still there.
const RECHECK: Duration = Duration::from_secs(1);
const CHUNK: usize = 32 * 1024;

fn container_names(pod: &Value) -> Vec<String> {
    ["initContainers", "containers", "ephemeralContainers"]
        .iter()
        .filter_map(|f| pod.get("spec")?.get(*f)?.as_array())
        .flatten()
        .filter_map(|c| c.get("name")?.as_str().map(str::to_string))
        .collect()
}

/// The container a log request is for (upstream's `validateContainer`).
pub fn container_of(pod: &Value, requested: Option<&str>) -> Result<String, ApiError> {
    let name = meta_str(pod, "name").unwrap_or("");
    let all = container_names(pod);
    match requested {
        Some(c) if all.iter().any(|n| n == c) => Ok(c.to_string()),
        Some(c) => Err(ApiError::BadRequest(format!(
            "container {c} is not valid for pod {name}"
        ))),
        None => {
            let main: Vec<&str> = pod
                .pointer("/spec/containers")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|c| c.get("name")?.as_str())
                .collect();
            match main.as_slice() {
                [only] => Ok(only.to_string()),
                [] => Err(ApiError::BadRequest(format!(
                    "a container name must be specified for pod {name}"
                ))),
                _ => Err(ApiError::BadRequest(format!(
                    "a container name must be specified for pod {name}, choose one of: [{}]",
                    all.join(" ")
                ))),
            }
        }
    }
}

/// Where the last `lines` lines of the file's first `size` bytes start (what it held when it
/// was opened; a writer may append meanwhile). A final line without a newline counts.
pub fn tail_offset(file: &mut (impl Read + Seek), size: u64, lines: u64) -> std::io::Result<u64> {
    if lines == 0 {
        return Ok(size);
    }
    let mut end = size;
    if size > 0 {
        file.seek(SeekFrom::Start(size - 1))?;
        let mut last = [0u8; 1];
        file.read_exact(&mut last)?;
        if last[0] == b'\n' {
            end -= 1;
        }
    }
    let mut remaining = lines;
    let mut buf = vec![0u8; CHUNK];
    let mut pos = end;
    while pos > 0 {
        let start = pos.saturating_sub(CHUNK as u64);
        let len = usize::try_from(pos - start).unwrap_or(CHUNK);
        file.seek(SeekFrom::Start(start))?;
        file.read_exact(&mut buf[..len])?;
        for i in (0..len).rev() {
            if buf[i] == b'\n' {
                remaining -= 1;
                if remaining == 0 {
                    return Ok(start + i as u64 + 1);
                }
            }
        }
        pos = start;
    }
    Ok(0)
}

fn bad(msg: impl Into<String>) -> ApiError {
    ApiError::BadRequest(msg.into())
}

struct Located {
    path: PathBuf,
    file: tokio::fs::File,
    /// Where reading starts (after `tailLines`).
    offset: u64,
    /// The file's length when it was opened: without `follow`, the log as it was then (lines
    /// written meanwhile would make `--tail 2` answer three).
    end: u64,
}

async fn locate(
    source: &LogSource,
    ns: &str,
    pod: &str,
    uid: &str,
    container: &str,
    previous: bool,
) -> Result<PathBuf, String> {
    let (source, ns, pod, uid, container) = (
        source.clone(),
        ns.to_string(),
        pod.to_string(),
        uid.to_string(),
        container.to_string(),
    );
    tokio::task::spawn_blocking(move || {
        source.locate(&LogTarget {
            namespace: &ns,
            pod: &pod,
            uid: &uid,
            container: &container,
            previous,
        })
    })
    .await
    .map_err(|e| e.to_string())?
}

async fn open_at(path: &Path, tail: Option<u64>) -> std::io::Result<Located> {
    let p = path.to_path_buf();
    let (file, offset, end) = tokio::task::spawn_blocking(move || {
        let mut f = std::fs::File::open(&p)?;
        let end = f.metadata()?.len();
        let offset = match tail {
            Some(n) => tail_offset(&mut f, end, n)?,
            None => 0,
        };
        Ok::<_, std::io::Error>((f, offset, end))
    })
    .await
    .map_err(std::io::Error::other)??;
    let mut file = tokio::fs::File::from_std(file);
    file.seek(SeekFrom::Start(offset)).await?;
    Ok(Located {
        path: path.to_path_buf(),
        file,
        offset,
        end,
    })
}

/// What `timestamps`, `sinceSeconds` and `sinceTime` ask for, with upstream's refusals.
fn log_format(q: &LogQuery) -> Result<LogFormat, ApiError> {
    let since = match (q.since_seconds, q.since_time.as_deref()) {
        (Some(_), Some(_)) => {
            return Err(bad(
                "at most one of `sinceTime` or `sinceSeconds` may be specified",
            ));
        }
        (Some(s), None) if s < 1 => {
            return Err(bad(format!(
                "sinceSeconds: Invalid value: {s}: must be greater than 0"
            )));
        }
        (Some(s), None) => {
            let span = jiff::SignedDuration::from_secs(s);
            Some(
                jiff::Timestamp::now()
                    .checked_sub(span)
                    .unwrap_or(jiff::Timestamp::MIN),
            )
        }
        (None, Some(t)) => Some(t.parse::<jiff::Timestamp>().map_err(|e| {
            bad(format!(
                "invalid sinceTime {t:?}: not an RFC 3339 time: {e}"
            ))
        })?),
        (None, None) => None,
    };
    if q.limit_bytes == Some(0) {
        return Err(bad("limitBytes: Invalid value: 0: must be greater than 0"));
    }
    Ok(LogFormat {
        timestamps: q.timestamps,
        since,
    })
}

pub async fn serve(state: SharedState, req: ResourceRequest) -> Result<Response, ApiError> {
    let res = req.resource;
    let ns = req.namespace.clone().unwrap_or_default();
    let name = req
        .name
        .clone()
        .ok_or_else(|| bad("a pod name is required"))?;
    let key = res.key(Some(&ns), &name);
    let pod = state
        .store
        .get(&key)
        .await?
        .ok_or_else(|| ApiError::not_found(res, &name))?;
    let q = req.query.log.clone();
    let container = container_of(&pod, q.container.as_deref())?;
    let format = log_format(&q)?;
    let source = state.cfg.log_source.clone().ok_or_else(|| {
        bad(format!(
            "logs of pod {name} are not available: this API server runs without a node agent"
        ))
    })?;
    let uid = meta_str(&pod, "uid").unwrap_or("").to_string();
    let path = locate(&source, &ns, &name, &uid, &container, q.previous)
        .await
        .map_err(bad)?;
    let located = open_at(&path, q.tail_lines).await.map_err(|e| {
        bad(format!(
            "container {container:?} in pod {ns}/{name} has no readable log yet: {e}"
        ))
    })?;
    let (tx, rx) = mpsc::channel::<Bytes>(16);
    let follow = q.follow && !q.previous;
    let limit = q.limit_bytes;
    let shutdown = state.shutdown.clone();
    tokio::spawn(async move {
        let still_there = || async {
            let same_pod = matches!(state.store.get(&key).await, Ok(Some(p)) if meta_str(&p, "uid") == Some(uid.as_str()));
            same_pod
                && locate(&source, &ns, &name, &uid, &container, false)
                    .await
                    .as_deref()
                    == Ok(located.path.as_path())
        };
        let mut file = located.file;
        let mut reader = LogReader::new(format);
        let mut sent: u64 = 0;
        let mut buf = vec![0u8; CHUNK];
        let mut last_check = tokio::time::Instant::now();
        let mut ending = false;
        // Sends output, cut at `limitBytes`; false once the client is gone or the limit is met.
        let mut emit = async |mut out: Vec<u8>| -> bool {
            if let Some(l) = limit {
                let room = usize::try_from(l.saturating_sub(sent)).unwrap_or(usize::MAX);
                out.truncate(room);
            }
            sent += out.len() as u64;
            if !out.is_empty() && tx.send(Bytes::from(out)).await.is_err() {
                return false;
            }
            limit.is_none_or(|l| sent < l)
        };
        let mut pos = located.offset;
        loop {
            // Without follow, the log as it was when the request came.
            let room = if follow {
                buf.len()
            } else {
                usize::try_from(located.end.saturating_sub(pos))
                    .unwrap_or(usize::MAX)
                    .min(buf.len())
            };
            let n = match file.read(&mut buf[..room]).await {
                Ok(n) => n,
                Err(e) => {
                    tracing::debug!("reading {}: {e}", located.path.display());
                    return;
                }
            };
            if n > 0 {
                pos += n as u64;
                if !emit(reader.feed(&buf[..n])).await {
                    return;
                }
                continue;
            }
            // At the end of what has been written.
            if !follow || ending {
                let _ = emit(reader.finish()).await;
                return;
            }
            tokio::select! {
                () = tokio::time::sleep(POLL) => {}
                () = tx.closed() => return,
                () = shutdown.cancelled() => return,
            }
            if last_check.elapsed() >= RECHECK {
                last_check = tokio::time::Instant::now();
                // One more read drains what was written before the pod or run ended.
                ending = !still_there().await;
            }
        }
    });
    let stream =
        tokio_stream::wrappers::ReceiverStream::new(rx).map(Ok::<Bytes, std::convert::Infallible>);
    let mut resp = Response::new(Body::from_stream(stream));
    *resp.status_mut() = StatusCode::OK;
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    Ok(resp)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::io::Cursor;

    #[test]
    fn container_is_resolved_with_upstream_messages() {
        let one = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "a"}]}});
        assert_eq!(container_of(&one, None).unwrap(), "a");
        assert_eq!(container_of(&one, Some("a")).unwrap(), "a");
        let two = json!({"metadata": {"name": "p"}, "spec": {
            "initContainers": [{"name": "init"}], "containers": [{"name": "a"}, {"name": "b"}]}});
        let err = container_of(&two, None).unwrap_err();
        assert_eq!(
            (err.code(), err.to_string()),
            (
                400,
                "a container name must be specified for pod p, choose one of: [init a b]".into()
            )
        );
        assert_eq!(container_of(&two, Some("init")).unwrap(), "init");
        assert_eq!(
            container_of(&two, Some("z")).unwrap_err().to_string(),
            "container z is not valid for pod p"
        );
    }

    #[test]
    fn tail_offsets() {
        let tail = |text: &str, n: u64| {
            let off = tail_offset(&mut Cursor::new(text.as_bytes()), text.len() as u64, n).unwrap();
            text[usize::try_from(off).unwrap()..].to_string()
        };
        assert_eq!(tail("a\nb\nc\n", 2), "b\nc\n");
        assert_eq!(tail("a\nb\nc", 2), "b\nc");
        assert_eq!(tail("a\nb\nc\n", 5), "a\nb\nc\n");
        assert_eq!(tail("a\nb\nc\n", 0), "");
        assert_eq!(tail("", 3), "");
        assert_eq!(tail("\n\n", 1), "\n");
        // Lines appended after the file was measured are not counted.
        let grown = "a\nb\nc\nd\n";
        let off = tail_offset(&mut Cursor::new(grown.as_bytes()), 6, 2).unwrap();
        assert_eq!(&grown[usize::try_from(off).unwrap()..6], "b\nc\n");
        // Across chunk boundaries.
        let long: String = (0..20_000).map(|i| format!("line {i}\n")).collect();
        assert_eq!(tail(&long, 3), "line 19997\nline 19998\nline 19999\n");
    }
}
