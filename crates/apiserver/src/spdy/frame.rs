//! SPDY/3.1 frames: parsing from a byte buffer and encoding into one, never panicking on what
//! a peer sends. Header blocks stay compressed here; [`super::headers`] decodes them, because
//! their zlib context spans the whole session.
//!
//! Layout (big-endian): a control frame is `1 | version:15 | type:16 | flags:8 | length:24`,
//! a data frame `0 | stream:31 | flags:8 | length:24`, each followed by `length` bytes.

use bytes::Bytes;

/// The protocol version in every control frame.
pub const VERSION: u16 = 3;
/// A frame header's size.
pub const HEADER_LEN: usize = 8;
/// The largest payload a frame's 24-bit length can carry.
pub const MAX_PAYLOAD: usize = 0x00ff_ffff;

/// The last frame of a stream in its sender's direction (data and control frames alike).
pub const FLAG_FIN: u8 = 0x01;

const SYN_STREAM: u16 = 1;
const SYN_REPLY: u16 = 2;
const RST_STREAM: u16 = 3;
const SETTINGS: u16 = 4;
const PING: u16 = 6;
const GOAWAY: u16 = 7;
const HEADERS: u16 = 8;
const WINDOW_UPDATE: u16 = 9;

/// RST_STREAM status codes used here.
pub const RST_PROTOCOL_ERROR: u32 = 1;
pub const RST_INTERNAL_ERROR: u32 = 6;

/// One SPDY frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    Data {
        stream: u32,
        fin: bool,
        data: Bytes,
    },
    SynStream {
        stream: u32,
        associated: u32,
        priority: u8,
        flags: u8,
        /// The compressed header block.
        headers: Bytes,
    },
    SynReply {
        stream: u32,
        flags: u8,
        headers: Bytes,
    },
    RstStream {
        stream: u32,
        status: u32,
    },
    Settings {
        flags: u8,
        /// (flags, id, value) per entry.
        entries: Vec<(u8, u32, u32)>,
    },
    Ping {
        id: u32,
    },
    GoAway {
        last_good: u32,
        status: u32,
    },
    Headers {
        stream: u32,
        flags: u8,
        headers: Bytes,
    },
    WindowUpdate {
        stream: u32,
        delta: u32,
    },
    /// A control frame of a type this implementation does not know; SPDY says to ignore it.
    Unknown {
        kind: u16,
    },
}

/// Why bytes are not a valid SPDY/3 frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("SPDY control frame of version {0}, not 3")]
    Version(u16),
    #[error("SPDY {kind} frame of {len} bytes, which cannot hold its fields")]
    Length { kind: &'static str, len: usize },
    #[error("SPDY {0} frame for stream 0")]
    StreamZero(&'static str),
    #[error("a SPDY frame payload of {0} bytes exceeds the 24-bit length")]
    TooLarge(usize),
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    // Callers checked the length; a short slice reads as zeros rather than panicking.
    let mut w = [0u8; 4];
    if let Some(s) = b.get(at..at + 4) {
        w.copy_from_slice(s);
    }
    u32::from_be_bytes(w)
}

fn stream_at(b: &[u8], at: usize) -> u32 {
    u32_at(b, at) & 0x7fff_ffff
}

/// Parses the first frame in `buf`: `Ok(None)` while it is incomplete, otherwise the frame and
/// how many bytes it took.
pub fn parse(buf: &[u8]) -> Result<Option<(Frame, usize)>, FrameError> {
    if buf.len() < HEADER_LEN {
        return Ok(None);
    }
    let flags = buf[4];
    let len = (u32_at(buf, 4) & 0x00ff_ffff) as usize;
    let Some(payload) = buf.get(HEADER_LEN..HEADER_LEN + len) else {
        return Ok(None);
    };
    let total = HEADER_LEN + len;
    if buf[0] & 0x80 == 0 {
        let frame = Frame::Data {
            stream: stream_at(buf, 0),
            fin: flags & FLAG_FIN != 0,
            data: Bytes::copy_from_slice(payload),
        };
        return Ok(Some((frame, total)));
    }
    let version = u16::from_be_bytes([buf[0], buf[1]]) & 0x7fff;
    if version != VERSION {
        return Err(FrameError::Version(version));
    }
    let kind = u16::from_be_bytes([buf[2], buf[3]]);
    let need = |name: &'static str, ok: bool| {
        if ok {
            Ok(())
        } else {
            Err(FrameError::Length { kind: name, len })
        }
    };
    let frame = match kind {
        SYN_STREAM => {
            need("SYN_STREAM", len >= 10)?;
            let stream = stream_at(payload, 0);
            if stream == 0 {
                return Err(FrameError::StreamZero("SYN_STREAM"));
            }
            Frame::SynStream {
                stream,
                associated: stream_at(payload, 4),
                priority: payload[8] >> 5,
                flags,
                headers: Bytes::copy_from_slice(&payload[10..]),
            }
        }
        SYN_REPLY | HEADERS => {
            let name = if kind == SYN_REPLY {
                "SYN_REPLY"
            } else {
                "HEADERS"
            };
            need(name, len >= 4)?;
            let stream = stream_at(payload, 0);
            if stream == 0 {
                return Err(FrameError::StreamZero(name));
            }
            let headers = Bytes::copy_from_slice(&payload[4..]);
            if kind == SYN_REPLY {
                Frame::SynReply {
                    stream,
                    flags,
                    headers,
                }
            } else {
                Frame::Headers {
                    stream,
                    flags,
                    headers,
                }
            }
        }
        RST_STREAM => {
            need("RST_STREAM", len == 8)?;
            Frame::RstStream {
                stream: stream_at(payload, 0),
                status: u32_at(payload, 4),
            }
        }
        SETTINGS => {
            need("SETTINGS", len >= 4)?;
            let count = u32_at(payload, 0) as usize;
            need(
                "SETTINGS",
                count.checked_mul(8).and_then(|n| n.checked_add(4)) == Some(len),
            )?;
            let entries = (0..count)
                .map(|i| {
                    let at = 4 + i * 8;
                    let word = u32_at(payload, at);
                    (
                        (word >> 24) as u8,
                        word & 0x00ff_ffff,
                        u32_at(payload, at + 4),
                    )
                })
                .collect();
            Frame::Settings { flags, entries }
        }
        PING => {
            need("PING", len == 4)?;
            Frame::Ping {
                id: u32_at(payload, 0),
            }
        }
        GOAWAY => {
            need("GOAWAY", len == 8)?;
            Frame::GoAway {
                last_good: stream_at(payload, 0),
                status: u32_at(payload, 4),
            }
        }
        WINDOW_UPDATE => {
            need("WINDOW_UPDATE", len == 8)?;
            Frame::WindowUpdate {
                stream: stream_at(payload, 0),
                delta: u32_at(payload, 4) & 0x7fff_ffff,
            }
        }
        kind => Frame::Unknown { kind },
    };
    Ok(Some((frame, total)))
}

fn control(out: &mut Vec<u8>, kind: u16, flags: u8, payload: &[&[u8]]) -> Result<(), FrameError> {
    let len: usize = payload.iter().map(|p| p.len()).sum();
    if len > MAX_PAYLOAD {
        return Err(FrameError::TooLarge(len));
    }
    out.extend_from_slice(&(0x8000 | VERSION).to_be_bytes());
    out.extend_from_slice(&kind.to_be_bytes());
    out.extend_from_slice(&((u32::from(flags) << 24) | len as u32).to_be_bytes());
    for p in payload {
        out.extend_from_slice(p);
    }
    Ok(())
}

impl Frame {
    /// Appends this frame's bytes to `out`; a payload beyond 24 bits is an error (split data
    /// with [`data_frames`]).
    pub fn encode(&self, out: &mut Vec<u8>) -> Result<(), FrameError> {
        let be = |v: u32| v.to_be_bytes();
        match self {
            Frame::Data { stream, fin, data } => {
                if data.len() > MAX_PAYLOAD {
                    return Err(FrameError::TooLarge(data.len()));
                }
                let flags = if *fin { FLAG_FIN } else { 0 };
                out.extend_from_slice(&be(stream & 0x7fff_ffff));
                out.extend_from_slice(&be((u32::from(flags) << 24) | data.len() as u32));
                out.extend_from_slice(data);
                Ok(())
            }
            Frame::SynStream {
                stream,
                associated,
                priority,
                flags,
                headers,
            } => control(
                out,
                SYN_STREAM,
                *flags,
                &[
                    &be(stream & 0x7fff_ffff),
                    &be(associated & 0x7fff_ffff),
                    &[(priority & 0x07) << 5, 0],
                    headers,
                ],
            ),
            Frame::SynReply {
                stream,
                flags,
                headers,
            } => control(
                out,
                SYN_REPLY,
                *flags,
                &[&be(stream & 0x7fff_ffff), headers],
            ),
            Frame::Headers {
                stream,
                flags,
                headers,
            } => control(out, HEADERS, *flags, &[&be(stream & 0x7fff_ffff), headers]),
            Frame::RstStream { stream, status } => control(
                out,
                RST_STREAM,
                0,
                &[&be(stream & 0x7fff_ffff), &be(*status)],
            ),
            Frame::Settings { flags, entries } => {
                let mut body = be(entries.len() as u32).to_vec();
                for (f, id, value) in entries {
                    body.extend_from_slice(&be((u32::from(*f) << 24) | (id & 0x00ff_ffff)));
                    body.extend_from_slice(&be(*value));
                }
                control(out, SETTINGS, *flags, &[&body])
            }
            Frame::Ping { id } => control(out, PING, 0, &[&be(*id)]),
            Frame::GoAway { last_good, status } => control(
                out,
                GOAWAY,
                0,
                &[&be(last_good & 0x7fff_ffff), &be(*status)],
            ),
            Frame::WindowUpdate { stream, delta } => control(
                out,
                WINDOW_UPDATE,
                0,
                &[&be(stream & 0x7fff_ffff), &be(delta & 0x7fff_ffff)],
            ),
            Frame::Unknown { kind } => control(out, *kind, 0, &[]),
        }
    }
}

/// `data` on `stream` as data frames of at most `chunk` bytes; `fin` on the last (an empty
/// frame carries it when `data` is empty).
pub fn data_frames(stream: u32, data: &[u8], fin: bool, chunk: usize) -> Vec<u8> {
    let chunk = chunk.clamp(1, MAX_PAYLOAD);
    let mut out = Vec::with_capacity(data.len() + HEADER_LEN * (data.len() / chunk + 1));
    let mut pieces: Vec<&[u8]> = data.chunks(chunk).collect();
    if pieces.is_empty() {
        pieces.push(&[]);
    }
    let last = pieces.len() - 1;
    for (i, piece) in pieces.into_iter().enumerate() {
        let frame = Frame::Data {
            stream,
            fin: fin && i == last,
            data: Bytes::copy_from_slice(piece),
        };
        // Each piece is within the 24-bit limit by construction.
        let _ = frame.encode(&mut out);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(f: Frame) {
        let mut b = Vec::new();
        f.encode(&mut b).unwrap();
        assert_eq!(parse(&b).unwrap(), Some((f.clone(), b.len())), "{f:?}");
        // Every prefix is incomplete, never an error or a panic.
        for cut in 0..b.len() {
            assert_eq!(parse(&b[..cut]).unwrap(), None, "{f:?} cut at {cut}");
        }
    }

    #[test]
    fn every_frame_round_trips() {
        for f in [
            Frame::Data {
                stream: 7,
                fin: true,
                data: Bytes::from_static(b"hello"),
            },
            Frame::Data {
                stream: 0x7fff_ffff,
                fin: false,
                data: Bytes::new(),
            },
            Frame::SynStream {
                stream: 1,
                associated: 0,
                priority: 3,
                flags: FLAG_FIN,
                headers: Bytes::from_static(b"\x01\x02"),
            },
            Frame::SynReply {
                stream: 3,
                flags: 0,
                headers: Bytes::from_static(b"abc"),
            },
            Frame::Headers {
                stream: 3,
                flags: FLAG_FIN,
                headers: Bytes::new(),
            },
            Frame::RstStream {
                stream: 5,
                status: RST_INTERNAL_ERROR,
            },
            Frame::Settings {
                flags: 1,
                entries: vec![(0, 4, 100), (1, 7, 65536)],
            },
            Frame::Ping { id: 2 },
            Frame::GoAway {
                last_good: 9,
                status: 0,
            },
            Frame::WindowUpdate {
                stream: 1,
                delta: 1 << 20,
            },
            Frame::Unknown { kind: 42 },
        ] {
            round_trip(f);
        }
    }

    #[test]
    fn known_bytes() {
        // A PING with id 1, as the spec lays it out.
        let mut b = Vec::new();
        Frame::Ping { id: 1 }.encode(&mut b).unwrap();
        assert_eq!(b, [0x80, 3, 0, 6, 0, 0, 0, 4, 0, 0, 0, 1]);
        // A data frame for stream 1 with FIN.
        assert_eq!(
            data_frames(1, b"ab", true, 1),
            [0, 0, 0, 1, 0, 0, 0, 1, b'a', 0, 0, 0, 1, 1, 0, 0, 1, b'b']
        );
        assert_eq!(data_frames(5, b"", true, 10), [0, 0, 0, 5, 1, 0, 0, 0]);
    }

    #[test]
    fn malformed_frames_are_errors() {
        // Version 2.
        assert_eq!(
            parse(&[0x80, 2, 0, 6, 0, 0, 0, 4, 0, 0, 0, 1]),
            Err(FrameError::Version(2))
        );
        // A PING of 3 bytes, a RST_STREAM of 4, SETTINGS whose count disagrees with its length.
        assert!(matches!(
            parse(&[0x80, 3, 0, 6, 0, 0, 0, 3, 0, 0, 1]),
            Err(FrameError::Length { kind: "PING", .. })
        ));
        assert!(parse(&[0x80, 3, 0, 3, 0, 0, 0, 4, 0, 0, 0, 1]).is_err());
        assert!(parse(&[0x80, 3, 0, 4, 0, 0, 0, 4, 0xff, 0xff, 0xff, 0xff]).is_err());
        // A SYN_STREAM for stream 0, and one too short for its fields.
        let mut b = vec![0x80, 3, 0, 1, 0, 0, 0, 10];
        b.extend_from_slice(&[0; 10]);
        assert_eq!(parse(&b), Err(FrameError::StreamZero("SYN_STREAM")));
        assert!(parse(&[0x80, 3, 0, 1, 0, 0, 0, 2, 0, 1]).is_err());
        // An over-long payload cannot be encoded.
        let big = Frame::Data {
            stream: 1,
            fin: false,
            data: Bytes::from(vec![0; MAX_PAYLOAD + 1]),
        };
        assert_eq!(
            big.encode(&mut Vec::new()),
            Err(FrameError::TooLarge(MAX_PAYLOAD + 1))
        );
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        // A small deterministic generator: every byte string parses to a frame, needs more,
        // or is an error.
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let len = (x % 40) as usize;
            let mut b: Vec<u8> = (0..len).map(|i| (x >> (i % 8 * 8)) as u8).collect();
            if x & 1 == 1 && !b.is_empty() {
                b[0] = 0x80;
                if b.len() > 1 {
                    b[1] = 3;
                }
            }
            let _ = parse(&b);
        }
    }
}
