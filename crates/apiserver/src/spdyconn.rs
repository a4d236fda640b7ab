//! The HTTP side of SPDY streams: the `Upgrade: SPDY/3.1` handshake with its
//! `X-Stream-Protocol-Version` negotiation (upstream's `httpstream.Handshake`), and the upgraded
//! connection turned into two byte channels a session reads and writes, so one session serves
//! whatever carries its bytes (the upgraded connection, or a WebSocket tunnel).

use axum::response::Response;
use bytes::Bytes;
use http::{HeaderValue, StatusCode, header};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

use crate::status::ApiError;

pub(crate) const SPDY_UPGRADE: &str = "SPDY/3.1";
pub(crate) const PROTOCOL_HEADER: &str = "x-stream-protocol-version";
/// Chunks queued each way.
pub(crate) const QUEUE: usize = 64;
const READ_CHUNK: usize = 32 * 1024;

/// The comma-separated values of every `name` header.
pub(crate) fn header_values<'a>(headers: &'a http::HeaderMap, name: &str) -> Vec<&'a str> {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .collect()
}

/// Whether the request asks to upgrade to SPDY/3.1.
pub(crate) fn wants_spdy(headers: &http::HeaderMap) -> bool {
    headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case(SPDY_UPGRADE))
}

/// Picks the first of `supported` the client offers (a client offering none gets the first,
/// as upstream allows) and takes the connection's upgrade.
pub(crate) fn handshake(
    parts: &mut http::request::Parts,
    supported: &[&'static str],
) -> Result<(&'static str, hyper::upgrade::OnUpgrade), ApiError> {
    let offered = header_values(&parts.headers, PROTOCOL_HEADER);
    let chosen = if offered.is_empty() {
        supported.first().copied()
    } else {
        supported.iter().copied().find(|p| offered.contains(p))
    };
    let Some(chosen) = chosen else {
        return Err(ApiError::Forbidden(format!(
            "unable to upgrade: unable to negotiate protocol: client supports {offered:?}, server accepts {supported:?}"
        )));
    };
    let on_upgrade = parts
        .extensions
        .remove::<hyper::upgrade::OnUpgrade>()
        .ok_or_else(|| {
            ApiError::BadRequest(
                "unable to upgrade: this connection cannot be upgraded (SPDY needs HTTP/1.1)"
                    .into(),
            )
        })?;
    Ok((chosen, on_upgrade))
}

/// The 101 answer to a SPDY upgrade.
pub(crate) fn switching_protocols(protocol: &'static str) -> Response {
    let mut resp = Response::new(axum::body::Body::empty());
    *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = resp.headers_mut();
    h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    h.insert(header::UPGRADE, HeaderValue::from_static(SPDY_UPGRADE));
    h.insert(PROTOCOL_HEADER, HeaderValue::from_static(protocol));
    resp
}

/// Runs `session` over the upgraded connection once the 101 is out: it reads the client's
/// bytes from the receiver (which ends with the connection) and writes into the sender; the
/// connection is shut down when everything the session and its tasks sent is written.
pub(crate) fn spawn_upgraded<F, Fut>(on_upgrade: hyper::upgrade::OnUpgrade, session: F)
where
    F: FnOnce(mpsc::Receiver<Bytes>, mpsc::Sender<Bytes>) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    tokio::spawn(async move {
        let upgraded = match on_upgrade.await {
            Ok(u) => u,
            Err(e) => {
                tracing::debug!("SPDY upgrade failed: {e}");
                return;
            }
        };
        let io = hyper_util::rt::TokioIo::new(upgraded);
        let (mut reader, mut writer) = tokio::io::split(io);
        let (in_tx, in_rx) = mpsc::channel::<Bytes>(QUEUE);
        let (out_tx, mut out_rx) = mpsc::channel::<Bytes>(QUEUE);
        let read = async move {
            let mut buf = vec![0u8; READ_CHUNK];
            loop {
                match reader.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => {
                        if in_tx.send(Bytes::copy_from_slice(&buf[..n])).await.is_err() {
                            return;
                        }
                    }
                }
            }
        };
        let write = async move {
            while let Some(b) = out_rx.recv().await {
                if writer.write_all(&b).await.is_err() {
                    return;
                }
            }
            let _ = writer.shutdown().await;
        };
        // The reader stops with the connection, or at its next chunk once the session is over
        // (the writer's shutdown makes the client close).
        tokio::join!(read, session(in_rx, out_tx), write);
    });
}
