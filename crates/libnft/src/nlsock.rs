//! The nf_tables netlink socket that sends [`crate::netlink::Batch`]es: opened by the
//! context's thread, so it belongs to the same network namespace as its libnftables context.
//!
//! nfnetlink processes a batch inside the `send` that hands it over (it commits or aborts,
//! then queues an error for each failed message and an acknowledgement for each message
//! asking for one) before `send` returns; so the answers are read without waiting, and a
//! batch whose last request is not acknowledged is reported, not assumed applied.

use std::io;

use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_NETFILTER};

use crate::netlink::Batch;

const NLMSG_ERROR: u16 = 2;
const NLM_F_REQUEST: u16 = 1;
const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFT_MSG_NEWGEN: u16 = 15;
const NFT_MSG_GETGEN: u16 = 16;
const NFTA_GEN_ID: u16 = 1;
/// `NLM_F_CAPPED`: an error carries the request's header only.
const NLM_F_CAPPED: u16 = 0x100;
/// `NLM_F_ACK_TLVS`: an error carries extended-ack attributes.
const NLM_F_ACK_TLVS: u16 = 0x200;
/// `NLMSGERR_ATTR_MSG`: the kernel's text for an error.
const NLMSGERR_ATTR_MSG: u16 = 1;

/// An open nf_tables socket.
pub(crate) struct NfSocket {
    sock: Socket,
    seq: u32,
    buf: Vec<u8>,
}

impl NfSocket {
    /// Opens a socket in the calling thread's network namespace.
    pub(crate) fn open() -> io::Result<Self> {
        let mut sock = Socket::new(NETLINK_NETFILTER)?;
        sock.bind_auto()?;
        sock.connect(&SocketAddr::new(0, 0))?;
        // Acknowledgements without the request echoed; errors with the kernel's text.
        let _ = sock.set_cap_ack(true);
        let _ = sock.set_ext_ack(true);
        // Room for one answer per message of a large batch.
        let _ = sock.set_rx_buf_sz(4 << 20);
        Ok(Self {
            sock,
            seq: 0,
            buf: Vec::with_capacity(1 << 16),
        })
    }

    /// Sends `batch` (one kernel transaction) and reads its answers: `Ok` when every request
    /// was acknowledged; [`crate::Error::Rejected`] with each failed message and the
    /// kernel's error when it was refused (nothing applied); [`crate::Error::Netlink`] when
    /// the socket failed.
    pub(crate) fn send(&mut self, mut batch: Batch) -> Result<(), crate::Error> {
        use crate::Error::Netlink;
        // Left-over answers of an earlier batch would be taken for this one's.
        self.drain()
            .map_err(|e| Netlink(format!("reading the nf_tables socket: {e}")))?;
        let first = self.seq.wrapping_add(1);
        let count = u32::try_from(batch.messages().len()).unwrap_or(u32::MAX);
        self.seq = self.seq.wrapping_add(count);
        self.sock
            .send(batch.with_seq(first), 0)
            .map_err(|e| Netlink(format!("sending the nf_tables batch: {e}")))?;
        let answers = self
            .drain()
            .map_err(|e| Netlink(format!("reading the nf_tables answers: {e}")))?;
        let last = batch.last_request(first);
        let mut acked = false;
        let mut errors = Vec::new();
        for (seq, errno, text) in answers {
            let what = batch.describe(first, seq).unwrap_or("the batch");
            match errno {
                0 => acked |= seq == last,
                e => {
                    let os = io::Error::from_raw_os_error(-e);
                    errors.push(match text {
                        Some(t) => format!("{what}: {os} ({t})"),
                        None => format!("{what}: {os}"),
                    });
                }
            }
        }
        if !errors.is_empty() {
            return Err(crate::Error::Rejected(format!(
                "the kernel refused the batch: {}",
                errors.join("; ")
            )));
        }
        if !acked {
            return Err(Netlink(format!(
                "no acknowledgement of the batch's last request ({} requests)",
                batch.requests()
            )));
        }
        Ok(())
    }

    /// The nf_tables generation id (`NFT_MSG_GETGEN`).
    pub(crate) fn generation(&mut self) -> Result<u32, crate::Error> {
        use crate::Error::Netlink;
        self.drain()
            .map_err(|e| Netlink(format!("reading the nf_tables socket: {e}")))?;
        self.seq = self.seq.wrapping_add(1);
        let mut req = Vec::with_capacity(20);
        req.extend_from_slice(&20u32.to_ne_bytes());
        req.extend_from_slice(&((NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_GETGEN).to_ne_bytes());
        req.extend_from_slice(&NLM_F_REQUEST.to_ne_bytes());
        req.extend_from_slice(&self.seq.to_ne_bytes());
        req.extend_from_slice(&0u32.to_ne_bytes());
        req.extend_from_slice(&[0, 0, 0, 0]);
        self.sock
            .send(&req, 0)
            .map_err(|e| Netlink(format!("asking for the generation: {e}")))?;
        // The answer is queued before send returns, as a batch's are.
        self.buf.clear();
        match self.sock.recv(&mut self.buf, libc::MSG_DONTWAIT) {
            Ok(_) => {}
            Err(e) => return Err(Netlink(format!("reading the generation: {e}"))),
        }
        let b = &self.buf;
        let kind = b.get(4..6).map(|s| u16::from_ne_bytes([s[0], s[1]]));
        // nlmsghdr, nfgenmsg, then NFTA_GEN_ID (big-endian) first.
        let id = b.get(20..22).zip(b.get(22..24)).zip(b.get(24..28));
        match (kind, id) {
            (Some(k), Some(((_, t), v)))
                if k == (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWGEN
                    && u16::from_ne_bytes([t[0], t[1]]) == NFTA_GEN_ID =>
            {
                Ok(u32::from_be_bytes([v[0], v[1], v[2], v[3]]))
            }
            _ => Err(Netlink("unexpected answer to NFT_MSG_GETGEN".into())),
        }
    }

    /// Reads every queued answer (without waiting): sequence number, error (0: done) and
    /// the kernel's text.
    fn drain(&mut self) -> io::Result<Vec<(u32, i32, Option<String>)>> {
        let mut out = Vec::new();
        loop {
            self.buf.clear();
            match self.sock.recv(&mut self.buf, libc::MSG_DONTWAIT) {
                Ok(_) => parse(&self.buf, &mut out),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(out),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }
}

/// The error messages of one datagram.
fn parse(mut b: &[u8], out: &mut Vec<(u32, i32, Option<String>)>) {
    let u16_at = |b: &[u8], i: usize| b.get(i..i + 2).map(|s| u16::from_ne_bytes([s[0], s[1]]));
    let u32_at = |b: &[u8], i: usize| {
        b.get(i..i + 4)
            .map(|s| u32::from_ne_bytes([s[0], s[1], s[2], s[3]]))
    };
    while let (Some(len), Some(kind), Some(flags), Some(seq)) =
        (u32_at(b, 0), u16_at(b, 4), u16_at(b, 6), u32_at(b, 8))
    {
        let len = usize::try_from(len).unwrap_or(usize::MAX);
        if len < 16 || len > b.len() {
            return;
        }
        let msg = &b[..len];
        if kind == NLMSG_ERROR
            && let Some(errno) = u32_at(msg, 16)
        {
            let errno = i32::from_ne_bytes(errno.to_ne_bytes());
            // The request follows, its header alone when capped; then the attributes.
            let mut text = None;
            let request = match flags & NLM_F_CAPPED {
                0 => u32_at(msg, 20)
                    .and_then(|l| usize::try_from(l).ok())
                    .unwrap_or(16),
                _ => 16,
            };
            if flags & NLM_F_ACK_TLVS != 0 {
                let mut at = 20 + request.next_multiple_of(4);
                while let (Some(alen), Some(atype)) = (u16_at(msg, at), u16_at(msg, at + 2)) {
                    let alen = usize::from(alen);
                    if alen < 4 || at + alen > msg.len() {
                        break;
                    }
                    if atype & 0x3fff == NLMSGERR_ATTR_MSG {
                        let s = &msg[at + 4..at + alen];
                        let s = s.split(|c| *c == 0).next().unwrap_or(s);
                        text = Some(String::from_utf8_lossy(s).into_owned());
                    }
                    at += alen.next_multiple_of(4);
                }
            }
            out.push((seq, errno, text));
        }
        b = &b[len.next_multiple_of(4).min(b.len())..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An error as the kernel writes it: header, errno, the request (capped or whole), the
    /// extended-ack text.
    fn error(seq: u32, errno: i32, capped: bool, text: &str) -> Vec<u8> {
        let mut request = Vec::new();
        let body = if capped { 0 } else { 12 };
        request.extend_from_slice(&(16u32 + body).to_ne_bytes());
        request.extend_from_slice(&0x0a0eu16.to_ne_bytes());
        request.extend_from_slice(&5u16.to_ne_bytes());
        request.extend_from_slice(&seq.to_ne_bytes());
        request.extend_from_slice(&0u32.to_ne_bytes());
        request.resize(request.len() + body as usize, 0xee);
        let mut attr = Vec::new();
        attr.extend_from_slice(&(4 + text.len() as u16 + 1).to_ne_bytes());
        attr.extend_from_slice(&NLMSGERR_ATTR_MSG.to_ne_bytes());
        attr.extend_from_slice(text.as_bytes());
        attr.push(0);
        attr.resize(attr.len().next_multiple_of(4), 0);
        let flags = NLM_F_ACK_TLVS | if capped { NLM_F_CAPPED } else { 0 };
        let len = 16 + 4 + request.len() + attr.len();
        let mut m = Vec::new();
        m.extend_from_slice(&(len as u32).to_ne_bytes());
        m.extend_from_slice(&NLMSG_ERROR.to_ne_bytes());
        m.extend_from_slice(&flags.to_ne_bytes());
        m.extend_from_slice(&seq.to_ne_bytes());
        m.extend_from_slice(&0u32.to_ne_bytes());
        m.extend_from_slice(&errno.to_ne_bytes());
        m.extend_from_slice(&request);
        m.extend_from_slice(&attr);
        m
    }

    #[test]
    fn answers_give_sequence_errno_and_the_kernels_text() {
        let mut datagram = error(7, -2, true, "no such set");
        datagram.extend(error(8, 0, true, ""));
        datagram.extend(error(9, -22, false, "bad key"));
        let mut out = Vec::new();
        parse(&datagram, &mut out);
        assert_eq!(
            out,
            [
                (7, -2, Some("no such set".to_string())),
                (8, 0, Some(String::new())),
                (9, -22, Some("bad key".to_string())),
            ]
        );
        // A truncated datagram yields what it holds whole.
        let mut out = Vec::new();
        parse(&datagram[..datagram.len() - 3], &mut out);
        assert_eq!(out.len(), 2);
    }
}
