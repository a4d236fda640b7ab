//! The `pods/attach` subresource (`kubectl attach`): the running process of a container,
//! streamed over the same WebSocket channel protocol as `pods/exec` (`v5.channel.k8s.io` or
//! `v4`; SPDY for kubectl 1.29 and earlier, see [`crate::execspdy`]): its output from the moment of attaching on channels 1 and 2, and with `-i` the
//! client's input on channel 0 to the container's stdin (which the container has only when
//! its spec says `stdin: true`). The stream ends with a `Success` status when the container's
//! run ends; a client that detaches leaves the container running. A container with `tty: true`
//! runs on a terminal: its output is one stream and the client's resizes reach it.

use axum::extract::FromRequestParts;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::json;

use crate::config::{AttachTarget, Attached};
use crate::exec::{
    CLOSE, PROTOCOLS, RESIZE, STDERR, STDIN, STDOUT, channel_protocol, finish, refuse_completed,
    stream_pod,
};
use crate::objects::meta_str;
use crate::request::ResourceRequest;
use crate::state::SharedState;
use crate::status::ApiError;

pub(crate) async fn serve(
    state: SharedState,
    req: ResourceRequest,
    mut parts: http::request::Parts,
) -> Result<Response, ApiError> {
    let (ns, name, pod, source) = stream_pod(
        &state,
        &req,
        &state.cfg.attach_source,
        "nothing can be attached to",
    )
    .await?;
    refuse_completed(&pod, "attach to")?;
    let q = &req.query.exec;
    if !q.stdin && !q.stdout && !q.stderr {
        return Err(ApiError::BadRequest(
            "you must specify at least 1 of stdin, stdout, stderr".into(),
        ));
    }
    let container = crate::logs::container_of(&pod, req.query.log.container.as_deref())?;
    let target = AttachTarget {
        namespace: ns,
        pod: name,
        uid: meta_str(&pod, "uid").unwrap_or("").to_string(),
        container,
        stdin: q.stdin,
    };
    if crate::spdyconn::wants_spdy(&parts.headers) {
        let channels = crate::execspdy::Channels {
            stdin: q.stdin,
            stdout: q.stdout,
            stderr: q.stderr,
            tty: q.tty,
        };
        let work = crate::execspdy::Work::Attach(source, target);
        return crate::execspdy::serve(&mut parts, work, channels);
    }
    let (offered, chosen) = channel_protocol(&parts.headers);
    let Some(protocol) = chosen else {
        return Err(ApiError::BadRequest(format!(
            "svcnet streams pods/attach over WebSocket ({}), which kubectl 1.30 and later speak; this request offered {offered:?}",
            PROTOCOLS.join(", ")
        )));
    };
    // Attaching to a container that is not running is an ordinary HTTP error kubectl prints.
    let attached = source.attach(&target).map_err(ApiError::BadRequest)?;
    let ws = WebSocketUpgrade::from_request_parts(&mut parts, &())
        .await
        .map_err(|e| ApiError::BadRequest(format!("pods/attach needs a WebSocket upgrade: {e}")))?;
    let v5 = protocol == PROTOCOLS[0];
    let (stdout, stderr) = (q.stdout, q.stderr);
    Ok(ws
        .protocols(PROTOCOLS)
        .on_upgrade(move |socket| session(socket, attached, v5, stdout, stderr))
        .into_response())
}

async fn session(mut socket: WebSocket, attached: Attached, v5: bool, stdout: bool, stderr: bool) {
    let Attached {
        mut output,
        stdin,
        resize,
    } = attached;
    loop {
        tokio::select! {
            msg = socket.recv() => match msg {
                Some(Ok(Message::Binary(b))) => match b.first() {
                    Some(&STDIN) => {
                        if let Some(tx) = &stdin {
                            let _ = tx.send(Some(b.slice(1..))).await;
                        }
                    }
                    Some(&CLOSE) if v5 && b.get(1) == Some(&STDIN) => {
                        if let Some(tx) = &stdin {
                            let _ = tx.send(None).await;
                        }
                    }
                    Some(&RESIZE) => crate::exec::apply_resize(&resize, &b[1..]),
                    _ => {}
                },
                // The client detached; the container runs on.
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => return,
                Some(Ok(_)) => {}
            },
            out = output.recv() => match out {
                Some((channel, data)) => {
                    let wanted = match channel {
                        STDOUT => stdout,
                        STDERR => stderr,
                        _ => false,
                    };
                    if wanted {
                        let mut frame = Vec::with_capacity(data.len() + 1);
                        frame.push(channel);
                        frame.extend_from_slice(&data);
                        if socket.send(Message::Binary(Bytes::from(frame))).await.is_err() {
                            return;
                        }
                    }
                }
                // The container's run ended.
                None => break,
            },
        }
    }
    finish(&mut socket, &json!({"metadata": {}, "status": "Success"})).await;
}
