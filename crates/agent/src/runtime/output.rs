//! A container's stdio, as the kubelet's runtimes keep it: stdout and stderr are pipes the
//! agent reads, writing each line to the container's log file in the CRI logging format
//! (`<RFC 3339 time> <stdout|stderr> <F|P> <text>`, `F` ending a line, `P` a piece of a
//! longer one) and handing the raw bytes to clients attached at that moment (`kubectl
//! attach`). A container with `stdin: true` gets a pipe as stdin that stays open for its whole
//! run, so an attached client can write to it; one with `tty: true` runs on a terminal whose
//! master is read (one output stream, recorded as stdout), written and resized instead.
//!
//! Attachable containers are found in a registry of this process, keyed by pod uid and
//! container name: `svcnet up` runs the API server and the agents in one process.

use std::collections::HashMap;
use std::io::Write;
use std::sync::{Arc, LazyLock, Mutex};

use k8s_openapi::jiff::Timestamp;
use tokio::io::AsyncReadExt;
use tokio::sync::broadcast;

/// The stream numbers an attached client sees (the channel protocol's).
pub const STDOUT: u8 = 1;
pub const STDERR: u8 = 2;

/// A log line longer than this is written in pieces (`P`), as CRI runtimes do at 16 KiB.
const MAX_LINE: usize = 16 * 1024;
/// Output chunks an attached client may lag behind before it misses some.
const ATTACH_BACKLOG: usize = 256;

/// Where an attached client's input goes.
pub type Input = Box<dyn tokio::io::AsyncWrite + Send + Unpin>;

/// A running container's stdio, for attaching.
pub struct Attachable {
    output: broadcast::Sender<(u8, Vec<u8>)>,
    /// Its stdin, when the spec asked for one (`stdin: true`): a pipe, or the terminal.
    /// `None` inside once it was closed (`stdinOnce`).
    pub stdin: Option<Arc<tokio::sync::Mutex<Option<Input>>>>,
    /// Sets its terminal's rows and columns (`tty: true`).
    pub resize: Option<Box<dyn Fn(u16, u16) + Send + Sync>>,
    /// The spec's `stdinOnce`: the first attached client's end of input closes it.
    pub stdin_once: bool,
    /// The spec's `tty` (served without a terminal here).
    pub tty: bool,
}

impl Attachable {
    /// The container's output from now on, until its run ends.
    pub fn subscribe(&self) -> broadcast::Receiver<(u8, Vec<u8>)> {
        self.output.subscribe()
    }
}

type Key = (String, String);

static RUNNING: LazyLock<Mutex<HashMap<Key, Arc<Attachable>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

fn registry() -> std::sync::MutexGuard<'static, HashMap<Key, Arc<Attachable>>> {
    // A poisoned lock only means another thread panicked mid-insert; the map is still usable.
    RUNNING.lock().unwrap_or_else(|e| e.into_inner())
}

/// The running container `container` of the pod with `uid`, if this process runs it.
pub fn find(uid: &str, container: &str) -> Option<Arc<Attachable>> {
    registry()
        .get(&(uid.to_string(), container.to_string()))
        .cloned()
}

/// What the spec says about a container's stdin.
#[derive(Debug, Clone, Copy, Default)]
pub struct StdinSpec {
    pub stdin: bool,
    pub stdin_once: bool,
    pub tty: bool,
}

/// Takes the child's piped stdout, stderr (and stdin) and records them for container
/// `container` of pod `uid` into `log`, until both outputs end.
pub fn capture(
    child: &mut tokio::process::Child,
    terminal: Option<std::fs::File>,
    uid: &str,
    container: &str,
    log: std::fs::File,
    spec: StdinSpec,
) {
    let mut pumps: Vec<(u8, Box<dyn tokio::io::AsyncRead + Send + Unpin>)> = Vec::new();
    let mut stdin: Option<Input> = child.stdin.take().map(|s| Box::new(s) as Input);
    let mut resize: Option<Box<dyn Fn(u16, u16) + Send + Sync>> = None;
    if let Some(master) = terminal {
        // tokio reads and writes a file on its blocking pool, which suits a terminal's
        // blocking master.
        if let Ok(sizer) = master.try_clone() {
            resize = Some(Box::new(move |rows, cols| {
                let _ = svcnet_netns::pty::resize(&sizer, rows, cols);
            }));
        }
        if spec.stdin
            && let Ok(w) = master.try_clone()
        {
            stdin = Some(Box::new(tokio::fs::File::from_std(w)));
        }
        pumps.push((STDOUT, Box::new(tokio::fs::File::from_std(master))));
    }
    let stdin = stdin.map(|s| Arc::new(tokio::sync::Mutex::new(Some(s))));
    let (tx, _) = broadcast::channel(ATTACH_BACKLOG);
    let entry = Arc::new(Attachable {
        output: tx.clone(),
        stdin,
        resize,
        stdin_once: spec.stdin_once,
        tty: spec.tty,
    });
    let key = (uid.to_string(), container.to_string());
    registry().insert(key.clone(), entry.clone());
    let log = Arc::new(Mutex::new(log));
    let open = Arc::new(std::sync::atomic::AtomicUsize::new(2));
    if let Some(out) = child.stdout.take() {
        pumps.push((STDOUT, Box::new(out)));
    }
    if let Some(err) = child.stderr.take() {
        pumps.push((STDERR, Box::new(err)));
    }
    open.store(pumps.len(), std::sync::atomic::Ordering::SeqCst);
    for (stream, reader) in pumps {
        let (tx, log, open, key, entry) = (
            tx.clone(),
            log.clone(),
            open.clone(),
            key.clone(),
            entry.clone(),
        );
        tokio::spawn(async move {
            pump(reader, stream, &tx, &log).await;
            if open.fetch_sub(1, std::sync::atomic::Ordering::SeqCst) == 1 {
                // The run's output is over: attached clients see the end.
                let mut running = registry();
                if running.get(&key).is_some_and(|e| Arc::ptr_eq(e, &entry)) {
                    running.remove(&key);
                }
            }
        });
    }
}

async fn pump(
    mut reader: Box<dyn tokio::io::AsyncRead + Send + Unpin>,
    stream: u8,
    tx: &broadcast::Sender<(u8, Vec<u8>)>,
    log: &Mutex<std::fs::File>,
) {
    let name = if stream == STDOUT { "stdout" } else { "stderr" };
    let mut line = LineBuffer::default();
    let mut buf = vec![0u8; 32 * 1024];
    let mut failing = false;
    loop {
        let n = match reader.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        // Nobody attached is not an error.
        let _ = tx.send((stream, buf[..n].to_vec()));
        let records = line.push(&buf[..n], name, Timestamp::now());
        write_log(log, &records, &mut failing);
    }
    let records = line.finish(name, Timestamp::now());
    write_log(log, &records, &mut failing);
}

/// Appends records; a failure (a full disk) is reported once until writing works again, and
/// the container keeps running with its output still reaching attached clients.
fn write_log(log: &Mutex<std::fs::File>, records: &[u8], failing: &mut bool) {
    if records.is_empty() {
        return;
    }
    let mut file = log.lock().unwrap_or_else(|e| e.into_inner());
    match file.write_all(records) {
        Ok(()) => *failing = false,
        Err(e) if !*failing => {
            *failing = true;
            tracing::warn!("writing a container log: {e}; records are dropped until it works");
        }
        Err(_) => {}
    }
}

/// Cuts a stream's bytes into CRI log records.
#[derive(Debug, Default)]
pub struct LineBuffer {
    partial: Vec<u8>,
}

impl LineBuffer {
    /// The records completed by `data`, stamped `at`.
    pub fn push(&mut self, data: &[u8], stream: &str, at: Timestamp) -> Vec<u8> {
        let mut out = Vec::new();
        for piece in data.split_inclusive(|&b| b == b'\n') {
            self.partial.extend_from_slice(piece);
            if self.partial.ends_with(b"\n") {
                self.partial.pop();
                record(&mut out, at, stream, 'F', &self.partial);
                self.partial.clear();
            } else {
                while self.partial.len() >= MAX_LINE {
                    let rest = self.partial.split_off(MAX_LINE);
                    record(&mut out, at, stream, 'P', &self.partial);
                    self.partial = rest;
                }
            }
        }
        out
    }

    /// The record of a last line without its newline.
    pub fn finish(&mut self, stream: &str, at: Timestamp) -> Vec<u8> {
        let mut out = Vec::new();
        if !self.partial.is_empty() {
            record(&mut out, at, stream, 'P', &self.partial);
            self.partial.clear();
        }
        out
    }
}

fn record(out: &mut Vec<u8>, at: Timestamp, stream: &str, tag: char, text: &[u8]) {
    out.extend_from_slice(format!("{at} {stream} {tag} ").as_bytes());
    out.extend_from_slice(text);
    out.push(b'\n');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_become_cri_records() {
        let at: Timestamp = "2026-12-02T01:02:03.000000456Z".parse().unwrap();
        let mut b = LineBuffer::default();
        let out = b.push(b"one\ntw", "stdout", at);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "2026-12-02T01:02:03.000000456Z stdout F one\n"
        );
        let out = b.push(b"o\n\nthree", "stdout", at);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "2026-12-02T01:02:03.000000456Z stdout F two\n2026-12-02T01:02:03.000000456Z stdout F \n"
        );
        let out = b.finish("stdout", at);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "2026-12-02T01:02:03.000000456Z stdout P three\n"
        );
        // A very long line goes out in pieces.
        let long = vec![b'x'; MAX_LINE * 2 + 5];
        let out = b.push(&long, "stderr", at);
        assert_eq!(out.iter().filter(|&&c| c == b'\n').count(), 2);
        let out = b.push(b"\n", "stderr", at);
        assert!(
            String::from_utf8(out)
                .unwrap()
                .ends_with(" stderr F xxxxx\n")
        );
    }
}
