//! SPDY/3.1 as kubectl speaks it for `port-forward` (and, before 1.30, for `exec`): the frames
//! ([`frame`]) and the zlib-compressed header blocks ([`headers`]), without I/O. The session
//! that drives them for a subresource lives with that subresource (`portforward.rs`).
//!
//! Only what a server of kubectl's streams needs is here: the client opens every stream, the
//! server replies and sends data; flow control is not used (Go's spdystream, kubectl's side,
//! neither sends nor honours WINDOW_UPDATE), so such frames are parsed and ignored.

pub mod frame;
pub mod headers;
#[cfg(test)]
pub mod test_client;

use std::sync::LazyLock;

/// The words of SPDY/3's header-compression dictionary (draft-mbelshe-httpbis-spdy-00
/// §2.6.10.1), each written with a 4-byte big-endian length before it.
const DICTIONARY_WORDS: [&str; 65] = [
    "options",
    "head",
    "post",
    "put",
    "delete",
    "trace",
    "accept",
    "accept-charset",
    "accept-encoding",
    "accept-language",
    "accept-ranges",
    "age",
    "allow",
    "authorization",
    "cache-control",
    "connection",
    "content-base",
    "content-encoding",
    "content-language",
    "content-length",
    "content-location",
    "content-md5",
    "content-range",
    "content-type",
    "date",
    "etag",
    "expect",
    "expires",
    "from",
    "host",
    "if-match",
    "if-modified-since",
    "if-none-match",
    "if-range",
    "if-unmodified-since",
    "last-modified",
    "location",
    "max-forwards",
    "pragma",
    "proxy-authenticate",
    "proxy-authorization",
    "range",
    "referer",
    "retry-after",
    "server",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "user-agent",
    "vary",
    "via",
    "warning",
    "www-authenticate",
    "method",
    "get",
    "status",
    "200 OK",
    "version",
    "HTTP/1.1",
    "url",
    "public",
    "set-cookie",
    "keep-alive",
    "origin",
];

/// The dictionary's final run of text, after the length-prefixed words.
const DICTIONARY_TAIL: &str = concat!(
    "100101201202205206300302303304305306307402405406407408409410411412413414415416417502504505",
    "203 Non-Authoritative Information204 No Content301 Moved Permanently400 Bad Request",
    "401 Unauthorized403 Forbidden404 Not Found500 Internal Server Error501 Not Implemented",
    "503 Service UnavailableJan Feb Mar Apr May Jun Jul Aug Sept Oct Nov Dec 00:00:00 ",
    "Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMTchunked,text/html,image/png,image/jpg,image/gif,",
    "application/xml,application/xhtml+xml,text/plain,text/javascript,publicprivatemax-age=",
    "gzip,deflate,sdchcharset=utf-8charset=iso-8859-1,utf-,*,enq=0."
);

/// SPDY/3's zlib dictionary, byte for byte what Go's `spdy` package (kubectl's) uses: 1,423
/// bytes whose Adler-32 (the dictionary id in each zlib stream's header) is `0xe3c6a7c2`.
pub static DICTIONARY: LazyLock<Vec<u8>> = LazyLock::new(|| {
    let mut d = Vec::with_capacity(1423);
    for word in DICTIONARY_WORDS {
        d.extend_from_slice(&(word.len() as u32).to_be_bytes());
        d.extend_from_slice(word.as_bytes());
    }
    d.extend_from_slice(DICTIONARY_TAIL.as_bytes());
    d
});

/// The Adler-32 of [`DICTIONARY`], as a zlib stream names its preset dictionary.
pub const DICTIONARY_ID: u32 = 0xe3c6_a7c2;

#[cfg(test)]
mod tests {
    use super::*;

    fn adler32(data: &[u8]) -> u32 {
        let (mut a, mut b) = (1u32, 0u32);
        for &x in data {
            a = (a + u32::from(x)) % 65521;
            b = (b + a) % 65521;
        }
        (b << 16) | a
    }

    #[test]
    fn the_dictionary_is_spdy3s() {
        assert_eq!(DICTIONARY.len(), 1423);
        assert_eq!(adler32(&DICTIONARY), DICTIONARY_ID);
        assert!(DICTIONARY.starts_with(b"\0\0\0\x07options\0\0\0\x04head"));
    }
}
