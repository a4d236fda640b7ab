//! The `pods/exec` subresource (`kubectl exec`, `kubectl cp`): a process in a pod's container,
//! streamed over a WebSocket in Kubernetes' channel protocol (`v5.channel.k8s.io`, or
//! `v4.channel.k8s.io`). Every binary message starts with its channel: 0 stdin, 1 stdout,
//! 2 stderr, 3 the final `Status` (the exit code), 4 terminal resizes (`{"Width","Height"}`),
//! and in v5, 255 `[255, channel]`: the client closed that stream (stdin's end of file).
//!
//! The pod, container and command are checked before the upgrade, so what does not exist is an
//! ordinary HTTP error kubectl prints; the process starts after it, and a command that cannot
//! start is reported on the error channel. A client that goes away takes the process (its
//! whole process group) with it. kubectl before 1.30 asks for SPDY instead, served by
//! [`crate::execspdy`].

use std::io::{Read, Write};

use axum::extract::FromRequestParts;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::{Value, json};

use crate::config::{ExecProcess, ExecTarget};
use crate::objects::meta_str;
use crate::request::ResourceRequest;
use crate::state::SharedState;
use crate::status::ApiError;

pub(crate) const PROTOCOLS: [&str; 2] = ["v5.channel.k8s.io", "v4.channel.k8s.io"];

pub(crate) const STDIN: u8 = 0;
pub(crate) const STDOUT: u8 = 1;
pub(crate) const STDERR: u8 = 2;
const ERROR: u8 = 3;
pub(crate) const RESIZE: u8 = 4;
pub(crate) const CLOSE: u8 = 255;

/// How long output is still read after the process exited.
pub(crate) const LINGER: std::time::Duration = std::time::Duration::from_millis(500);

pub(crate) async fn serve(
    state: SharedState,
    req: ResourceRequest,
    mut parts: http::request::Parts,
) -> Result<Response, ApiError> {
    let (ns, name, pod, source) = stream_pod(
        &state,
        &req,
        &state.cfg.exec_source,
        "nothing can be executed in pods",
    )
    .await?;
    refuse_completed(&pod, "exec into")?;
    let q = &req.query.exec;
    if q.command.is_empty() {
        return Err(ApiError::BadRequest(
            "you must specify at least 1 command".into(),
        ));
    }
    if !q.stdin && !q.stdout && !q.stderr {
        return Err(ApiError::BadRequest(
            "you must specify at least 1 of stdin, stdout, stderr".into(),
        ));
    }
    let container = crate::logs::container_of(&pod, req.query.log.container.as_deref())?;
    let target = ExecTarget {
        namespace: ns.clone(),
        pod: name.clone(),
        uid: meta_str(&pod, "uid").unwrap_or("").to_string(),
        container,
        command: q.command.clone(),
        stdin: q.stdin,
        tty: q.tty,
        size: None,
    };
    if crate::spdyconn::wants_spdy(&parts.headers) {
        let channels = crate::execspdy::Channels {
            stdin: q.stdin,
            stdout: q.stdout,
            stderr: q.stderr,
            tty: q.tty,
        };
        let work = crate::execspdy::Work::Exec(source, target);
        return crate::execspdy::serve(&mut parts, work, channels);
    }
    let (offered, chosen) = channel_protocol(&parts.headers);
    let Some(protocol) = chosen else {
        let upgrade = parts
            .headers
            .get(http::header::UPGRADE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("none");
        return Err(ApiError::BadRequest(format!(
            "svcnet streams pods/exec over WebSocket ({}), which kubectl 1.30 and later speak; this request asked for {upgrade:?}{}",
            PROTOCOLS.join(", "),
            if offered.is_empty() {
                String::new()
            } else {
                format!(" with protocols {offered:?}")
            }
        )));
    };
    let ws = WebSocketUpgrade::from_request_parts(&mut parts, &())
        .await
        .map_err(|e| ApiError::BadRequest(format!("pods/exec needs a WebSocket upgrade: {e}")))?;
    let v5 = protocol == PROTOCOLS[0];
    let (stdout, stderr) = (q.stdout, q.stderr);
    Ok(ws
        .protocols(PROTOCOLS)
        .on_upgrade(move |mut socket| async move {
            // Started after the upgrade, as a runtime does: a command that cannot start is
            // reported on the error channel, not as an upgrade failure (which kubectl would
            // answer by retrying over SPDY). On a terminal, kubectl's first message is its
            // size: wait briefly for it, so the process starts on a terminal of that size
            // (`stty size` run at once would otherwise see 24 80 before the resize lands).
            let mut target = target;
            let mut early = Vec::new();
            if target.tty {
                let wait = tokio::time::Instant::now() + FIRST_SIZE_WAIT;
                while let Ok(Some(Ok(Message::Binary(b)))) =
                    tokio::time::timeout_at(wait, socket.recv()).await
                {
                    if b.first() == Some(&RESIZE) {
                        target.size = terminal_size(&b[1..]);
                        break;
                    }
                    early.push(b);
                }
            }
            match source.start(&target) {
                Ok(process) => {
                    session(socket, process, target, v5, stdout, stderr, early).await
                }
                Err(e) => {
                    let status = json!({"metadata": {}, "status": "Failure", "reason": "InternalError",
                        "message": format!("Internal error occurred: error executing command in pod {}/{} container {}: {e}",
                            target.namespace, target.pod, target.container)});
                    finish(&mut socket, &status).await;
                }
            }
        })
        .into_response())
}

/// Sends the final Status on the error channel and closes the stream normally.
pub(crate) async fn finish(socket: &mut WebSocket, status: &Value) {
    let mut frame = vec![ERROR];
    frame.extend_from_slice(status.to_string().as_bytes());
    let _ = socket.send(Message::Binary(Bytes::from(frame))).await;
    // A close without a code is an abnormal end to kubectl (1005): say normal closure.
    let close = axum::extract::ws::CloseFrame {
        code: axum::extract::ws::close_code::NORMAL,
        reason: "".into(),
    };
    let _ = socket.send(Message::Close(Some(close))).await;
}

/// What the process's side sends to the session.
pub(crate) enum Out {
    Data(u8, Vec<u8>),
    Exited(std::io::Result<std::process::ExitStatus>),
}

/// Reads `from` into channel `channel` until end of file (or a terminal's EIO after the
/// process went away).
fn pump_out(mut from: impl Read + Send + 'static, channel: u8, to: tokio::sync::mpsc::Sender<Out>) {
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 32 * 1024];
        loop {
            match from.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if to
                        .blocking_send(Out::Data(channel, buf[..n].to_vec()))
                        .is_err()
                    {
                        return;
                    }
                }
            }
        }
    });
}

/// A started process's streams, whatever carries them to the client.
pub(crate) struct ProcessIo {
    /// Output chunks, then the exit; ends when the readers reached end of file.
    pub rx: tokio::sync::mpsc::Receiver<Out>,
    /// Input for the process; `None` closes its stdin.
    pub input: std::sync::mpsc::Sender<Option<Vec<u8>>>,
    pub resize: Option<Box<dyn Fn(u16, u16) + Send + Sync>>,
    /// It runs on a terminal (one output stream).
    pub tty: bool,
    pub pid: u32,
}

/// Starts the threads that read the process's output, write its input and wait for it.
pub(crate) fn start_io(mut process: ExecProcess, target: &ExecTarget) -> ProcessIo {
    let (tx, rx) = tokio::sync::mpsc::channel::<Out>(16);
    // The process's input: a thread writes what stdin frames carry; `None` closes it.
    let (in_tx, in_rx) = std::sync::mpsc::channel::<Option<Vec<u8>>>();
    let mut input: Option<Box<dyn Write + Send>> = None;
    match &process.terminal {
        Some(term) => {
            if let Ok(r) = term.try_clone() {
                pump_out(r, STDOUT, tx.clone());
            }
            if target.stdin {
                input = term
                    .try_clone()
                    .ok()
                    .map(|w| Box::new(w) as Box<dyn Write + Send>);
            }
        }
        None => {
            if let Some(out) = process.child.stdout.take() {
                pump_out(out, STDOUT, tx.clone());
            }
            if let Some(err) = process.child.stderr.take() {
                pump_out(err, STDERR, tx.clone());
            }
            input = process
                .child
                .stdin
                .take()
                .map(|w| Box::new(w) as Box<dyn Write + Send>);
        }
    }
    if let Some(mut w) = input {
        std::thread::spawn(move || {
            while let Ok(Some(data)) = in_rx.recv() {
                if w.write_all(&data).and_then(|()| w.flush()).is_err() {
                    return;
                }
            }
        });
    }
    let pid = process.child.id();
    let mut child = process.child;
    let exit_tx = tx.clone();
    std::thread::spawn(move || {
        let status = child.wait();
        let _ = exit_tx.blocking_send(Out::Exited(status));
    });
    drop(tx);
    ProcessIo {
        rx,
        input: in_tx,
        resize: process.resize,
        tty: process.terminal.is_some(),
        pid,
    }
}

/// The WebSocket subprotocols the client offered (as sent) and the channel protocol chosen
/// from them, the newest first (`v5.channel.k8s.io`, then `v4`).
pub(crate) fn channel_protocol(headers: &http::HeaderMap) -> (String, Option<&'static str>) {
    let offered = headers
        .get(http::header::SEC_WEBSOCKET_PROTOCOL)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let chosen = PROTOCOLS
        .iter()
        .find(|p| offered.split(',').any(|o| o.trim() == **p))
        .copied();
    (offered, chosen)
}

/// The pod a stream request names (404 when there is none) and the stream source `svcnet up`
/// handed the server, or the error saying that, without a node agent, `nothing` (what cannot
/// be done). Shared by exec, attach and port-forward.
pub(crate) async fn stream_pod<S: Clone>(
    state: &SharedState,
    req: &ResourceRequest,
    source: &Option<S>,
    nothing: &str,
) -> Result<(String, String, Value, S), ApiError> {
    let name = req.name.clone().unwrap_or_default();
    let ns = req.namespace.clone().unwrap_or_default();
    let pod = state
        .store
        .get(&req.resource.key(Some(&ns), &name))
        .await?
        .ok_or_else(|| ApiError::not_found(req.resource, &name))?;
    let Some(source) = source.clone() else {
        return Err(ApiError::BadRequest(format!(
            "pod {ns}/{name}: this API server runs without a node agent, so {nothing}"
        )));
    };
    Ok((ns, name, pod, source))
}

/// Exec and attach refuse a pod whose containers have all ended, in the kubelet's words
/// (`doing`: "exec into", "attach to").
pub(crate) fn refuse_completed(pod: &Value, doing: &str) -> Result<(), ApiError> {
    match pod.pointer("/status/phase").and_then(Value::as_str) {
        Some(phase @ ("Succeeded" | "Failed")) => Err(ApiError::BadRequest(format!(
            "cannot {doing} a container in a completed pod; current phase is {phase}"
        ))),
        _ => Ok(()),
    }
}

/// How long a terminal session waits for the client's first size before starting the process.
pub(crate) const FIRST_SIZE_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// (rows, columns) from a resize message (`{"Width":..,"Height":..}`).
pub(crate) fn terminal_size(msg: &[u8]) -> Option<(u16, u16)> {
    let size = serde_json::from_slice::<Value>(msg).ok()?;
    let h = u16::try_from(size.get("Height")?.as_u64()?).ok()?;
    let w = u16::try_from(size.get("Width")?.as_u64()?).ok()?;
    Some((h, w))
}

/// Sets a terminal's size from a resize message (`{"Width":..,"Height":..}`).
pub(crate) fn apply_resize(resize: &Option<Box<dyn Fn(u16, u16) + Send + Sync>>, msg: &[u8]) {
    if let (Some(resize), Some((rows, cols))) = (resize, terminal_size(msg)) {
        resize(rows, cols);
    }
}

async fn session(
    mut socket: WebSocket,
    process: ExecProcess,
    target: ExecTarget,
    v5: bool,
    want_stdout: bool,
    want_stderr: bool,
    early: Vec<Bytes>,
) {
    let ProcessIo {
        mut rx,
        input: in_tx,
        resize,
        tty,
        pid,
    } = start_io(process, &target);
    // Input that came while waiting for the terminal's size.
    for b in early {
        if b.first() == Some(&STDIN) {
            let _ = in_tx.send(Some(b[1..].to_vec()));
        }
    }
    let mut exited = None;
    // Once the process exited, its output is read to the end, or for a short while when
    // something it started still holds the stream (a terminal's slave, a pipe's end).
    let mut deadline: Option<tokio::time::Instant> = None;
    let client_gone = loop {
        let linger = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            msg = socket.recv() => match msg {
                Some(Ok(Message::Binary(b))) => match b.first() {
                    Some(&STDIN) => {
                        let _ = in_tx.send(Some(b[1..].to_vec()));
                    }
                    Some(&RESIZE) => apply_resize(&resize, &b[1..]),
                    Some(&CLOSE) if v5 && b.get(1) == Some(&STDIN) => {
                        let _ = in_tx.send(None);
                    }
                    _ => {}
                },
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break true,
                Some(Ok(_)) => {}
            },
            out = rx.recv() => match out {
                Some(Out::Data(channel, data)) => {
                    let wanted = match channel {
                        STDOUT => want_stdout || tty,
                        _ => want_stderr,
                    };
                    if wanted {
                        let mut frame = Vec::with_capacity(data.len() + 1);
                        frame.push(channel);
                        frame.extend_from_slice(&data);
                        if socket.send(Message::Binary(Bytes::from(frame))).await.is_err() {
                            break true;
                        }
                    }
                }
                Some(Out::Exited(status)) => {
                    exited = Some(status);
                    deadline = Some(tokio::time::Instant::now() + LINGER);
                }
                // The readers reached end of file and the waiter is done.
                None => break false,
            },
            _ = linger => break false,
        }
    };
    drop(in_tx);
    if client_gone {
        // Nothing is left behind by a client that dropped the stream mid-way.
        kill_group(pid);
        return;
    }
    finish(&mut socket, &exit_status(&target, exited)).await;
}

/// The final `Status` on the error channel: `Success`, or `NonZeroExitCode` with the code as
/// its cause, which kubectl turns into its own exit code.
pub(crate) fn exit_status(
    target: &ExecTarget,
    exited: Option<std::io::Result<std::process::ExitStatus>>,
) -> Value {
    use std::os::unix::process::ExitStatusExt;
    let code = match exited {
        Some(Ok(s)) => s
            .code()
            .or_else(|| s.signal().map(|sig| 128 + sig))
            .unwrap_or(1),
        _ => {
            return json!({"metadata": {}, "status": "Failure", "reason": "InternalError",
                          "message": "the process could not be waited for"});
        }
    };
    if code == 0 {
        return json!({"metadata": {}, "status": "Success"});
    }
    json!({
        "metadata": {},
        "status": "Failure",
        "message": format!(
            "command terminated with non-zero exit code: error executing command [{}], exit code {code}",
            target.command.join(" ")
        ),
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": code.to_string()}]},
    })
}

pub(crate) fn kill_group(pid: u32) {
    // The process leads its own session and group (the sandbox calls setsid).
    if let Err(e) = svcnet_netns::sandbox::signal_group(pid, true) {
        tracing::warn!("killing the exec'd process group {pid}: {e}");
    }
}
