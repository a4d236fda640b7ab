//! Is an element in a set of a node's nftables table? One `NFT_MSG_GETSETELEM` request for
//! that key over a netfilter netlink socket made in the node's namespace: the kernel looks the
//! key up and answers with the element or `ENOENT`. (`nft get element`, or libnftables, first
//! loads every element of the set into its cache: 0.4 s for 20k elements, which as a poll
//! would both blur and slow what it measures.)

use std::io::{self, Read, Write};
use std::net::Ipv4Addr;

use socket2::{Domain, Protocol, Socket, Type};

use svcnet_netns::NetNs;

const NETLINK_NETFILTER: libc::c_int = 12;
const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFT_MSG_GETSETELEM: u16 = 13;
const NFPROTO_IPV4: u8 = 2;
const NLA_F_NESTED: u16 = 0x8000;
const NFTA_SET_ELEM_LIST_TABLE: u16 = 1;
const NFTA_SET_ELEM_LIST_SET: u16 = 2;
const NFTA_SET_ELEM_LIST_ELEMENTS: u16 = 3;
const NFTA_LIST_ELEM: u16 = 1;
const NFTA_SET_ELEM_KEY: u16 = 1;
const NFTA_DATA_VALUE: u16 = 1;
const NLMSG_ERROR: u16 = 2;

/// A netlink socket in one node's namespace.
pub struct ElementProbe {
    socket: Socket,
}

fn attr(out: &mut Vec<u8>, kind: u16, payload: &[u8]) {
    let len = 4 + payload.len();
    out.extend_from_slice(&(len as u16).to_ne_bytes());
    out.extend_from_slice(&kind.to_ne_bytes());
    out.extend_from_slice(payload);
    out.resize(out.len().next_multiple_of(4), 0);
}

fn nested(out: &mut Vec<u8>, kind: u16, inner: impl FnOnce(&mut Vec<u8>)) {
    let mut body = Vec::new();
    inner(&mut body);
    attr(out, kind | NLA_F_NESTED, &body);
}

/// The request for `key` in set `set` of the IPv4 table `table`.
fn request(table: &str, set: &str, key: &[u8], seq: u32) -> Vec<u8> {
    let mut body = vec![NFPROTO_IPV4, 0, 0, 0]; // nfgenmsg: family, version 0, res_id 0
    attr(
        &mut body,
        NFTA_SET_ELEM_LIST_TABLE,
        format!("{table}\0").as_bytes(),
    );
    attr(
        &mut body,
        NFTA_SET_ELEM_LIST_SET,
        format!("{set}\0").as_bytes(),
    );
    nested(&mut body, NFTA_SET_ELEM_LIST_ELEMENTS, |b| {
        nested(b, NFTA_LIST_ELEM, |b| {
            nested(b, NFTA_SET_ELEM_KEY, |b| attr(b, NFTA_DATA_VALUE, key));
        });
    });
    let mut msg = Vec::with_capacity(16 + body.len());
    msg.extend_from_slice(&((16 + body.len()) as u32).to_ne_bytes());
    msg.extend_from_slice(&((NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_GETSETELEM).to_ne_bytes());
    msg.extend_from_slice(&((libc::NLM_F_REQUEST | libc::NLM_F_ACK) as u16).to_ne_bytes());
    msg.extend_from_slice(&seq.to_ne_bytes());
    msg.extend_from_slice(&0u32.to_ne_bytes());
    msg.extend_from_slice(&body);
    msg
}

impl ElementProbe {
    pub fn open(netns: &str) -> io::Result<Self> {
        let ns = NetNs::open(netns).map_err(io::Error::other)?;
        let socket = ns
            .run(|| {
                Socket::new_raw(
                    Domain::from(libc::AF_NETLINK),
                    Type::RAW,
                    Some(Protocol::from(NETLINK_NETFILTER)),
                )
            })
            .map_err(io::Error::other)??;
        Ok(Self { socket })
    }

    /// Whether `ip . ip` is in the table's `hairpin` set (the pair svcnet adds for every
    /// endpoint, in the same transaction as its backend).
    pub fn has_hairpin(&self, table: &str, ip: Ipv4Addr) -> io::Result<bool> {
        let mut key = ip.octets().to_vec();
        key.extend_from_slice(&ip.octets());
        self.has(table, "hairpin", &key)
    }

    fn has(&self, table: &str, set: &str, key: &[u8]) -> io::Result<bool> {
        let msg = request(table, set, key, 1);
        // An unconnected netlink socket sends to the kernel.
        (&self.socket).write_all(&msg)?;
        let mut found = false;
        let mut buf = vec![0u8; 65536];
        loop {
            let n = (&self.socket).read(&mut buf)?;
            let mut rest = &buf[..n];
            while rest.len() >= 16 {
                let len = u32::from_ne_bytes(rest[0..4].try_into().expect("4 bytes")) as usize;
                let kind = u16::from_ne_bytes(rest[4..6].try_into().expect("2 bytes"));
                if len < 16 || len > rest.len() {
                    return Err(io::Error::other("malformed netlink answer"));
                }
                if kind == NLMSG_ERROR {
                    let errno = i32::from_ne_bytes(rest[16..20].try_into().expect("4 bytes"));
                    return match -errno {
                        0 => Ok(found),
                        libc::ENOENT => Ok(false),
                        e => Err(io::Error::from_raw_os_error(e)),
                    };
                }
                found = true; // the element (NFT_MSG_NEWSETELEM)
                rest = &rest[len.next_multiple_of(4).min(rest.len())..];
            }
        }
    }
}
