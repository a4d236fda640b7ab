//! SPDY/3 header blocks: `count:32` then, per header, `len:32 name len:32 value` (several
//! values of one name joined by NUL), compressed with zlib primed with SPDY/3's dictionary.
//! Each direction of a session is one zlib stream, flushed (Z_SYNC_FLUSH) after every block,
//! so a [`HeaderCodec`] lives as long as the session and must see every block in order, also
//! those of frames the session otherwise ignores.
//!
//! flate2 over the pure-Rust zlib-rs backend is used because its default backend
//! (miniz_oxide) cannot take a preset dictionary.

use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};

use super::{DICTIONARY, DICTIONARY_ID};

/// Headers in order: a lowercase name and its values.
pub type HeaderList = Vec<(String, Vec<String>)>;

/// Largest decompressed header block accepted (a zlib bomb stops here).
const MAX_BLOCK: usize = 256 * 1024;

/// Why a header block cannot be read or written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    #[error("SPDY header block: zlib: {0}")]
    Zlib(String),
    #[error("SPDY header block: zlib asks for a dictionary with id {0:#x}, not SPDY/3's")]
    Dictionary(u32),
    #[error("SPDY header block: more than {MAX_BLOCK} bytes once decompressed")]
    TooLarge,
    #[error("SPDY header block: {0}")]
    Malformed(&'static str),
    #[error("SPDY header block: header name {0:?} is not lowercase")]
    Uppercase(String),
    #[error("SPDY header block: header {0:?} appears twice")]
    Duplicate(String),
}

/// The two zlib streams of one SPDY session.
pub struct HeaderCodec {
    inflate: Decompress,
    deflate: Compress,
}

impl Default for HeaderCodec {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for HeaderCodec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HeaderCodec(..)")
    }
}

impl HeaderCodec {
    pub fn new() -> Self {
        let mut deflate = Compress::new(Compression::default(), true);
        // A fresh compressor always takes a dictionary; were it refused, blocks would go out
        // without one, which Go's reader also accepts (it only checks a dictionary it is told of).
        let _ = deflate.set_dictionary(&DICTIONARY);
        HeaderCodec {
            inflate: Decompress::new(true),
            deflate,
        }
    }

    /// Decompresses and parses one header block.
    pub fn decode(&mut self, block: &[u8]) -> Result<HeaderList, HeaderError> {
        let raw = self.inflate(block)?;
        parse_block(&raw)
    }

    /// Serializes and compresses one header block.
    pub fn encode(&mut self, headers: &[(&str, &[&str])]) -> Result<Vec<u8>, HeaderError> {
        let raw = serialize_block(headers)?;
        let start = self.deflate.total_in();
        let mut out = Vec::with_capacity(raw.len() + 64);
        loop {
            let done = usize::try_from(self.deflate.total_in() - start).unwrap_or(usize::MAX);
            if out.len() == out.capacity() {
                out.reserve(out.capacity().max(64));
            }
            self.deflate
                .compress_vec(
                    raw.get(done..).unwrap_or(&[]),
                    &mut out,
                    FlushCompress::Sync,
                )
                .map_err(|e| HeaderError::Zlib(e.to_string()))?;
            let done = usize::try_from(self.deflate.total_in() - start).unwrap_or(usize::MAX);
            // All input taken and room left over: the sync flush is complete.
            if done >= raw.len() && out.len() < out.capacity() {
                return Ok(out);
            }
        }
    }

    fn inflate(&mut self, block: &[u8]) -> Result<Vec<u8>, HeaderError> {
        let start = self.inflate.total_in();
        let mut out = Vec::with_capacity(1024);
        loop {
            let taken = usize::try_from(self.inflate.total_in() - start).unwrap_or(usize::MAX);
            let rest = block.get(taken..).unwrap_or(&[]);
            if out.len() == out.capacity() {
                if out.len() >= MAX_BLOCK {
                    return Err(HeaderError::TooLarge);
                }
                out.reserve(out.capacity());
            }
            let before_out = out.len();
            match self
                .inflate
                .decompress_vec(rest, &mut out, FlushDecompress::Sync)
            {
                Ok(Status::StreamEnd) => return Ok(out),
                Ok(_) => {}
                Err(e) => match e.needs_dictionary() {
                    Some(DICTIONARY_ID) => {
                        self.inflate
                            .set_dictionary(&DICTIONARY)
                            .map_err(|e| HeaderError::Zlib(e.to_string()))?;
                        continue;
                    }
                    Some(other) => return Err(HeaderError::Dictionary(other)),
                    None => return Err(HeaderError::Zlib(e.to_string())),
                },
            }
            let taken_now = usize::try_from(self.inflate.total_in() - start).unwrap_or(usize::MAX);
            let progressed = taken_now > taken || out.len() > before_out;
            if taken_now >= block.len() && out.len() < out.capacity() {
                return Ok(out);
            }
            if !progressed {
                return Err(HeaderError::Malformed("the compressed block is truncated"));
            }
        }
    }
}

fn read_u32(b: &[u8], at: &mut usize) -> Result<u32, HeaderError> {
    let s = b
        .get(*at..*at + 4)
        .ok_or(HeaderError::Malformed("it ends inside a length"))?;
    *at += 4;
    Ok(u32::from_be_bytes([s[0], s[1], s[2], s[3]]))
}

fn read_str<'a>(b: &'a [u8], at: &mut usize) -> Result<&'a [u8], HeaderError> {
    let len = read_u32(b, at)? as usize;
    let s = b
        .get(*at..at.saturating_add(len))
        .ok_or(HeaderError::Malformed("a length runs past its end"))?;
    *at += len;
    Ok(s)
}

/// Parses an uncompressed header block.
pub fn parse_block(b: &[u8]) -> Result<HeaderList, HeaderError> {
    let mut at = 0;
    let count = read_u32(b, &mut at)? as usize;
    // Each header takes at least 8 bytes: a count beyond that is a lie, not an allocation.
    if count > b.len() / 8 {
        return Err(HeaderError::Malformed("its count exceeds its size"));
    }
    let mut out: HeaderList = Vec::with_capacity(count);
    for _ in 0..count {
        let name = read_str(b, &mut at)?;
        let value = read_str(b, &mut at)?;
        if name.is_empty() {
            return Err(HeaderError::Malformed("a header name is empty"));
        }
        let name = std::str::from_utf8(name)
            .map_err(|_| HeaderError::Malformed("a header name is not UTF-8"))?;
        if name.bytes().any(|c| c.is_ascii_uppercase()) {
            return Err(HeaderError::Uppercase(name.into()));
        }
        if out.iter().any(|(n, _)| n == name) {
            return Err(HeaderError::Duplicate(name.into()));
        }
        let values = value
            .split(|&c| c == 0)
            .map(|v| String::from_utf8_lossy(v).into_owned())
            .collect();
        out.push((name.to_string(), values));
    }
    if at != b.len() {
        return Err(HeaderError::Malformed("bytes follow its last header"));
    }
    Ok(out)
}

/// Serializes headers (names lowercased, as SPDY requires) into an uncompressed block.
pub fn serialize_block(headers: &[(&str, &[&str])]) -> Result<Vec<u8>, HeaderError> {
    let len32 = |n: usize| {
        u32::try_from(n)
            .map(u32::to_be_bytes)
            .map_err(|_| HeaderError::TooLarge)
    };
    let mut b = len32(headers.len())?.to_vec();
    for (name, values) in headers {
        let name = name.to_ascii_lowercase();
        let value = values.join("\0");
        b.extend_from_slice(&len32(name.len())?);
        b.extend_from_slice(name.as_bytes());
        b.extend_from_slice(&len32(value.len())?);
        b.extend_from_slice(value.as_bytes());
    }
    Ok(b)
}

/// The first value of header `name` (lowercase).
pub fn first<'a>(headers: &'a HeaderList, name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(n, _)| n == name)
        .and_then(|(_, v)| v.first())
        .map(String::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_round_trip_through_one_session() {
        // One sender, one receiver, several blocks: the zlib contexts carry over.
        let (mut tx, mut rx) = (HeaderCodec::new(), HeaderCodec::new());
        for i in 0..5 {
            let port = format!("{}", 8000 + i);
            let headers: [(&str, &[&str]); 3] = [
                ("streamType", &["data"]),
                ("port", &[&port]),
                ("x-multi", &["a", "b"]),
            ];
            let block = tx.encode(&headers).unwrap();
            let got = rx.decode(&block).unwrap();
            assert_eq!(
                got,
                vec![
                    ("streamtype".to_string(), vec!["data".to_string()]),
                    ("port".to_string(), vec![port.clone()]),
                    (
                        "x-multi".to_string(),
                        vec!["a".to_string(), "b".to_string()]
                    ),
                ]
            );
            assert_eq!(first(&got, "port"), Some(port.as_str()));
        }
        let empty = tx.encode(&[]).unwrap();
        assert_eq!(rx.decode(&empty).unwrap(), vec![]);
    }

    #[test]
    fn the_stream_names_spdys_dictionary() {
        let block = HeaderCodec::new().encode(&[("port", &["80"])]).unwrap();
        // zlib header with FDICT set, then the dictionary's Adler-32.
        assert_eq!(block[0] & 0x0f, 8, "deflate");
        assert_ne!(block[1] & 0x20, 0, "FDICT");
        assert_eq!(
            u32::from_be_bytes([block[2], block[3], block[4], block[5]]),
            DICTIONARY_ID
        );
        // A reader primed with another dictionary is refused.
        let mut other = Compress::new(Compression::default(), true);
        other.set_dictionary(b"not spdy").unwrap();
        let mut out = Vec::with_capacity(256);
        let raw = serialize_block(&[("a", &["b"])]).unwrap();
        other
            .compress_vec(&raw, &mut out, FlushCompress::Sync)
            .unwrap();
        assert!(matches!(
            HeaderCodec::new().decode(&out),
            Err(HeaderError::Dictionary(_))
        ));
    }

    #[test]
    fn a_block_without_dictionary_is_read_too() {
        let mut plain = Compress::new(Compression::default(), true);
        let mut out = Vec::with_capacity(256);
        let raw = serialize_block(&[("port", &["80"])]).unwrap();
        plain
            .compress_vec(&raw, &mut out, FlushCompress::Sync)
            .unwrap();
        let got = HeaderCodec::new().decode(&out).unwrap();
        assert_eq!(first(&got, "port"), Some("80"));
    }

    #[test]
    fn malformed_blocks_are_errors() {
        let raw = |b: &[u8]| parse_block(b);
        assert!(raw(&[]).is_err());
        assert!(raw(&[0, 0, 0, 1]).is_err());
        assert!(raw(&[0xff, 0xff, 0xff, 0xff]).is_err());
        assert!(raw(&[0, 0, 0, 1, 0, 0, 0, 9, b'a', 0, 0, 0, 0]).is_err());
        assert!(raw(&[0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0]).is_err());
        assert_eq!(
            raw(&[0, 0, 0, 1, 0, 0, 0, 1, b'A', 0, 0, 0, 0]),
            Err(HeaderError::Uppercase("A".into()))
        );
        assert_eq!(
            raw(&[
                0, 0, 0, 2, 0, 0, 0, 1, b'a', 0, 0, 0, 0, 0, 0, 0, 1, b'a', 0, 0, 0, 0
            ]),
            Err(HeaderError::Duplicate("a".into()))
        );
        assert!(raw(&[0, 0, 0, 0, 7]).is_err());
        // Garbage that is not zlib, and a truncated block, are errors, not panics.
        assert!(HeaderCodec::new().decode(b"garbage!").is_err());
        let block = HeaderCodec::new().encode(&[("port", &["80"])]).unwrap();
        assert!(
            HeaderCodec::new()
                .decode(&block[..block.len() / 2])
                .is_err()
        );
        assert!(HeaderCodec::new().decode(&[]).is_err());
    }

    #[test]
    fn a_zlib_bomb_stops() {
        let mut c = Compress::new(Compression::best(), true);
        c.set_dictionary(&DICTIONARY).unwrap();
        let big = vec![0u8; 4 * MAX_BLOCK];
        let mut out = Vec::with_capacity(64 * 1024);
        c.compress_vec(&big, &mut out, FlushCompress::Sync).unwrap();
        assert_eq!(HeaderCodec::new().decode(&out), Err(HeaderError::TooLarge));
    }
}
