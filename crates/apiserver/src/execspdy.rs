//! `pods/exec` and `pods/attach` over SPDY/3.1, for kubectl 1.29 and earlier (and later ones
//! whose WebSocket attempt fails): remotecommand's `v4.channel.k8s.io` protocol. The client
//! opens one stream per channel, named by its `streamType` header: `error` always, `stdin`,
//! `stdout` and `stderr` as the query asks (no `stderr` with a terminal), and `resize` with a
//! terminal (`{"Width","Height"}` JSON, one per line). Once all have arrived the process starts
//! (or the container is attached to); when it ends, stdout and stderr are finished and the
//! final `Status` is written on the error stream, then the session goes away. A client that
//! drops the session takes an exec'd process group with it.

use bytes::Bytes;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::config::{AttachSource, AttachTarget, ExecSource, ExecTarget};
use crate::exec::{self, Out, ProcessIo};
use crate::spdy::frame::{self, Frame};
use crate::spdy::headers::{self, HeaderCodec};
use crate::spdyconn;
use crate::status::ApiError;

/// The one remotecommand version served over SPDY (kubectl 1.27-1.29 all offer it).
const PROTOCOL: &str = "v4.channel.k8s.io";
const CHUNK: usize = 32 * 1024;
/// How long the client may take to open its streams.
const STREAM_CREATION_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// What the streams are for.
pub(crate) enum Work {
    Exec(ExecSource, ExecTarget),
    Attach(AttachSource, AttachTarget),
}

/// Which channels the query asked for.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Channels {
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
    pub tty: bool,
}

impl Channels {
    fn expected(self) -> usize {
        1 + usize::from(self.stdin)
            + usize::from(self.stdout)
            + usize::from(self.stderr && !self.tty)
            + usize::from(self.tty)
    }
}

/// Answers a SPDY upgrade for `work`.
pub(crate) fn serve(
    parts: &mut http::request::Parts,
    work: Work,
    channels: Channels,
) -> Result<axum::response::Response, ApiError> {
    let (protocol, on_upgrade) = spdyconn::handshake(parts, &[PROTOCOL])?;
    spdyconn::spawn_upgraded(on_upgrade, move |input, out| {
        Session::new(out, channels).run(input, work)
    });
    Ok(spdyconn::switching_protocols(protocol))
}

/// The running side: a process, or an attached container.
enum Running {
    Process(ProcessIo),
    Attached {
        output: mpsc::Receiver<(u8, Bytes)>,
        stdin: Option<mpsc::Sender<Option<Bytes>>>,
        resize: Option<Box<dyn Fn(u16, u16) + Send + Sync>>,
    },
}

struct Session {
    out: mpsc::Sender<Bytes>,
    codec: HeaderCodec,
    channels: Channels,
    /// Stream ids by `streamType`.
    streams: Vec<(String, u32)>,
    resize_buf: Vec<u8>,
    /// The exec'd command, for its exit status.
    target: Option<ExecTarget>,
    /// A terminal's size sent before the process started (kubectl sends it first).
    first_size: Option<(u16, u16)>,
    /// Input that came before the process started (`None`: end of input).
    early_stdin: Vec<Option<Vec<u8>>>,
}

impl Session {
    fn new(out: mpsc::Sender<Bytes>, channels: Channels) -> Self {
        Session {
            out,
            codec: HeaderCodec::new(),
            channels,
            streams: Vec::new(),
            resize_buf: Vec::new(),
            target: None,
            first_size: None,
            early_stdin: Vec::new(),
        }
    }

    fn stream(&self, kind: &str) -> Option<u32> {
        self.streams
            .iter()
            .find(|(k, _)| k == kind)
            .map(|(_, id)| *id)
    }

    async fn send(&self, bytes: Vec<u8>) -> bool {
        self.out.send(Bytes::from(bytes)).await.is_ok()
    }

    async fn run(mut self, mut input: mpsc::Receiver<Bytes>, work: Work) {
        let mut buf: Vec<u8> = Vec::new();
        let mut work = Some(work);
        let mut running: Option<Running> = None;
        let mut exited = None;
        // Until the process runs, the deadline is for the client's streams (the kubelet's 30 s).
        let mut deadline = Some(tokio::time::Instant::now() + STREAM_CREATION_TIMEOUT);
        // A terminal session starts its process once the client's first size came, or after
        // a short wait (`stty size` run at once would otherwise see 24 80 before the resize).
        let mut start_at: Option<tokio::time::Instant> = None;
        loop {
            let start_due = async {
                match start_at {
                    Some(d) => tokio::time::sleep_until(d).await,
                    None => std::future::pending().await,
                }
            };
            let linger = async {
                match deadline {
                    Some(d) => tokio::time::sleep_until(d).await,
                    None => std::future::pending().await,
                }
            };
            let output = async {
                match running.as_mut() {
                    Some(Running::Process(io)) => io.rx.recv().await,
                    Some(Running::Attached { output, .. }) => output
                        .recv()
                        .await
                        .map(|(ch, data)| Out::Data(ch, data.to_vec())),
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                chunk = input.recv() => {
                    let Some(chunk) = chunk else { return self.gone(running) };
                    buf.extend_from_slice(&chunk);
                    loop {
                        match frame::parse(&buf) {
                            Ok(Some((f, used))) => {
                                buf.drain(..used);
                                if !self.handle(f, &mut running).await {
                                    return self.gone(running);
                                }
                            }
                            Ok(None) => break,
                            Err(e) => {
                                tracing::debug!("exec over SPDY: {e}");
                                return self.gone(running);
                            }
                        }
                    }
                    if running.is_none() && self.streams.len() >= self.channels.expected() {
                        let waits_for_size = self.channels.tty
                            && self.first_size.is_none()
                            && matches!(work, Some(Work::Exec(..)));
                        if waits_for_size {
                            start_at.get_or_insert_with(|| {
                                tokio::time::Instant::now() + exec::FIRST_SIZE_WAIT
                            });
                        } else {
                            let Some(r) = self.begin(work.take()).await else { return };
                            running = Some(r);
                            (deadline, start_at) = (None, None);
                        }
                    }
                }
                () = start_due => {
                    let Some(r) = self.begin(work.take()).await else { return };
                    running = Some(r);
                    (deadline, start_at) = (None, None);
                }
                out = output => match out {
                    Some(Out::Data(channel, data)) => {
                        let id = if channel == exec::STDERR && !self.channels.tty {
                            self.stream("stderr")
                        } else {
                            self.stream("stdout")
                        };
                        if let Some(id) = id
                            && !self.send(frame::data_frames(id, &data, false, CHUNK)).await
                        {
                            return self.gone(running);
                        }
                    }
                    Some(Out::Exited(status)) => {
                        exited = Some(status);
                        deadline = Some(tokio::time::Instant::now() + exec::LINGER);
                    }
                    None => break,
                },
                () = linger => {
                    if running.is_none() {
                        let status = json!({"metadata": {}, "status": "Failure", "reason": "Timeout",
                            "message": "timed out waiting for client to create streams"});
                        self.end(&status).await;
                        return;
                    }
                    break;
                }
            }
        }
        let status = match (&running, &self.target) {
            (Some(Running::Process(_)), Some(target)) => exec::exit_status(target, exited),
            _ => json!({"metadata": {}, "status": "Success"}),
        };
        self.end(&status).await;
    }

    /// Handles one frame; false: the client ended the session.
    async fn handle(&mut self, f: Frame, running: &mut Option<Running>) -> bool {
        match f {
            Frame::SynStream {
                stream, headers, ..
            } => {
                let Ok(list) = self.codec.decode(&headers) else {
                    return false;
                };
                let reply = match self.codec.encode(&[]) {
                    Ok(block) => Frame::SynReply {
                        stream,
                        flags: 0,
                        headers: Bytes::from(block),
                    },
                    Err(_) => return false,
                };
                let mut b = Vec::new();
                if reply.encode(&mut b).is_err() || !self.send(b).await {
                    return false;
                }
                let kind = headers::first(&list, "streamtype")
                    .unwrap_or("")
                    .to_string();
                self.streams.push((kind, stream));
            }
            Frame::Data { stream, fin, data } => {
                if Some(stream) == self.stream("stdin") {
                    match running {
                        Some(Running::Process(io)) => {
                            if !data.is_empty() {
                                let _ = io.input.send(Some(data.to_vec()));
                            }
                            if fin {
                                let _ = io.input.send(None);
                            }
                        }
                        Some(Running::Attached {
                            stdin: Some(tx), ..
                        }) => {
                            if !data.is_empty() {
                                let _ = tx.send(Some(data)).await;
                            }
                            if fin {
                                let _ = tx.send(None).await;
                            }
                        }
                        None => {
                            if !data.is_empty() {
                                self.early_stdin.push(Some(data.to_vec()));
                            }
                            if fin {
                                self.early_stdin.push(None);
                            }
                        }
                        _ => {}
                    }
                } else if Some(stream) == self.stream("resize") {
                    self.resize_buf.extend_from_slice(&data);
                    while let Some(end) = self.resize_buf.iter().position(|&b| b == b'\n') {
                        let line: Vec<u8> = self.resize_buf.drain(..=end).collect();
                        match running {
                            Some(Running::Process(io)) => exec::apply_resize(&io.resize, &line),
                            Some(Running::Attached { resize, .. }) => {
                                exec::apply_resize(resize, &line)
                            }
                            None => self.first_size = exec::terminal_size(&line),
                        }
                    }
                }
            }
            Frame::Ping { id } => {
                let mut b = Vec::new();
                if (Frame::Ping { id }).encode(&mut b).is_ok() {
                    let _ = self.send(b).await;
                }
            }
            Frame::GoAway { .. } => return false,
            Frame::Headers { headers, .. } | Frame::SynReply { headers, .. } => {
                // Read to keep the zlib context in step.
                if self.codec.decode(&headers).is_err() {
                    return false;
                }
            }
            Frame::RstStream { .. }
            | Frame::Settings { .. }
            | Frame::WindowUpdate { .. }
            | Frame::Unknown { .. } => {}
        }
        true
    }

    /// Starts the work (once); `None`: it could not start, or already had.
    async fn begin(&mut self, work: Option<Work>) -> Option<Running> {
        self.start(work?).await
    }

    /// Starts the work once every stream is there (a process on a terminal of the client's
    /// first size, fed the input that came meanwhile); a failure is the session's final status.
    async fn start(&mut self, work: Work) -> Option<Running> {
        match work {
            Work::Exec(source, mut target) => {
                target.size = self.first_size.or(target.size);
                match source.start(&target) {
                    Ok(process) => {
                        let io = exec::start_io(process, &target);
                        for input in self.early_stdin.drain(..) {
                            let _ = io.input.send(input);
                        }
                        self.target = Some(target);
                        Some(Running::Process(io))
                    }
                    Err(e) => {
                        let status = json!({"metadata": {}, "status": "Failure", "reason": "InternalError",
                            "message": format!("Internal error occurred: error executing command in pod {}/{} container {}: {e}",
                                target.namespace, target.pod, target.container)});
                        self.end(&status).await;
                        None
                    }
                }
            }
            Work::Attach(source, target) => match source.attach(&target) {
                Ok(a) => {
                    // A size that came with the streams applies to the attached terminal.
                    if let (Some(resize), Some((rows, cols))) = (&a.resize, self.first_size) {
                        resize(rows, cols);
                    }
                    Some(Running::Attached {
                        output: a.output,
                        stdin: a.stdin,
                        resize: a.resize,
                    })
                }
                Err(e) => {
                    let status = json!({"metadata": {}, "status": "Failure", "reason": "BadRequest",
                        "message": e});
                    self.end(&status).await;
                    None
                }
            },
        }
    }

    /// The client went away: an exec'd process goes with it.
    fn gone(&self, running: Option<Running>) {
        if let Some(Running::Process(io)) = running {
            exec::kill_group(io.pid);
        }
    }

    /// Finishes the output streams, writes `status` on the error stream and says goodbye.
    async fn end(&self, status: &Value) {
        let mut b = Vec::new();
        for kind in ["stdout", "stderr"] {
            if let Some(id) = self.stream(kind) {
                b.extend(frame::data_frames(id, &[], true, CHUNK));
            }
        }
        if let Some(id) = self.stream("error") {
            b.extend(frame::data_frames(
                id,
                status.to_string().as_bytes(),
                true,
                CHUNK,
            ));
        }
        let _ = (Frame::GoAway {
            last_good: 0,
            status: 0,
        })
        .encode(&mut b);
        let _ = self.send(b).await;
    }
}

#[cfg(test)]
#[path = "execspdy_tests.rs"]
mod tests;
