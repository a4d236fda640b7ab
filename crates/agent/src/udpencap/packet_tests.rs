use super::*;

/// A TCP/IPv4 packet 10.0.0.1:1000 → 10.0.0.2:2000 with `payload`, valid checksums.
fn tcp(seq: u32, flags: u8, payload: &[u8]) -> Vec<u8> {
    let total = 40 + payload.len();
    let mut p = vec![0u8; total];
    p[0] = 0x45;
    p[2..4].copy_from_slice(&(total as u16).to_be_bytes());
    p[6] = 0x40; // DF
    p[8] = 64;
    p[9] = PROTO_TCP;
    p[12..16].copy_from_slice(&[10, 0, 0, 1]);
    p[16..20].copy_from_slice(&[10, 0, 0, 2]);
    p[20..22].copy_from_slice(&1000u16.to_be_bytes());
    p[22..24].copy_from_slice(&2000u16.to_be_bytes());
    p[24..28].copy_from_slice(&seq.to_be_bytes());
    p[28..32].copy_from_slice(&7u32.to_be_bytes());
    p[32] = 5 << 4;
    p[33] = flags;
    p[34..36].copy_from_slice(&512u16.to_be_bytes());
    p[40..].copy_from_slice(payload);
    set_ipv4_checksum(&mut p, 20);
    let ps = pseudo_sum(&p, PROTO_TCP, total - 20);
    let c = !fold(sum(&p[20..], ps));
    p[36..38].copy_from_slice(&c.to_be_bytes());
    p
}

/// What a TUN hands over with a 1432-byte-MSS TCP super-packet.
const TSO_1432: VnetHdr = VnetHdr {
    flags: F_NEEDS_CSUM,
    gso_type: GSO_TCPV4,
    hdr_len: 40,
    gso_size: 1432,
    csum_start: 20,
    csum_offset: 16,
};

fn valid(p: &[u8]) -> bool {
    let ps = pseudo_sum(p, p[9], p.len() - 20);
    fold(sum(&p[..20], 0)) == 0xffff && fold(sum(&p[20..], ps)) == 0xffff
}

fn bytes(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i % 251) as u8).collect()
}

#[test]
fn vnet_header_round_trips() {
    let h = TSO_1432;
    let mut b = [0u8; VNET_HDR_LEN];
    h.write(&mut b);
    assert_eq!(b, [1, 1, 40, 0, 0x98, 5, 20, 0, 16, 0]);
    assert_eq!(VnetHdr::parse(&b), Some(h));
    assert_eq!(VnetHdr::parse(&b[..9]), None);
}

#[test]
fn a_tso_super_packet_splits_into_valid_segments_and_coalesces_back() {
    let payload = bytes(5000);
    let mut sup = tcp(100, TCP_ACK | TCP_PSH, &payload);
    // As the TUN hands it: a partial checksum (pseudo-header only).
    let ps = fold(pseudo_sum(&sup, PROTO_TCP, sup.len() - 20));
    sup[36..38].copy_from_slice(&ps.to_be_bytes());
    let hdr = TSO_1432;
    let mut out = Vec::new();
    let seg = segment(&sup, &hdr, &mut out).unwrap();
    assert_eq!(seg, 1472, "40 bytes of headers + 1432");
    let segs: Vec<&[u8]> = out.chunks(seg).collect();
    assert_eq!(segs.len(), 4);
    for (i, s) in segs.iter().enumerate() {
        assert!(valid(s), "segment {i} checksums");
        let seq = u32::from_be_bytes(s[24..28].try_into().unwrap());
        assert_eq!(seq, 100 + 1432 * i as u32);
        let psh = s[33] & TCP_PSH != 0;
        assert_eq!(psh, i == 3, "PSH only on the last");
        assert_eq!(s[40..], payload[i * 1432..(i * 1432 + 1432).min(5000)]);
    }

    let mut written = Vec::new();
    let mut co = Coalescer::default();
    for s in &segs {
        co.push(s, &mut |b| written.push(b.to_vec()));
    }
    co.flush(&mut |b| written.push(b.to_vec()));
    assert_eq!(written.len(), 1, "one super-packet for the TUN");
    let h = VnetHdr::parse(&written[0]).unwrap();
    assert_eq!(
        (h.flags, h.gso_type, h.gso_size, h.csum_start, h.csum_offset),
        (F_NEEDS_CSUM, GSO_TCPV4, 1432, 20, 16)
    );
    let mut back = written[0][VNET_HDR_LEN..].to_vec();
    assert_eq!(back[40..], payload[..]);
    assert_eq!(back[33], TCP_ACK | TCP_PSH);
    assert!(complete_checksum(&mut back, 20, 16));
    assert!(
        valid(&back),
        "the partial checksum completes to a valid one"
    );
}

#[test]
fn out_of_order_other_flows_and_control_segments_pass_alone() {
    let a = tcp(0, TCP_ACK, &bytes(100));
    let gap = tcp(500, TCP_ACK, &bytes(100));
    let syn = tcp(0, 0x02, &[]);
    let udp = {
        let mut u = tcp(0, TCP_ACK, &bytes(10));
        u[9] = PROTO_UDP;
        u
    };
    let mut written = Vec::new();
    let mut co = Coalescer::default();
    for p in [&a, &gap, &syn, &udp] {
        co.push(p, &mut |b| written.push(b.to_vec()));
    }
    co.flush(&mut |b| written.push(b.to_vec()));
    assert_eq!(written.len(), 4);
    for (w, p) in written.iter().zip([&a, &gap, &syn, &udp]) {
        assert_eq!(&w[VNET_HDR_LEN..], &p[..]);
        assert_eq!(VnetHdr::parse(w).unwrap().gso_type, GSO_NONE);
    }
}

#[test]
fn partial_checksums_complete() {
    let mut p = tcp(1, TCP_ACK, &bytes(333));
    let ps = fold(pseudo_sum(&p, PROTO_TCP, p.len() - 20));
    p[36..38].copy_from_slice(&ps.to_be_bytes());
    assert!(!valid(&p));
    assert!(complete_checksum(&mut p, 20, 16));
    assert!(valid(&p));
    assert_eq!(ipv4_dst(&p), Some(Ipv4Addr::new(10, 0, 0, 2)));
}

#[test]
fn the_wide_sum_equals_the_textbook_one() {
    // RFC 1071's loop: big-endian 16-bit words, an odd last byte padded with zero.
    let textbook = |d: &[u8]| -> u16 {
        let mut acc: u32 = 0;
        for pair in d.chunks(2) {
            acc += u32::from(pair[0]) << 8 | u32::from(*pair.get(1).unwrap_or(&0));
        }
        while acc > 0xffff {
            acc = (acc & 0xffff) + (acc >> 16);
        }
        acc as u16
    };
    let data: Vec<u8> = (0..3000u32).map(|i| (i * 7919 % 256) as u8).collect();
    let ones = [0xffu8; 100];
    for len in [0, 1, 2, 15, 16, 17, 31, 33, 1431, 1432, 3000] {
        assert_eq!(
            fold(sum(&data[..len], 0)),
            textbook(&data[..len]),
            "len {len}"
        );
        assert_eq!(
            fold(sum(&ones[..len.min(100)], 0)),
            textbook(&ones[..len.min(100)])
        );
    }
    assert_eq!(fold(sum(&data[..40], 0x1_2345)), {
        let t = u32::from(textbook(&data[..40])) + 0x1_2345;
        fold(u64::from(t))
    });
}
