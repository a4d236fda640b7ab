//! The UDP path: answers from the zone are computed and sent inline on the receiving task, with
//! no task spawn or channel hop per packet; only questions that need the upstream get a task.
//!
//! hickory-server's own UDP loop spawns a task and crosses two channels per packet, which cost
//! about a third of the throughput of a local-data resolver; TCP stays on hickory-server. The
//! parsing and encoding (EDNS size, truncation with TC) are still hickory's.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hickory_server::net::xfer::Protocol;
use hickory_server::server::Request;
use tokio::net::UdpSocket;
use tracing::debug;

use super::handler::{Handler, Step, encode_udp};

/// Largest request accepted; a question is far smaller, and EDNS options do not approach it.
const MAX_REQUEST: usize = 4096;

/// Serve `socket` until the task is aborted.
pub(crate) async fn serve_udp(socket: Arc<UdpSocket>, handler: Arc<Handler>) {
    let mut buf = vec![0u8; MAX_REQUEST];
    loop {
        let (n, src) = match socket.recv_from(&mut buf).await {
            Ok(received) => received,
            Err(error) => {
                debug!(%error, "UDP receive error");
                tokio::time::sleep(Duration::from_millis(1)).await;
                continue;
            }
        };
        let packet = &buf[..n];
        // Too short for a header, a response (never answer those: reflection), or no port to
        // answer to: drop silently.
        if n < 12 || packet[2] & 0x80 != 0 || src.port() == 0 {
            continue;
        }
        let request = match Request::from_bytes(packet.to_vec(), src, Protocol::Udp) {
            Ok(request) => request,
            Err(error) => {
                debug!(%src, %error, "malformed request: FORMERR");
                let _ = socket.send_to(&formerr(packet), src).await;
                continue;
            }
        };
        match handler.step(&request) {
            Step::Done(reply) => {
                send(&socket, &encode_udp(&request, &reply), src).await;
            }
            step => {
                let (socket, handler) = (socket.clone(), handler.clone());
                tokio::spawn(async move {
                    let reply = handler.finish(step).await;
                    send(&socket, &encode_udp(&request, &reply), src).await;
                });
            }
        }
    }
}

async fn send(socket: &UdpSocket, bytes: &[u8], to: SocketAddr) {
    if bytes.is_empty() {
        return;
    }
    if let Err(error) = socket.send_to(bytes, to).await {
        debug!(%to, %error, "UDP send error");
    }
}

/// A bare FORMERR header for a request whose header is readable but whose body is not: same ID,
/// opcode and RD, QR and RA set, no sections.
fn formerr(packet: &[u8]) -> [u8; 12] {
    let mut header = [0u8; 12];
    header[0] = packet[0];
    header[1] = packet[1];
    header[2] = 0x80 | (packet[2] & 0x79);
    header[3] = 0x80 | 0x01;
    header
}
