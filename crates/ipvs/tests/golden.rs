//! Golden messages: the exact bytes svcnet sends for each IPVS command, written out by hand
//! from `include/uapi/linux/ip_vs.h` and `ip_vs_ctl.c`'s attribute policy (host-order u16/u32,
//! big-endian ports, 16-byte addresses, NUL-terminated scheduler, `{flags, mask}`), and the
//! decoding of a kernel dump reply. The kernel tier (tests/uml.rs) checks that IPVS itself
//! accepts them.
#![allow(clippy::unwrap_used)]

use std::net::IpAddr;

use svcnet_ipvs::socket::{decode, encode, op_message};
use svcnet_ipvs::types::{F_HASHED, F_SCHED1, F_SCHED2};
use svcnet_ipvs::wire::{Body, Cmd, IpvsMsg};
use svcnet_ipvs::{Dest, DestKey, Op, Protocol, Service, ServiceKey};

const FAMILY: u16 = 0x22;
const REQ_ACK: u16 = 0x0005;

fn hex(s: &str) -> Vec<u8> {
    let s: String = s
        .lines()
        .map(|l| l.split('#').next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join(" ");
    s.split_whitespace()
        .map(|b| u8::from_str_radix(b, 16).unwrap())
        .collect()
}

fn key(proto: Protocol, addr: &str, port: u16) -> ServiceKey {
    ServiceKey::new(proto, addr.parse().unwrap(), port)
}

fn bytes(op: &Op, seq: u32) -> Vec<u8> {
    encode(op_message(op), FAMILY, seq, REQ_ACK)
}

#[test]
fn new_service_ipv4_tcp_rr() {
    let op = Op::AddService(Service::new(key(Protocol::Tcp, "10.96.0.10", 80), "rr"));
    assert_eq!(op.to_string(), "-A -t 10.96.0.10:80 -s rr");
    let want = hex("
        68 00 00 00  22 00  05 00  01 00 00 00  00 00 00 00   # nlmsghdr: len 104, IPVS, REQUEST|ACK, seq 1
        01 01 00 00                                         # genl: NEW_SERVICE, version 1
        54 00 01 80                                         # SERVICE (nested), 84 bytes
        06 00 01 00  02 00 00 00                            # AF = AF_INET
        06 00 02 00  06 00 00 00                            # PROTOCOL = TCP
        14 00 03 00  0a 60 00 0a  00 00 00 00  00 00 00 00  00 00 00 00   # ADDR
        06 00 04 00  00 50 00 00                            # PORT = 80, big-endian
        07 00 06 00  72 72 00 00                            # SCHED_NAME = \"rr\\0\"
        0c 00 07 00  00 00 00 00  ff ff ff ff               # FLAGS {0, mask all}
        08 00 08 00  00 00 00 00                            # TIMEOUT = 0
        08 00 09 00  ff ff ff ff                            # NETMASK = /32
    ");
    assert_eq!(bytes(&op, 1), want);
}

#[test]
fn new_service_ipv6_udp_persistent_mh_with_flags() {
    let mut s = Service::new(key(Protocol::Udp, "fd00:96::a", 53), "mh").persistent(10800);
    s.flags |= F_SCHED1 | F_SCHED2;
    let op = Op::AddService(s);
    assert_eq!(
        op.to_string(),
        "-A -u [fd00:96::a]:53 -s mh -b mh-fallback,mh-port -p 10800"
    );
    let want = hex("
        68 00 00 00  22 00  05 00  07 00 00 00  00 00 00 00   # seq 7
        01 01 00 00
        54 00 01 80
        06 00 01 00  0a 00 00 00                            # AF = AF_INET6 (10)
        06 00 02 00  11 00 00 00                            # PROTOCOL = UDP (17)
        14 00 03 00  fd 00 00 96  00 00 00 00  00 00 00 00  00 00 00 0a   # ADDR
        06 00 04 00  00 35 00 00                            # PORT = 53
        07 00 06 00  6d 68 00 00                            # \"mh\\0\"
        0c 00 07 00  19 00 00 00  ff ff ff ff               # PERSISTENT|SCHED1|SCHED2
        08 00 08 00  30 2a 00 00                            # TIMEOUT = 10800
        08 00 09 00  80 00 00 00                            # NETMASK = prefix 128
    ");
    assert_eq!(bytes(&op, 7), want);
}

#[test]
fn new_dest_carries_the_service_key_and_all_four_values() {
    let svc = key(Protocol::Tcp, "10.96.0.10", 80);
    let op = Op::AddDest(svc, Dest::masq("10.244.1.2".parse().unwrap(), 8080, 1));
    assert_eq!(
        op.to_string(),
        "-a -t 10.96.0.10:80 -r 10.244.1.2:8080 -m -w 1"
    );
    let want = hex("
        8c 00 00 00  22 00  05 00  02 00 00 00  00 00 00 00   # len 140, seq 2
        05 01 00 00                                         # NEW_DEST
        30 00 01 80                                         # SERVICE key, 48 bytes
        06 00 01 00  02 00 00 00
        06 00 02 00  06 00 00 00
        14 00 03 00  0a 60 00 0a  00 00 00 00  00 00 00 00  00 00 00 00
        06 00 04 00  00 50 00 00
        48 00 02 80                                         # DEST, 72 bytes
        14 00 01 00  0a f4 01 02  00 00 00 00  00 00 00 00  00 00 00 00   # ADDR
        06 00 02 00  1f 90 00 00                            # PORT = 8080
        08 00 03 00  00 00 00 00                            # FWD_METHOD = MASQ
        08 00 04 00  01 00 00 00                            # WEIGHT = 1
        08 00 05 00  00 00 00 00                            # U_THRESH
        08 00 06 00  00 00 00 00                            # L_THRESH
        06 00 0b 00  02 00 00 00                            # ADDR_FAMILY = AF_INET
    ");
    assert_eq!(bytes(&op, 2), want);
}

#[test]
fn del_dest_and_del_service_carry_keys_only() {
    let svc = key(Protocol::Tcp, "10.96.0.10", 80);
    let d = DestKey {
        addr: "10.244.1.2".parse().unwrap(),
        port: 8080,
    };
    let op = Op::DelDest(svc, d);
    assert_eq!(op.to_string(), "-d -t 10.96.0.10:80 -r 10.244.1.2:8080");
    let want = hex("
        6c 00 00 00  22 00  05 00  03 00 00 00  00 00 00 00   # len 108
        07 01 00 00                                         # DEL_DEST
        30 00 01 80
        06 00 01 00  02 00 00 00
        06 00 02 00  06 00 00 00
        14 00 03 00  0a 60 00 0a  00 00 00 00  00 00 00 00  00 00 00 00
        06 00 04 00  00 50 00 00
        28 00 02 80                                         # DEST: address, port, family
        14 00 01 00  0a f4 01 02  00 00 00 00  00 00 00 00  00 00 00 00
        06 00 02 00  1f 90 00 00
        06 00 0b 00  02 00 00 00
    ");
    assert_eq!(bytes(&op, 3), want);
    let del = bytes(&Op::DelService(svc), 4);
    assert_eq!(del.len(), 16 + 4 + 48);
    assert_eq!(&del[16..20], &[3, 1, 0, 0]);
    let flush = bytes(&Op::Flush, 5);
    assert_eq!(
        flush,
        hex("14 00 00 00 22 00 05 00 05 00 00 00 00 00 00 00 11 01 00 00")
    );
}

/// A GET_SERVICE dump reply as the kernel builds it (`ip_vs_genl_fill_service`): the key,
/// scheduler, an empty PE name, flags with F_HASHED, timeout, netmask and nested stats, which
/// are skipped.
#[test]
fn dump_replies_decode() {
    let reply = hex("
        7c 00 00 00  22 00  02 00  09 00 00 00  00 00 00 00   # MULTI
        01 01 00 00                                         # NEW_SERVICE
        68 00 01 80                                         # SERVICE, 104 bytes
        06 00 01 00  02 00 00 00
        06 00 02 00  06 00 00 00
        14 00 03 00  0a 60 00 0a  00 00 00 00  00 00 00 00  00 00 00 00
        06 00 04 00  00 50 00 00
        07 00 06 00  73 68 00 00                            # \"sh\"
        05 00 0b 00  00 00 00 00                            # PE_NAME \"\"
        0c 00 07 00  0a 00 00 00  ff ff ff ff               # HASHED|SCHED1
        08 00 08 00  00 00 00 00
        08 00 09 00  ff ff ff ff
        0c 00 0a 80  08 00 01 00  05 00 00 00               # STATS { CONNS = 5 }
    ");
    let msg = decode(&reply).unwrap().unwrap();
    let mut want = Service::new(key(Protocol::Tcp, "10.96.0.10", 80), "sh");
    want.flags = F_HASHED | F_SCHED1;
    assert_eq!(
        msg,
        IpvsMsg::new(Cmd::NewService, Body::Service(want.clone()))
    );
    // The kernel's flag is not a difference in configuration.
    let mut asked = want.clone();
    asked.flags = F_SCHED1;
    let Body::Service(got) = msg.body else {
        panic!()
    };
    assert!(asked.same_config(&got));

    let dest = hex("
        5c 00 00 00  22 00  02 00  0a 00 00 00  00 00 00 00
        05 01 00 00                                         # NEW_DEST
        48 00 02 80                                         # DEST, 72 bytes
        14 00 01 00  0a f4 02 02  00 00 00 00  00 00 00 00  00 00 00 00
        06 00 02 00  1f 90 00 00
        08 00 03 00  00 00 00 00
        08 00 04 00  00 00 00 00                            # WEIGHT 0 (draining)
        08 00 07 00  02 00 00 00                            # ACTIVE 2
        08 00 08 00  03 00 00 00                            # INACTIVE 3
        06 00 0b 00  02 00 00 00
    ");
    let Body::Dest(None, d) = decode(&dest).unwrap().unwrap().body else {
        panic!()
    };
    assert_eq!(d.addr, "10.244.2.2".parse::<IpAddr>().unwrap());
    assert_eq!(
        (d.port, d.weight, d.active_conns, d.inactive_conns),
        (8080, 0, 2, 3)
    );
}

/// Every request decodes back to itself (the fake and the kernel tier read what was sent).
#[test]
fn requests_round_trip() {
    let v6 = key(Protocol::Sctp, "fd00::1", 9);
    let ops = [
        Op::AddService(Service::new(v6, "wlc").persistent(60)),
        Op::EditService(Service::new(v6, "lc")),
        Op::AddDest(v6, Dest::masq("fd00:244:1::2".parse().unwrap(), 9, 3)),
        Op::EditDest(v6, Dest::masq("fd00:244:1::2".parse().unwrap(), 9, 0)),
        Op::DelService(v6),
    ];
    for (i, op) in ops.iter().enumerate() {
        let msg = op_message(op);
        let back = decode(&encode(msg.clone(), FAMILY, i as u32, REQ_ACK)).unwrap();
        assert_eq!(back, Some(msg), "{op}");
    }
}

#[test]
fn firewall_mark_services_carry_family_and_mark_only() {
    let k = ServiceKey::fwmark(false, 0x5300_0001);
    let op = Op::DelService(k);
    assert_eq!(op.to_string(), "-D -f 1392508929");
    let want = hex("
        28 00 00 00  22 00  05 00  0b 00 00 00  00 00 00 00
        03 01 00 00                                         # DEL_SERVICE
        14 00 01 80
        06 00 01 00  02 00 00 00                            # AF
        08 00 05 00  01 00 00 53                            # FWMARK 0x53000001
    ");
    assert_eq!(bytes(&op, 11), want);
    let svc = Service::new(k, "rr");
    let back = decode(&bytes(&Op::AddService(svc.clone()), 12))
        .unwrap()
        .unwrap();
    assert_eq!(back.body, Body::Service(svc));
}
