//! The `pods/portforward` subresource (`kubectl port-forward`): TCP connections to a pod's
//! ports, multiplexed over one SPDY/3.1 session, the way the kubelet serves them.
//!
//! Two carriers, one session: kubectl 1.31 and later open a WebSocket with the subprotocol
//! `SPDY/3.1+portforward.k8s.io` and send SPDY frames inside binary messages (KEP-4006);
//! earlier ones (or any with `KUBECTL_PORT_FORWARD_WEBSOCKETS=false`) upgrade the HTTP/1.1
//! connection itself with `Upgrade: SPDY/3.1` and `X-Stream-Protocol-Version:
//! portforward.k8s.io`.
//!
//! Per local connection kubectl opens two streams with the same `requestID` header: an error
//! stream (it half-closes it at once and reads it to the end) and a data stream (`port`
//! header). Once both exist the server connects to the port on the pod's loopback inside its
//! network namespace and copies bytes both ways; a connection that cannot be made is described
//! on the error stream, which kubectl prints. Both streams are then finished. A session that
//! ends (the client went away) aborts its connections, closing their sockets.

use std::collections::HashMap;

use axum::extract::FromRequestParts;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use http::header;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use crate::config::{PortForwardSource, PortForwardTarget};
use crate::objects::meta_str;
use crate::request::ResourceRequest;
use crate::spdy::frame::{self, FLAG_FIN, Frame};
use crate::spdy::headers::{self, HeaderCodec};
use crate::spdyconn::{self, QUEUE, SPDY_UPGRADE, header_values};
use crate::state::SharedState;
use crate::status::ApiError;

/// The stream protocol kubectl and the kubelet speak inside SPDY.
const PROTOCOL: &str = "portforward.k8s.io";
/// The WebSocket subprotocol that tunnels SPDY (KEP-4006).
const TUNNEL_PROTOCOL: &str = "SPDY/3.1+portforward.k8s.io";
/// Largest data frame sent, and the read size from a pod's socket.
const CHUNK: usize = 32 * 1024;
/// A peer's frame larger than this ends the session (SPDY allows 16 MiB; kubectl sends 32 KiB).
const MAX_FRAME: usize = 1 << 20;
/// How long the two streams of one connection may arrive apart (the kubelet's stream creation
/// timeout).
const PAIR_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// How the session's bytes travel.
enum Carrier {
    Spdy(hyper::upgrade::OnUpgrade),
    WebSocket(Box<WebSocketUpgrade>),
}

pub(crate) async fn serve(
    state: SharedState,
    req: ResourceRequest,
    mut parts: http::request::Parts,
) -> Result<Response, ApiError> {
    let (ns, name, pod, source) = crate::exec::stream_pod(
        &state,
        &req,
        &state.cfg.port_forward_source,
        "no pod port can be forwarded",
    )
    .await?;
    let phase = pod
        .pointer("/status/phase")
        .and_then(Value::as_str)
        .unwrap_or("Pending");
    if phase != "Running" {
        return Err(ApiError::BadRequest(format!(
            "unable to forward port because pod {ns}/{name} is not running. Current status={phase}"
        )));
    }
    let carrier = negotiate(&mut parts).await?;
    let pod_ref = PodRef {
        namespace: ns,
        pod: name,
        uid: meta_str(&pod, "uid").unwrap_or("").to_string(),
    };
    match carrier {
        Carrier::WebSocket(ws) => Ok(ws
            .protocols([TUNNEL_PROTOCOL])
            .on_upgrade(move |socket| websocket_session(socket, source, pod_ref))
            .into_response()),
        Carrier::Spdy(on_upgrade) => {
            spdyconn::spawn_upgraded(on_upgrade, move |input, out| {
                Session::new(source, pod_ref, out).run(input)
            });
            Ok(spdyconn::switching_protocols(PROTOCOL))
        }
    }
}

/// Picks the carrier the client asked for, with upstream's refusals.
async fn negotiate(parts: &mut http::request::Parts) -> Result<Carrier, ApiError> {
    let upgrade = parts
        .headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    if upgrade.eq_ignore_ascii_case("websocket") {
        let offered = header_values(&parts.headers, "sec-websocket-protocol");
        if !offered.contains(&TUNNEL_PROTOCOL) {
            return Err(ApiError::BadRequest(format!(
                "unable to upgrade: pods/portforward over WebSocket needs the subprotocol {TUNNEL_PROTOCOL}; offered {offered:?}"
            )));
        }
        let ws = WebSocketUpgrade::from_request_parts(parts, &())
            .await
            .map_err(|e| ApiError::BadRequest(format!("unable to upgrade: {e}")))?;
        return Ok(Carrier::WebSocket(Box::new(ws)));
    }
    if upgrade.eq_ignore_ascii_case(SPDY_UPGRADE) {
        let (_, on_upgrade) = spdyconn::handshake(parts, &[PROTOCOL])?;
        return Ok(Carrier::Spdy(on_upgrade));
    }
    Err(ApiError::BadRequest(format!(
        "unable to upgrade connection: pods/portforward is served over SPDY/3.1 (Upgrade: {SPDY_UPGRADE}) or WebSocket ({TUNNEL_PROTOCOL}); this request asked for {:?}",
        if upgrade.is_empty() {
            "no upgrade"
        } else {
            upgrade.as_str()
        }
    )))
}

/// The pod a session forwards into.
#[derive(Debug, Clone)]
struct PodRef {
    namespace: String,
    pod: String,
    uid: String,
}

async fn websocket_session(socket: WebSocket, source: PortForwardSource, pod: PodRef) {
    let (mut sink, mut stream) = socket.split();
    let (in_tx, in_rx) = mpsc::channel::<Bytes>(QUEUE);
    let (out_tx, mut out_rx) = mpsc::channel::<Bytes>(QUEUE);
    let read = async move {
        while let Some(Ok(msg)) = stream.next().await {
            let sent = match msg {
                Message::Binary(b) => in_tx.send(b).await.is_ok(),
                Message::Close(_) => false,
                _ => true,
            };
            if !sent {
                return;
            }
        }
    };
    let write = async move {
        while let Some(b) = out_rx.recv().await {
            if sink.send(Message::Binary(b)).await.is_err() {
                return;
            }
        }
        let _ = sink.close().await;
    };
    let session = Session::new(source, pod, out_tx);
    tokio::join!(read, session.run(in_rx), write);
}

/// The two streams of one forwarded connection, as they arrive.
struct Pair {
    /// When its first stream arrived.
    opened: tokio::time::Instant,
    error: Option<u32>,
    data: Option<u32>,
    port: Option<String>,
    /// Bytes from the client for the data stream, until the connection task takes them.
    input: Option<(mpsc::Sender<Bytes>, mpsc::Receiver<Bytes>)>,
}

/// One SPDY session: the streams kubectl opens, paired into forwarded connections.
struct Session {
    source: PortForwardSource,
    pod: PodRef,
    out: mpsc::Sender<Bytes>,
    codec: HeaderCodec,
    pending: HashMap<String, Pair>,
    /// The client's bytes for each live data stream.
    inputs: HashMap<u32, mpsc::Sender<Bytes>>,
    /// The task of each live connection, by its data stream and error stream.
    tasks: JoinSet<(u32, u32)>,
    task_of: HashMap<u32, tokio::task::AbortHandle>,
    /// [`PAIR_TIMEOUT`], shorter in tests.
    pair_timeout: std::time::Duration,
}

impl Session {
    fn new(source: PortForwardSource, pod: PodRef, out: mpsc::Sender<Bytes>) -> Self {
        Session {
            source,
            pod,
            out,
            codec: HeaderCodec::new(),
            pending: HashMap::new(),
            inputs: HashMap::new(),
            tasks: JoinSet::new(),
            task_of: HashMap::new(),
            pair_timeout: PAIR_TIMEOUT,
        }
    }

    /// Reads frames until the client's bytes end, a GOAWAY, or a protocol error; then every
    /// connection is aborted (the JoinSet's drop), closing its socket.
    async fn run(mut self, mut input: mpsc::Receiver<Bytes>) {
        let mut buf: Vec<u8> = Vec::new();
        let mut sweep = tokio::time::interval(self.pair_timeout / 6);
        loop {
            let chunk = tokio::select! {
                chunk = input.recv() => chunk,
                _ = sweep.tick() => {
                    self.expire_pairs().await;
                    continue;
                }
            };
            let Some(chunk) = chunk else { return };
            buf.extend_from_slice(&chunk);
            loop {
                match frame::parse(&buf) {
                    Ok(Some((f, used))) => {
                        buf.drain(..used);
                        if !self.handle(f).await {
                            return;
                        }
                    }
                    Ok(None) if buf.len() > MAX_FRAME + frame::HEADER_LEN => {
                        tracing::debug!("port-forward: a frame larger than {MAX_FRAME} bytes");
                        self.go_away(1).await;
                        return;
                    }
                    Ok(None) => break,
                    Err(e) => {
                        tracing::debug!("port-forward: {e}");
                        self.go_away(1).await;
                        return;
                    }
                }
            }
            // Reap finished connections so long sessions do not accumulate them.
            while let Some(done) = self.tasks.try_join_next() {
                if let Ok((error, data)) = done {
                    self.task_of.remove(&error);
                    self.task_of.remove(&data);
                }
            }
        }
    }

    /// A connection whose second stream never came is given up after [`PAIR_TIMEOUT`], as the
    /// kubelet does: the reason on its error stream, its data stream reset.
    async fn expire_pairs(&mut self) {
        let now = tokio::time::Instant::now();
        let expired: Vec<String> = self
            .pending
            .iter()
            .filter(|(_, p)| now.duration_since(p.opened) >= self.pair_timeout)
            .map(|(r, _)| r.clone())
            .collect();
        for request in expired {
            let Some(pair) = self.pending.remove(&request) else {
                continue;
            };
            if let Some(error) = pair.error {
                let msg = format!(
                    "timed out waiting for the data stream of port-forward request {request}"
                );
                let frames = frame::data_frames(error, msg.as_bytes(), true, CHUNK);
                let _ = self.out.send(Bytes::from(frames)).await;
            }
            if let Some(data) = pair.data {
                self.inputs.remove(&data);
                self.send(Frame::RstStream {
                    stream: data,
                    status: frame::RST_INTERNAL_ERROR,
                })
                .await;
            }
        }
    }

    async fn send(&self, f: Frame) {
        let mut b = Vec::new();
        if f.encode(&mut b).is_ok() {
            let _ = self.out.send(Bytes::from(b)).await;
        }
    }

    async fn go_away(&self, status: u32) {
        self.send(Frame::GoAway {
            last_good: 0,
            status,
        })
        .await;
    }

    /// Handles one frame; false ends the session.
    async fn handle(&mut self, f: Frame) -> bool {
        match f {
            Frame::SynStream {
                stream,
                flags,
                headers,
                ..
            } => {
                let list = match self.codec.decode(&headers) {
                    Ok(l) => l,
                    Err(e) => {
                        // The shared zlib context is now unusable: the session cannot go on.
                        tracing::debug!("port-forward: {e}");
                        self.go_away(1).await;
                        return false;
                    }
                };
                self.open(stream, flags, &list).await;
            }
            Frame::Data { stream, fin, data } => {
                if let Some(tx) = self.inputs.get(&stream) {
                    if !data.is_empty() && tx.send(data).await.is_err() {
                        self.inputs.remove(&stream);
                    }
                    if fin {
                        // The client's end of file: the connection's write side closes.
                        self.inputs.remove(&stream);
                    }
                }
            }
            Frame::RstStream { stream, .. } => {
                self.inputs.remove(&stream);
                if let Some(task) = self.task_of.remove(&stream) {
                    task.abort();
                }
            }
            Frame::Ping { id } => self.send(Frame::Ping { id }).await,
            Frame::GoAway { .. } => return false,
            Frame::Headers { headers, .. } | Frame::SynReply { headers, .. } => {
                // Read to keep the zlib context in step; nothing here needs them.
                if self.codec.decode(&headers).is_err() {
                    self.go_away(1).await;
                    return false;
                }
            }
            Frame::Settings { .. } | Frame::WindowUpdate { .. } | Frame::Unknown { .. } => {}
        }
        true
    }

    /// A stream the client opened: replied to, then paired with its sibling by `requestID`.
    async fn open(&mut self, stream: u32, flags: u8, list: &headers::HeaderList) {
        let reply = match self.codec.encode(&[]) {
            Ok(block) => Frame::SynReply {
                stream,
                flags: 0,
                headers: Bytes::from(block),
            },
            Err(_) => Frame::RstStream {
                stream,
                status: frame::RST_INTERNAL_ERROR,
            },
        };
        self.send(reply).await;
        let kind = headers::first(list, "streamtype").unwrap_or("");
        // Clients older than requestID pair by stream id (data = error + 2), as the kubelet did.
        let request = match headers::first(list, "requestid") {
            Some(r) => r.to_string(),
            None if kind == "data" => stream.saturating_sub(2).to_string(),
            None => stream.to_string(),
        };
        let pair = self.pending.entry(request.clone()).or_insert_with(|| Pair {
            opened: tokio::time::Instant::now(),
            error: None,
            data: None,
            port: None,
            input: None,
        });
        match kind {
            "error" => pair.error = Some(stream),
            "data" => {
                pair.data = Some(stream);
                pair.port = headers::first(list, "port").map(str::to_string);
                let (tx, rx) = mpsc::channel(QUEUE);
                if flags & FLAG_FIN == 0 {
                    self.inputs.insert(stream, tx.clone());
                }
                pair.input = Some((tx, rx));
            }
            other => {
                tracing::debug!("port-forward: stream {stream} of unknown type {other:?}");
                self.send(Frame::RstStream {
                    stream,
                    status: frame::RST_PROTOCOL_ERROR,
                })
                .await;
                return;
            }
        }
        let complete = matches!(
            pair,
            Pair {
                error: Some(_),
                data: Some(_),
                ..
            }
        );
        if !complete {
            return;
        }
        let Some(pair) = self.pending.remove(&request) else {
            return;
        };
        let (Some(error), Some(data), Some((_, rx))) = (pair.error, pair.data, pair.input) else {
            return;
        };
        let conn = Connection {
            source: self.source.clone(),
            pod: self.pod.clone(),
            port: pair.port.unwrap_or_default(),
            error,
            data,
            out: self.out.clone(),
        };
        let handle = self.tasks.spawn(conn.run(rx));
        self.task_of.insert(data, handle.clone());
        self.task_of.insert(error, handle);
    }
}

/// One forwarded connection: the pod's socket and its two streams.
struct Connection {
    source: PortForwardSource,
    pod: PodRef,
    port: String,
    error: u32,
    data: u32,
    out: mpsc::Sender<Bytes>,
}

impl Connection {
    async fn finish(&self, message: Option<String>) {
        let mut b = Vec::new();
        if let Some(m) = message {
            b.extend(frame::data_frames(self.error, m.as_bytes(), false, CHUNK));
        }
        b.extend(frame::data_frames(self.error, &[], true, CHUNK));
        b.extend(frame::data_frames(self.data, &[], true, CHUNK));
        let _ = self.out.send(Bytes::from(b)).await;
    }

    /// Forwards until either side ends; returns its streams (error, data).
    async fn run(self, input: mpsc::Receiver<Bytes>) -> (u32, u32) {
        let ids = (self.error, self.data);
        self.forward(input).await;
        ids
    }

    async fn forward(self, mut input: mpsc::Receiver<Bytes>) {
        let pod = &self.pod;
        let port = match self.port.parse::<u16>() {
            Ok(p) if p > 0 => p,
            _ => {
                let msg = format!(
                    "error forwarding port {:?} to pod {}/{}, uid {}: invalid port: it must be 1-65535",
                    self.port, pod.namespace, pod.pod, pod.uid
                );
                return self.finish(Some(msg)).await;
            }
        };
        let target = PortForwardTarget {
            namespace: pod.namespace.clone(),
            pod: pod.pod.clone(),
            uid: pod.uid.clone(),
            port,
        };
        let source = self.source.clone();
        let dialed = tokio::task::spawn_blocking(move || source.dial(&target))
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r)
            .and_then(|s| {
                s.set_nonblocking(true).map_err(|e| e.to_string())?;
                tokio::net::TcpStream::from_std(s).map_err(|e| e.to_string())
            });
        let socket = match dialed {
            Ok(s) => s,
            Err(e) => {
                let msg = format!(
                    "error forwarding port {port} to pod {}/{}, uid {}: {e}",
                    pod.namespace, pod.pod, pod.uid
                );
                return self.finish(Some(msg)).await;
            }
        };
        let (mut from_pod, mut to_pod) = socket.into_split();
        let upload = async move {
            while let Some(b) = input.recv().await {
                if to_pod.write_all(&b).await.is_err() {
                    return;
                }
            }
            // The client's end of file, passed on.
            let _ = to_pod.shutdown().await;
            std::future::pending::<()>().await;
        };
        let data = self.data;
        let out = self.out.clone();
        let download = async move {
            let mut buf = vec![0u8; CHUNK];
            loop {
                match from_pod.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => {
                        let frames = frame::data_frames(data, &buf[..n], false, CHUNK);
                        if out.send(Bytes::from(frames)).await.is_err() {
                            return;
                        }
                    }
                }
            }
        };
        // The connection is over when the pod's side ends (the client's end was passed on).
        tokio::select! {
            () = upload => {}
            () = download => {}
        }
        self.finish(None).await;
    }
}

#[cfg(test)]
#[path = "portforward_tests.rs"]
mod tests;
