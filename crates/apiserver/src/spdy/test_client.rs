//! kubectl's side of a SPDY session for tests: its own header codec, frames written into the
//! session's input channel and read from its output channel.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use bytes::Bytes;
use tokio::sync::mpsc;

use super::frame::{self, Frame};
use super::headers::HeaderCodec;

/// kubectl's side of a session: its own header codec and a frame reader.
pub(crate) struct Client {
    pub codec: HeaderCodec,
    pub to_server: mpsc::Sender<Bytes>,
    from_server: mpsc::Receiver<Bytes>,
    buf: Vec<u8>,
    /// Bytes received per stream, and the streams finished.
    streams: std::collections::HashMap<u32, Vec<u8>>,
    finished: Vec<u32>,
}

impl Client {
    /// A client on the session's channels: it writes `to_server` and reads `from_server`.
    pub fn new(to_server: mpsc::Sender<Bytes>, from_server: mpsc::Receiver<Bytes>) -> Self {
        Client {
            codec: HeaderCodec::new(),
            to_server,
            from_server,
            buf: Vec::new(),
            streams: std::collections::HashMap::new(),
            finished: Vec::new(),
        }
    }

    /// Opens a stream with `headers`, as spdystream's CreateStream does.
    pub async fn open_with(&mut self, stream: u32, headers: &[(&str, &[&str])]) {
        let block = self.codec.encode(headers).unwrap();
        let mut b = Vec::new();
        Frame::SynStream {
            stream,
            associated: 0,
            priority: 0,
            flags: 0,
            headers: Bytes::from(block),
        }
        .encode(&mut b)
        .unwrap();
        self.to_server.send(Bytes::from(b)).await.unwrap();
    }

    pub async fn data(&mut self, stream: u32, data: &[u8], fin: bool) {
        let b = frame::data_frames(stream, data, fin, 1000);
        self.to_server.send(Bytes::from(b)).await.unwrap();
    }

    pub async fn frame(&mut self) -> Frame {
        loop {
            if let Some((f, used)) = frame::parse(&self.buf).unwrap() {
                self.buf.drain(..used);
                return f;
            }
            let more = tokio::time::timeout(Duration::from_secs(5), self.from_server.recv())
                .await
                .expect("a frame within 5 s")
                .expect("the session is still there");
            self.buf.extend_from_slice(&more);
        }
    }

    /// Reads frames until stream `stream` is finished; its bytes, and the replies seen.
    pub async fn read_stream(&mut self, stream: u32) -> (Vec<u8>, Vec<u32>) {
        let mut replies = Vec::new();
        while !self.finished.contains(&stream) {
            match self.frame().await {
                Frame::SynReply {
                    stream: s, headers, ..
                } => {
                    assert_eq!(self.codec.decode(&headers).unwrap(), vec![]);
                    replies.push(s);
                }
                Frame::Data {
                    stream: s,
                    fin,
                    data,
                } => {
                    self.streams.entry(s).or_default().extend_from_slice(&data);
                    if fin {
                        self.finished.push(s);
                    }
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        (self.streams.remove(&stream).unwrap_or_default(), replies)
    }
}
