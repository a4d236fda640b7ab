//! The built-in test server, run for every container without a `command` (like Kubernetes'
//! agnhost/netexec images, so the seeds' nginx manifests work unchanged). It answers on each
//! declared container port:
//!
//! - TCP: HTTP/1.1, any path and method, `200 OK` with the body
//!   `pod=<name> ip=<pod ip> client=<client ip:port>\n` (tests read the client address to check
//!   source-IP preservation and masquerading), except `/echo`, answered with the request's
//!   body (up to 64 MiB), so a transfer can be checked byte for byte. Keep-alive is honoured.
//! - UDP: the same line as a datagram reply to every datagram.
//!
//! The agent starts it by re-executing the svcnet binary with `SVCNET_TESTSERVER=tcp:80,udp:53`
//! (plus `SVCNET_TESTSERVER_POD` and `SVCNET_TESTSERVER_IP`); the binary's `main` calls
//! [`run_if_requested`] before anything else. Plain threads, no async runtime: it must start
//! fast and stay small. On SIGTERM it behaves like a well-written server in a rolling update: it
//! keeps serving for a short drain (`SVCNET_TESTSERVER_DRAIN_MS`, default 5 s, well inside the default 30 s grace period) while the
//! proxies stop sending it new connections (its endpoint is already terminating), then exits 0.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::time::Duration;

use crate::runtime::spec::{TESTSERVER_ENV, TESTSERVER_IP_ENV, TESTSERVER_POD_ENV};

/// How long the test server keeps serving after SIGTERM: longer than the proxies' default
/// minimum sync period (1 s), so no new connection reaches it after it stops.
const DEFAULT_DRAIN: Duration = Duration::from_secs(5);

/// If `SVCNET_TESTSERVER` is set, runs the test server and never returns; otherwise returns.
pub fn run_if_requested() {
    let Ok(ports) = std::env::var(TESTSERVER_ENV) else {
        return;
    };
    let pod = std::env::var(TESTSERVER_POD_ENV)
        .unwrap_or_else(|_| std::env::var("HOSTNAME").unwrap_or_default());
    let ip = std::env::var(TESTSERVER_IP_ENV).unwrap_or_default();
    let drain = std::env::var("SVCNET_TESTSERVER_DRAIN_MS")
        .ok()
        .and_then(|ms| ms.parse().ok())
        .map_or(DEFAULT_DRAIN, Duration::from_millis);
    let drained = svcnet_netns::signals::on_sigterm(move || {
        eprintln!("svcnet test server: SIGTERM, draining for {drain:?}");
        std::thread::sleep(drain);
        std::process::exit(0);
    });
    if let Err(e) = drained {
        eprintln!("svcnet test server: cannot handle SIGTERM ({e}); it will end at once");
    }
    match serve(&ports, &pod, &ip) {
        Ok(()) => std::process::exit(0),
        Err(e) => {
            eprintln!("svcnet test server: {e}");
            std::process::exit(1)
        }
    }
}

/// The reply line for a client.
pub fn reply(pod: &str, ip: &str, client: SocketAddr) -> String {
    format!(
        "pod={pod} ip={ip} client={}:{}\n",
        client.ip().to_canonical(),
        client.port()
    )
}

/// Serves `ports` (`tcp:80,udp:53`) forever; fails if a port cannot be bound.
pub fn serve(ports: &str, pod: &str, ip: &str) -> std::io::Result<()> {
    let mut threads = Vec::new();
    for spec in ports.split(',').filter(|s| !s.is_empty()) {
        let (proto, port) = spec
            .split_once(':')
            .ok_or_else(|| std::io::Error::other(format!("bad port spec {spec:?}")))?;
        let port: u16 = port
            .parse()
            .map_err(|_| std::io::Error::other(format!("bad port in {spec:?}")))?;
        let (pod, ip) = (pod.to_string(), ip.to_string());
        match proto {
            "tcp" => {
                let listener = TcpListener::bind(("0.0.0.0", port))?;
                threads.push(std::thread::spawn(move || accept_loop(listener, &pod, &ip)));
            }
            "udp" => {
                let sock = UdpSocket::bind(("0.0.0.0", port))?;
                threads.push(std::thread::spawn(move || udp_loop(sock, &pod, &ip)));
            }
            other => return Err(std::io::Error::other(format!("unknown protocol {other:?}"))),
        }
    }
    eprintln!("svcnet test server: pod={pod} ip={ip} serving {ports}");
    if threads.is_empty() {
        // No ports: behave like a container that just runs.
        loop {
            std::thread::sleep(Duration::from_secs(3600));
        }
    }
    for t in threads {
        let _ = t.join();
    }
    Ok(())
}

fn accept_loop(listener: TcpListener, pod: &str, ip: &str) {
    for stream in listener.incoming().flatten() {
        let (pod, ip) = (pod.to_string(), ip.to_string());
        std::thread::spawn(move || {
            let _ = handle_http(stream, &pod, &ip);
        });
    }
}

/// The largest body `/echo` sends back.
const ECHO_LIMIT: usize = 64 << 20;

fn handle_http(stream: TcpStream, pod: &str, ip: &str) -> std::io::Result<()> {
    let peer = stream.peer_addr()?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut writer = stream.try_clone()?;
    let mut reader = BufReader::new(stream);
    loop {
        let mut request_line = String::new();
        if reader.read_line(&mut request_line)? == 0 {
            return Ok(());
        }
        let http10 = request_line.trim_end().ends_with("HTTP/1.0");
        let echo = request_line.split_whitespace().nth(1) == Some("/echo");
        let mut length = 0usize;
        let mut close = http10;
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line)? == 0 {
                return Ok(());
            }
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some((k, v)) = line.split_once(':') {
                let (k, v) = (k.trim().to_ascii_lowercase(), v.trim().to_ascii_lowercase());
                if k == "content-length" {
                    length = v.parse().unwrap_or(0);
                } else if k == "connection" {
                    close = v == "close";
                }
            }
        }
        let limit = if echo { ECHO_LIMIT } else { 1 << 20 };
        let mut body = vec![0u8; length.min(limit)];
        reader.read_exact(&mut body)?;
        let (kind, text) = if echo {
            ("application/octet-stream", body)
        } else {
            ("text/plain", reply(pod, ip, peer).into_bytes())
        };
        let head = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: {}\r\n\r\n",
            text.len(),
            if close { "close" } else { "keep-alive" }
        );
        writer.write_all(head.as_bytes())?;
        writer.write_all(&text)?;
        if close {
            return Ok(());
        }
    }
}

fn udp_loop(sock: UdpSocket, pod: &str, ip: &str) {
    let mut buf = [0u8; 2048];
    loop {
        if let Ok((_, peer)) = sock.recv_from(&mut buf) {
            let _ = sock.send_to(reply(pod, ip, peer).as_bytes(), peer);
        }
    }
}
