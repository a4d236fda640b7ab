//! Pure packet work of the UDP backend: the `virtio_net_hdr` a TUN queue with `IFF_VNET_HDR`
//! prefixes, Internet checksums, splitting a TCP/UDP GSO super-packet into MTU-sized IPv4
//! packets (what a NIC's TSO would do), and coalescing received TCP segments of one flow back
//! into one super-packet for the TUN (what GRO does). No I/O.

use std::net::Ipv4Addr;

/// Length of `struct virtio_net_hdr` (no `num_buffers`: the TUN default `TUNSETVNETHDRSZ`).
pub const VNET_HDR_LEN: usize = 10;
/// `VIRTIO_NET_HDR_F_NEEDS_CSUM`: the L4 checksum is partial (pseudo-header only).
pub const F_NEEDS_CSUM: u8 = 1;
/// `VIRTIO_NET_HDR_F_DATA_VALID`: checksums already verified.
pub const F_DATA_VALID: u8 = 2;
pub const GSO_NONE: u8 = 0;
pub const GSO_TCPV4: u8 = 1;
pub const GSO_UDP_L4: u8 = 5;

const PROTO_TCP: u8 = 6;
const PROTO_UDP: u8 = 17;
const TCP_FIN: u8 = 0x01;
const TCP_PSH: u8 = 0x08;
const TCP_ACK: u8 = 0x10;
const TCP_CWR: u8 = 0x80;

/// `struct virtio_net_hdr` (little-endian fields).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VnetHdr {
    pub flags: u8,
    pub gso_type: u8,
    pub hdr_len: u16,
    pub gso_size: u16,
    pub csum_start: u16,
    pub csum_offset: u16,
}

impl VnetHdr {
    pub fn parse(b: &[u8]) -> Option<Self> {
        let le = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        (b.len() >= VNET_HDR_LEN).then(|| Self {
            flags: b[0],
            gso_type: b[1] & 0x7f, // without VIRTIO_NET_HDR_GSO_ECN
            hdr_len: le(2),
            gso_size: le(4),
            csum_start: le(6),
            csum_offset: le(8),
        })
    }

    pub fn write(&self, out: &mut [u8]) {
        out[0] = self.flags;
        out[1] = self.gso_type;
        out[2..4].copy_from_slice(&self.hdr_len.to_le_bytes());
        out[4..6].copy_from_slice(&self.gso_size.to_le_bytes());
        out[6..8].copy_from_slice(&self.csum_start.to_le_bytes());
        out[8..10].copy_from_slice(&self.csum_offset.to_le_bytes());
    }
}

/// The destination of an IPv4 packet (`None` for anything else).
pub fn ipv4_dst(pkt: &[u8]) -> Option<Ipv4Addr> {
    (pkt.len() >= 20 && pkt[0] >> 4 == 4).then(|| Ipv4Addr::new(pkt[16], pkt[17], pkt[18], pkt[19]))
}

/// The one's-complement sum of `data` (big-endian 16-bit words, `data` starting at an even
/// offset of the packet) added to `acc` (not folded). It adds 16 bytes at a time in native order
/// and swaps the folded result (RFC 1071: the sum is byte-order independent), so an
/// unoptimised build still runs it at a useful speed.
pub fn sum(data: &[u8], acc: u64) -> u64 {
    let mut wide: u128 = 0;
    let mut carries: u64 = 0;
    let mut rest = data;
    while let Some((chunk, tail)) = rest.split_first_chunk::<16>() {
        let (s, c) = wide.overflowing_add(u128::from_ne_bytes(*chunk));
        wide = s;
        carries += c as u64;
        rest = tail;
    }
    let mut last = [0u8; 16];
    last[..rest.len()].copy_from_slice(rest);
    let (s, c) = wide.overflowing_add(u128::from_ne_bytes(last));
    carries += c as u64;
    // Fold 128 bits (plus the carries out of them) to 16, in native order.
    let mut folded: u64 = carries;
    for i in 0..8 {
        folded += ((s >> (16 * i)) & 0xffff) as u64;
    }
    let ne = fold(folded);
    let be = if cfg!(target_endian = "little") {
        ne.swap_bytes()
    } else {
        ne
    };
    acc + u64::from(be)
}

/// Folds a sum to 16 bits (not complemented).
pub fn fold(mut acc: u64) -> u16 {
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc as u16
}

/// The IPv4 pseudo-header sum for an L4 segment of `len` bytes of `proto`.
fn pseudo_sum(ip: &[u8], proto: u8, len: usize) -> u64 {
    sum(&ip[12..20], u64::from(proto) + len as u64)
}

fn set_ipv4_checksum(ip: &mut [u8], ihl: usize) {
    ip[10] = 0;
    ip[11] = 0;
    let c = !fold(sum(&ip[..ihl], 0));
    ip[10..12].copy_from_slice(&c.to_be_bytes());
}

/// Completes a partial checksum (`F_NEEDS_CSUM`): the field at `start + offset` holds the
/// pseudo-header sum; the result covers everything from `start` on (as `skb_checksum_help`).
pub fn complete_checksum(pkt: &mut [u8], start: usize, offset: usize) -> bool {
    let at = start + offset;
    if at + 2 > pkt.len() || start > pkt.len() {
        return false;
    }
    let mut c = !fold(sum(&pkt[start..], 0));
    if c == 0 && pkt.get(9) == Some(&PROTO_UDP) {
        c = 0xffff;
    }
    pkt[at..at + 2].copy_from_slice(&c.to_be_bytes());
    true
}

/// Splits the GSO super-packet `pkt` (IPv4 TCP or UDP, as a TUN read hands it with `hdr`) into
/// packets of at most `gso_size` payload bytes each, appended back to back to `out` with full
/// checksums. Returns the length of each full packet (all but the last are that long), or
/// `None` when `pkt` is not a packet this splits.
pub fn segment(pkt: &[u8], hdr: &VnetHdr, out: &mut Vec<u8>) -> Option<usize> {
    if pkt.len() < 20 || pkt[0] >> 4 != 4 {
        return None;
    }
    let ihl = usize::from(pkt[0] & 0x0f) * 4;
    let proto = pkt[9];
    let l4_len = match (hdr.gso_type, proto) {
        (GSO_TCPV4, PROTO_TCP) => usize::from(*pkt.get(ihl + 12)? >> 4) * 4,
        (GSO_UDP_L4, PROTO_UDP) => 8,
        _ => return None,
    };
    let head = ihl + l4_len;
    let mss = usize::from(hdr.gso_size);
    if mss == 0 || pkt.len() < head {
        return None;
    }
    let payload = &pkt[head..];
    let id0 = u16::from_be_bytes([pkt[4], pkt[5]]);
    let seq0 = u32::from_be_bytes(pkt.get(ihl + 4..ihl + 8)?.try_into().ok()?);
    let count = payload.len().div_ceil(mss);
    for (i, chunk) in payload.chunks(mss).enumerate() {
        let start = out.len();
        out.extend_from_slice(&pkt[..head]);
        out.extend_from_slice(chunk);
        let seg = &mut out[start..];
        let total = (head + chunk.len()) as u16;
        seg[2..4].copy_from_slice(&total.to_be_bytes());
        seg[4..6].copy_from_slice(&id0.wrapping_add(i as u16).to_be_bytes());
        set_ipv4_checksum(seg, ihl);
        let l4 = &mut seg[ihl..];
        let csum_at = if proto == PROTO_TCP {
            let seq = seq0.wrapping_add((i * mss) as u32);
            l4[4..8].copy_from_slice(&seq.to_be_bytes());
            if i + 1 < count {
                l4[13] &= !(TCP_FIN | TCP_PSH);
            }
            if i > 0 {
                l4[13] &= !TCP_CWR;
            }
            16
        } else {
            l4[4..6].copy_from_slice(&((8 + chunk.len()) as u16).to_be_bytes());
            6
        };
        l4[csum_at] = 0;
        l4[csum_at + 1] = 0;
        let l4_total = l4.len();
        let ps = pseudo_sum(&out[start..start + ihl], proto, l4_total);
        let l4 = &mut out[start + ihl..];
        let mut c = !fold(sum(l4, ps));
        if c == 0 && proto == PROTO_UDP {
            c = 0xffff;
        }
        l4[csum_at..csum_at + 2].copy_from_slice(&c.to_be_bytes());
    }
    Some(head + mss.min(payload.len()))
}

/// The TCP flow and header layout two segments must share to be coalesced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FlowKey {
    addrs: [u8; 8],
    ports: [u8; 4],
    ihl: usize,
    thl: usize,
    ack: [u8; 4],
    window: [u8; 2],
    ttl_tos: [u8; 2],
}

/// Coalesces consecutive in-order TCP segments of one IPv4 flow into one GSO super-packet for
/// a TUN write (the receiving side of [`segment`]); anything else passes through alone.
/// Each output buffer starts with its [`VnetHdr`].
#[derive(Debug, Default)]
pub struct Coalescer {
    buf: Vec<u8>,
    key: Option<FlowKey>,
    next_seq: u32,
    mss: usize,
    segments: usize,
    closed: bool,
}

/// The largest super-packet handed to the TUN (an IPv4 packet's 16-bit length).
const MAX_SUPER: usize = 65535;

impl Coalescer {
    /// Adds `pkt`; `emit` receives each finished buffer (vnet header + packet).
    pub fn push(&mut self, pkt: &[u8], emit: &mut impl FnMut(&mut [u8])) {
        let Some((key, seq, payload_len, flags, options)) = tcp_parts(pkt) else {
            self.flush(emit);
            self.emit_single(pkt, emit);
            return;
        };
        let head = key.ihl + key.thl;
        let fits = self.key == Some(key)
            && !self.closed
            && seq == self.next_seq
            && payload_len > 0
            && payload_len <= self.mss
            && flags & !(TCP_PSH) == TCP_ACK
            && self.buf.len() - VNET_HDR_LEN + payload_len <= MAX_SUPER
            && self.buf[VNET_HDR_LEN + key.ihl + 20..VNET_HDR_LEN + head] == *options;
        if fits {
            self.buf.extend_from_slice(&pkt[head..]);
            self.next_seq = seq.wrapping_add(payload_len as u32);
            self.segments += 1;
            if flags & TCP_PSH != 0 || payload_len < self.mss {
                self.closed = true;
            }
            if flags & TCP_PSH != 0 {
                // The super-packet carries the last segment's PSH.
                let at = VNET_HDR_LEN + key.ihl + 13;
                self.buf[at] |= TCP_PSH;
            }
            return;
        }
        self.flush(emit);
        if payload_len == 0 || flags & !(TCP_PSH) != TCP_ACK {
            self.emit_single(pkt, emit);
            return;
        }
        self.buf.clear();
        self.buf.resize(VNET_HDR_LEN, 0);
        self.buf.extend_from_slice(pkt);
        self.key = Some(key);
        self.next_seq = seq.wrapping_add(payload_len as u32);
        self.mss = payload_len;
        self.segments = 1;
        self.closed = flags & TCP_PSH != 0;
    }

    fn emit_single(&mut self, pkt: &[u8], emit: &mut impl FnMut(&mut [u8])) {
        let mut one = Vec::with_capacity(VNET_HDR_LEN + pkt.len());
        one.resize(VNET_HDR_LEN, 0);
        one.extend_from_slice(pkt);
        VnetHdr {
            flags: F_DATA_VALID,
            ..VnetHdr::default()
        }
        .write(&mut one);
        emit(&mut one);
    }

    /// Emits the pending super-packet, if any.
    pub fn flush(&mut self, emit: &mut impl FnMut(&mut [u8])) {
        let Some(key) = self.key.take() else {
            return;
        };
        let pkt = &mut self.buf[VNET_HDR_LEN..];
        let total = pkt.len();
        let head = key.ihl + key.thl;
        pkt[2..4].copy_from_slice(&(total as u16).to_be_bytes());
        set_ipv4_checksum(pkt, key.ihl);
        let hdr = if self.segments > 1 {
            // A partial checksum, as a NIC's GRO leaves it: the stack finishes or trusts it.
            let ps = fold(pseudo_sum(pkt, PROTO_TCP, total - key.ihl));
            pkt[key.ihl + 16..key.ihl + 18].copy_from_slice(&ps.to_be_bytes());
            VnetHdr {
                flags: F_NEEDS_CSUM,
                gso_type: GSO_TCPV4,
                hdr_len: head as u16,
                gso_size: self.mss as u16,
                csum_start: key.ihl as u16,
                csum_offset: 16,
            }
        } else {
            VnetHdr {
                flags: F_DATA_VALID,
                ..VnetHdr::default()
            }
        };
        hdr.write(&mut self.buf);
        emit(&mut self.buf);
        self.segments = 0;
    }
}

/// A TCP/IPv4 packet's flow key, sequence number, payload length, flags and options; `None`
/// for anything not coalescible (other protocols, IP options, fragments).
fn tcp_parts(pkt: &[u8]) -> Option<(FlowKey, u32, usize, u8, &[u8])> {
    if pkt.len() < 40 || pkt[0] != 0x45 || pkt[9] != PROTO_TCP {
        return None;
    }
    // MF set or a fragment offset: leave it alone.
    if u16::from_be_bytes([pkt[6], pkt[7]]) & 0x3fff != 0 {
        return None;
    }
    let total = usize::from(u16::from_be_bytes([pkt[2], pkt[3]]));
    let thl = usize::from(pkt[32] >> 4) * 4;
    if total != pkt.len() || thl < 20 || 20 + thl > total {
        return None;
    }
    let t = &pkt[20..];
    let key = FlowKey {
        addrs: pkt[12..20].try_into().ok()?,
        ports: t[0..4].try_into().ok()?,
        ihl: 20,
        thl,
        ack: t[8..12].try_into().ok()?,
        window: t[14..16].try_into().ok()?,
        ttl_tos: [pkt[1], pkt[8]],
    };
    let seq = u32::from_be_bytes(t[4..8].try_into().ok()?);
    Some((key, seq, total - 20 - thl, t[13], &t[20..thl]))
}

#[cfg(test)]
#[path = "packet_tests.rs"]
mod tests;
