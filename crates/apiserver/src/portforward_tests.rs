//! The port-forward session driven as kubectl drives it, through its byte channels, with a
//! dialer onto loopback listeners of this test: replies, pairing by requestID, bytes both
//! ways with half-close, two connections at once, a refused port on the error stream, and
//! sockets closed when the session ends.
#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::net::TcpListener;
use std::time::Duration;

use super::*;
use crate::spdy::test_client::Client;

/// kubectl's side, with port-forward's stream headers.
trait PortForwardClient {
    async fn open(&mut self, stream: u32, kind: &str, port: &str, request: &str);
}

impl PortForwardClient for Client {
    async fn open(&mut self, stream: u32, kind: &str, port: &str, request: &str) {
        self.open_with(
            stream,
            &[
                ("streamType", &[kind]),
                ("port", &[port]),
                ("requestID", &[request]),
            ],
        )
        .await;
    }
}

fn session() -> Client {
    session_with(PAIR_TIMEOUT)
}

fn session_with(pair_timeout: Duration) -> Client {
    let source = PortForwardSource::new(|t| {
        std::net::TcpStream::connect(("127.0.0.1", t.port)).map_err(|e| format!("dial: {e}"))
    });
    let pod = PodRef {
        namespace: "default".into(),
        pod: "web".into(),
        uid: "u1".into(),
    };
    let (to_server, input) = mpsc::channel(QUEUE);
    let (out, from_server) = mpsc::channel(QUEUE);
    let mut session = Session::new(source, pod, out);
    session.pair_timeout = pair_timeout;
    tokio::spawn(session.run(input));
    Client::new(to_server, from_server)
}

/// A one-connection-at-a-time upper-casing echo server; returns its port.
fn upper_echo() -> (u16, std::sync::mpsc::Receiver<()>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let (closed_tx, closed) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for conn in l.incoming() {
            let mut conn = conn.unwrap();
            let closed_tx = closed_tx.clone();
            std::thread::spawn(move || {
                let mut all = Vec::new();
                let mut buf = [0u8; 4096];
                // Echo upper-cased until the client's end of file (or its socket closing).
                while let Ok(n) = conn.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    all.extend_from_slice(&buf[..n]);
                    let _ = conn.write_all(&buf[..n].to_ascii_uppercase());
                }
                let _ = closed_tx.send(());
            });
        }
    });
    (port, closed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_are_paired_forwarded_and_finished() {
    let (port, closed) = upper_echo();
    let port = port.to_string();
    let mut c = session();
    // Two connections open at once, their streams interleaved.
    c.open(1, "error", &port, "0").await;
    c.open(3, "data", &port, "0").await;
    c.open(5, "error", &port, "1").await;
    c.open(7, "data", &port, "1").await;
    c.data(3, b"hello ", false).await;
    c.data(7, &vec![b'z'; 5000], false).await;
    c.data(3, b"world", true).await;
    let (got, replies) = c.read_stream(3).await;
    assert_eq!(got, b"HELLO WORLD");
    assert!(replies.len() >= 2, "{replies:?}");
    // The other connection is still open; its error stream finishes empty after its data.
    c.data(7, b"!", true).await;
    let (got, _) = c.read_stream(7).await;
    assert_eq!(got.len(), 5001);
    assert!(got.starts_with(b"ZZZ") && got.ends_with(b"!"));
    closed.recv_timeout(Duration::from_secs(5)).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_port_is_described_on_the_error_stream() {
    let free = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = free.local_addr().unwrap().port().to_string();
    drop(free);
    let mut c = session();
    c.open(1, "error", &port, "0").await;
    c.open(3, "data", &port, "0").await;
    c.data(1, b"", true).await;
    let (msg, _) = c.read_stream(1).await;
    let msg = String::from_utf8(msg).unwrap();
    assert!(
        msg.starts_with(&format!(
            "error forwarding port {port} to pod default/web, uid u1: dial:"
        )),
        "{msg}"
    );
    // A port that is not a number is refused the same way.
    c.open(5, "error", "http", "1").await;
    c.open(7, "data", "http", "1").await;
    let (msg, _) = c.read_stream(5).await;
    assert!(String::from_utf8(msg).unwrap().contains("invalid port"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ending_the_session_closes_its_sockets_and_pings_are_answered() {
    let (port, closed) = upper_echo();
    let port = port.to_string();
    let mut c = session();
    let mut b = Vec::new();
    Frame::Ping { id: 7 }.encode(&mut b).unwrap();
    c.to_server.send(Bytes::from(b)).await.unwrap();
    assert_eq!(c.frame().await, Frame::Ping { id: 7 });
    c.open(1, "error", &port, "0").await;
    c.open(3, "data", &port, "0").await;
    c.data(3, b"x", false).await;
    loop {
        if let Frame::Data {
            stream: 3, data, ..
        } = c.frame().await
        {
            assert_eq!(&data[..], b"X");
            break;
        }
    }
    // The client goes away without finishing its stream: the pod's socket is closed.
    drop(c);
    closed.recv_timeout(Duration::from_secs(5)).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_ends_the_session_with_a_goaway() {
    let mut c = session();
    c.to_server
        .send(Bytes::from_static(&[0x80, 2, 0, 1, 0, 0, 0, 0]))
        .await
        .unwrap();
    assert!(matches!(c.frame().await, Frame::GoAway { status: 1, .. }));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_missing_its_data_stream_is_given_up() {
    let mut c = session_with(Duration::from_millis(300));
    c.open(1, "error", "80", "0").await;
    // Past the pair timeout, the error stream says why.
    let (msg, _) = c.read_stream(1).await;
    assert_eq!(
        String::from_utf8(msg).unwrap(),
        "timed out waiting for the data stream of port-forward request 0"
    );
}
