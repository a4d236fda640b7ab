//! The IPVS generic-netlink message family (`include/uapi/linux/ip_vs.h`, family "IPVS",
//! version 1) on `netlink-packet-generic`: [`IpvsMsg`] is one request or reply, its service
//! and destination attributes nested as the kernel wants them.
//!
//! Encodings (from `ip_vs_ctl.c`'s policies): AF, protocol and the destination's address
//! family are u16 in host order; addresses are 16 bytes (`nf_inet_addr`, IPv4 in the first
//! 4); ports are big-endian u16; the scheduler name is NUL-terminated; the flags are
//! `{flags, mask}` (two host-order u32); timeout, netmask, forwarding method, weight,
//! thresholds and counters are host-order u32.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use netlink_packet_core::{
    DecodeError, DefaultNla, Emitable, NLA_F_NESTED, Nla, NlaBuffer, NlasIterator, Parseable,
    ParseableParametrized,
};
use netlink_packet_generic::{GenlFamily, GenlHeader};

use crate::types::{Dest, Forward, Service, ServiceKey};

/// The family's name, resolved to its id through the generic-netlink controller.
pub const FAMILY_NAME: &str = "IPVS";
/// `IPVS_GENL_VERSION`.
pub const FAMILY_VERSION: u8 = 1;

/// `IPVS_CMD_*`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Cmd {
    NewService = 1,
    SetService = 2,
    DelService = 3,
    GetService = 4,
    NewDest = 5,
    SetDest = 6,
    DelDest = 7,
    GetDest = 8,
    SetConfig = 12,
    GetConfig = 13,
    Flush = 17,
}

impl Cmd {
    fn from_u8(v: u8) -> Result<Self, DecodeError> {
        Ok(match v {
            1 => Self::NewService,
            2 => Self::SetService,
            3 => Self::DelService,
            4 => Self::GetService,
            5 => Self::NewDest,
            6 => Self::SetDest,
            7 => Self::DelDest,
            8 => Self::GetDest,
            12 => Self::SetConfig,
            13 => Self::GetConfig,
            17 => Self::Flush,
            other => return Err(format!("unknown IPVS command {other}").into()),
        })
    }
}

// IPVS_CMD_ATTR_*
const CMD_ATTR_SERVICE: u16 = 1;
const CMD_ATTR_DEST: u16 = 2;
const CMD_ATTR_TIMEOUT_TCP: u16 = 4;
const CMD_ATTR_TIMEOUT_TCP_FIN: u16 = 5;
const CMD_ATTR_TIMEOUT_UDP: u16 = 6;
// IPVS_SVC_ATTR_*
const SVC_AF: u16 = 1;
const SVC_PROTOCOL: u16 = 2;
const SVC_ADDR: u16 = 3;
const SVC_PORT: u16 = 4;
const SVC_FWMARK: u16 = 5;
const SVC_SCHED_NAME: u16 = 6;
const SVC_FLAGS: u16 = 7;
const SVC_TIMEOUT: u16 = 8;
const SVC_NETMASK: u16 = 9;
// IPVS_DEST_ATTR_*
const DEST_ADDR: u16 = 1;
const DEST_PORT: u16 = 2;
const DEST_FWD_METHOD: u16 = 3;
const DEST_WEIGHT: u16 = 4;
const DEST_U_THRESH: u16 = 5;
const DEST_L_THRESH: u16 = 6;
const DEST_ACTIVE_CONNS: u16 = 7;
const DEST_INACT_CONNS: u16 = 8;
const DEST_PERSIST_CONNS: u16 = 9;
const DEST_ADDR_FAMILY: u16 = 11;

const AF_INET: u16 = libc::AF_INET as u16;
const AF_INET6: u16 = libc::AF_INET6 as u16;

/// One attribute, as emitted.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Attr {
    U16(u16, u16),
    U32(u16, u32),
    Be16(u16, u16),
    Bytes(u16, Vec<u8>),
    Nested(u16, Vec<Attr>),
}

impl Nla for Attr {
    fn value_len(&self) -> usize {
        match self {
            Attr::U16(..) | Attr::Be16(..) => 2,
            Attr::U32(..) => 4,
            Attr::Bytes(_, b) => b.len(),
            Attr::Nested(_, attrs) => attrs.as_slice().buffer_len(),
        }
    }

    fn kind(&self) -> u16 {
        match self {
            Attr::U16(k, _) | Attr::U32(k, _) | Attr::Be16(k, _) | Attr::Bytes(k, _) => *k,
            Attr::Nested(k, _) => *k | NLA_F_NESTED,
        }
    }

    fn emit_value(&self, buffer: &mut [u8]) {
        match self {
            Attr::U16(_, v) => buffer[..2].copy_from_slice(&v.to_ne_bytes()),
            Attr::U32(_, v) => buffer[..4].copy_from_slice(&v.to_ne_bytes()),
            Attr::Be16(_, v) => buffer[..2].copy_from_slice(&v.to_be_bytes()),
            Attr::Bytes(_, b) => buffer[..b.len()].copy_from_slice(b),
            Attr::Nested(_, attrs) => attrs.as_slice().emit(buffer),
        }
    }
}

fn af(addr: IpAddr) -> u16 {
    match addr {
        IpAddr::V4(_) => AF_INET,
        IpAddr::V6(_) => AF_INET6,
    }
}

fn addr_bytes(addr: IpAddr) -> Vec<u8> {
    let mut b = vec![0u8; 16];
    match addr {
        IpAddr::V4(a) => b[..4].copy_from_slice(&a.octets()),
        IpAddr::V6(a) => b.copy_from_slice(&a.octets()),
    }
    b
}

fn key_attrs(k: &ServiceKey) -> Vec<Attr> {
    if k.fwmark != 0 {
        return vec![
            Attr::U16(SVC_AF, af(k.addr)),
            Attr::U32(SVC_FWMARK, k.fwmark),
        ];
    }
    vec![
        Attr::U16(SVC_AF, af(k.addr)),
        Attr::U16(SVC_PROTOCOL, crate::types::protocol_number(k.protocol)),
        Attr::Bytes(SVC_ADDR, addr_bytes(k.addr)),
        Attr::Be16(SVC_PORT, k.port),
    ]
}

fn service_attrs(s: &Service) -> Vec<Attr> {
    let mut a = key_attrs(&s.key);
    let mut name = s.scheduler.as_bytes().to_vec();
    name.push(0);
    let mut flags = s.flags.to_ne_bytes().to_vec();
    flags.extend_from_slice(&u32::MAX.to_ne_bytes());
    a.extend([
        Attr::Bytes(SVC_SCHED_NAME, name),
        Attr::Bytes(SVC_FLAGS, flags),
        Attr::U32(SVC_TIMEOUT, s.timeout),
        Attr::U32(SVC_NETMASK, s.netmask),
    ]);
    a
}

fn dest_attrs(d: &Dest, full: bool) -> Vec<Attr> {
    let mut a = vec![
        Attr::Bytes(DEST_ADDR, addr_bytes(d.addr)),
        Attr::Be16(DEST_PORT, d.port),
    ];
    if full {
        a.extend([
            Attr::U32(DEST_FWD_METHOD, d.forward.code()),
            Attr::U32(DEST_WEIGHT, d.weight),
            Attr::U32(DEST_U_THRESH, d.upper_threshold),
            Attr::U32(DEST_L_THRESH, d.lower_threshold),
        ]);
    }
    a.push(Attr::U16(DEST_ADDR_FAMILY, af(d.addr)));
    a
}

/// What a message carries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Body {
    /// Nothing (FLUSH, a service dump request).
    Empty,
    /// A service's key only (DEL_SERVICE, a destination dump request).
    Key(ServiceKey),
    /// A whole service (NEW_SERVICE, SET_SERVICE, a service dump reply).
    Service(Service),
    /// A service key and a whole destination (NEW_DEST, SET_DEST, a destination dump reply,
    /// whose key is absent: `None`).
    Dest(Option<ServiceKey>, Dest),
    /// A service key and a destination's address and port (DEL_DEST).
    DestKey(ServiceKey, Dest),
    /// Connection timeouts in seconds (SET_CONFIG): TCP, TCP FIN, UDP; 0 leaves one as is.
    Timeouts(u32, u32, u32),
}

/// One IPVS generic-netlink message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IpvsMsg {
    pub cmd: Cmd,
    pub body: Body,
}

impl IpvsMsg {
    pub fn new(cmd: Cmd, body: Body) -> Self {
        Self { cmd, body }
    }

    fn attrs(&self) -> Vec<Attr> {
        match &self.body {
            Body::Empty => vec![],
            Body::Key(k) => vec![Attr::Nested(CMD_ATTR_SERVICE, key_attrs(k))],
            Body::Service(s) => vec![Attr::Nested(CMD_ATTR_SERVICE, service_attrs(s))],
            Body::Dest(k, d) => {
                let mut a: Vec<Attr> = k
                    .iter()
                    .map(|k| Attr::Nested(CMD_ATTR_SERVICE, key_attrs(k)))
                    .collect();
                a.push(Attr::Nested(CMD_ATTR_DEST, dest_attrs(d, true)));
                a
            }
            Body::DestKey(k, d) => vec![
                Attr::Nested(CMD_ATTR_SERVICE, key_attrs(k)),
                Attr::Nested(CMD_ATTR_DEST, dest_attrs(d, false)),
            ],
            Body::Timeouts(tcp, fin, udp) => vec![
                Attr::U32(CMD_ATTR_TIMEOUT_TCP, *tcp),
                Attr::U32(CMD_ATTR_TIMEOUT_TCP_FIN, *fin),
                Attr::U32(CMD_ATTR_TIMEOUT_UDP, *udp),
            ],
        }
    }
}

impl GenlFamily for IpvsMsg {
    fn family_name() -> &'static str {
        FAMILY_NAME
    }

    fn command(&self) -> u8 {
        self.cmd as u8
    }

    fn version(&self) -> u8 {
        FAMILY_VERSION
    }
}

impl Emitable for IpvsMsg {
    fn buffer_len(&self) -> usize {
        self.attrs().as_slice().buffer_len()
    }

    fn emit(&self, buffer: &mut [u8]) {
        self.attrs().as_slice().emit(buffer)
    }
}

/// The attributes of `buf` by kind (the nested flag cleared); later duplicates win.
fn attrs_of(buf: &[u8]) -> Result<Vec<DefaultNla>, DecodeError> {
    NlasIterator::new(buf)
        .map(|nla| nla.and_then(|n: NlaBuffer<&[u8]>| DefaultNla::parse(&n)))
        .collect()
}

fn value(nla: &DefaultNla) -> Vec<u8> {
    let mut v = vec![0u8; nla.value_len()];
    nla.emit_value(&mut v);
    v
}

fn kind(nla: &DefaultNla) -> u16 {
    nla.kind() & !NLA_F_NESTED
}

fn u16_of(v: &[u8]) -> Result<u16, DecodeError> {
    let b: [u8; 2] = v
        .get(..2)
        .and_then(|s| s.try_into().ok())
        .ok_or_else(|| DecodeError::invalid_number(2, v.len()))?;
    Ok(u16::from_ne_bytes(b))
}

fn be16_of(v: &[u8]) -> Result<u16, DecodeError> {
    Ok(u16::from_be(u16_of(v)?))
}

fn u32_of(v: &[u8]) -> Result<u32, DecodeError> {
    let b: [u8; 4] = v
        .get(..4)
        .and_then(|s| s.try_into().ok())
        .ok_or_else(|| DecodeError::invalid_number(4, v.len()))?;
    Ok(u32::from_ne_bytes(b))
}

fn addr_of(v: &[u8], family: u16) -> Result<IpAddr, DecodeError> {
    if v.len() < 16 {
        return Err(DecodeError::invalid_ip_address(v.len()));
    }
    match family {
        AF_INET => Ok(IpAddr::V4(Ipv4Addr::new(v[0], v[1], v[2], v[3]))),
        AF_INET6 => {
            let mut b = [0u8; 16];
            b.copy_from_slice(&v[..16]);
            Ok(IpAddr::V6(Ipv6Addr::from(b)))
        }
        other => Err(format!("unknown address family {other}").into()),
    }
}

/// A service's attributes: its key, and the whole service when the scheduler is present.
fn parse_service(buf: &[u8]) -> Result<(ServiceKey, Option<Service>), DecodeError> {
    let (mut family, mut proto, mut addr, mut port, mut mark) = (None, None, None, None, 0);
    let (mut sched, mut flags, mut timeout, mut netmask) = (None, 0, 0, 0);
    for nla in attrs_of(buf)? {
        let v = value(&nla);
        match kind(&nla) {
            SVC_AF => family = Some(u16_of(&v)?),
            SVC_PROTOCOL => proto = Some(u16_of(&v)?),
            SVC_ADDR => addr = Some(v),
            SVC_PORT => port = Some(be16_of(&v)?),
            SVC_FWMARK => mark = u32_of(&v)?,
            SVC_SCHED_NAME => {
                let end = v.iter().position(|b| *b == 0).unwrap_or(v.len());
                sched = Some(String::from_utf8(v[..end].to_vec())?);
            }
            SVC_FLAGS => flags = u32_of(&v)?,
            SVC_TIMEOUT => timeout = u32_of(&v)?,
            SVC_NETMASK => netmask = u32_of(&v)?,
            _ => {}
        }
    }
    let key = match (family, mark) {
        (Some(family), mark) if mark != 0 => Some(ServiceKey::fwmark(family == AF_INET6, mark)),
        _ => None,
    };
    if let Some(key) = key {
        return Ok((
            key,
            sched.map(|scheduler| Service {
                key,
                scheduler,
                flags,
                timeout,
                netmask,
            }),
        ));
    }
    let (Some(family), Some(proto), Some(addr), Some(port)) = (family, proto, addr, port) else {
        return Err(
            "service without af, protocol, address and port (fwmark services are not svcnet's)"
                .into(),
        );
    };
    let protocol = crate::types::protocol_of(proto)
        .ok_or_else(|| DecodeError::from(format!("unknown protocol {proto}")))?;
    let key = ServiceKey::new(protocol, addr_of(&addr, family)?, port);
    let service = sched.map(|scheduler| Service {
        key,
        scheduler,
        flags,
        timeout,
        netmask,
    });
    Ok((key, service))
}

fn parse_dest(buf: &[u8], service_family: Option<u16>) -> Result<Dest, DecodeError> {
    let (mut addr, mut port, mut family) = (None, None, service_family);
    let mut d = Dest::masq(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0, 0);
    for nla in attrs_of(buf)? {
        let v = value(&nla);
        match kind(&nla) {
            DEST_ADDR => addr = Some(v),
            DEST_PORT => port = Some(be16_of(&v)?),
            DEST_FWD_METHOD => d.forward = Forward::from_code(u32_of(&v)?),
            DEST_WEIGHT => d.weight = u32_of(&v)?,
            DEST_U_THRESH => d.upper_threshold = u32_of(&v)?,
            DEST_L_THRESH => d.lower_threshold = u32_of(&v)?,
            DEST_ACTIVE_CONNS => d.active_conns = u32_of(&v)?,
            DEST_INACT_CONNS => d.inactive_conns = u32_of(&v)?,
            DEST_PERSIST_CONNS => d.persist_conns = u32_of(&v)?,
            DEST_ADDR_FAMILY => family = Some(u16_of(&v)?),
            _ => {}
        }
    }
    let (Some(addr), Some(port), Some(family)) = (addr, port, family) else {
        return Err("destination without address, port and family".into());
    };
    d.addr = addr_of(&addr, family)?;
    d.port = port;
    Ok(d)
}

impl ParseableParametrized<[u8], GenlHeader> for IpvsMsg {
    fn parse_with_param(buf: &[u8], header: GenlHeader) -> Result<Self, DecodeError> {
        let cmd = Cmd::from_u8(header.cmd)?;
        let (mut service, mut dest) = (None, None);
        let mut timeouts = None;
        for nla in attrs_of(buf)? {
            let v = value(&nla);
            match kind(&nla) {
                CMD_ATTR_SERVICE => service = Some(parse_service(&v)?),
                CMD_ATTR_DEST => dest = Some(v),
                CMD_ATTR_TIMEOUT_TCP => {
                    timeouts.get_or_insert((0, 0, 0)).0 = u32_of(&v)?;
                }
                CMD_ATTR_TIMEOUT_TCP_FIN => {
                    timeouts.get_or_insert((0, 0, 0)).1 = u32_of(&v)?;
                }
                CMD_ATTR_TIMEOUT_UDP => {
                    timeouts.get_or_insert((0, 0, 0)).2 = u32_of(&v)?;
                }
                _ => {}
            }
        }
        let body = match (service, dest, timeouts) {
            (_, _, Some((t, f, u))) => Body::Timeouts(t, f, u),
            (svc, Some(d), None) => {
                let key = svc.map(|(k, _)| k);
                let family = key.map(|k| af(k.addr));
                let dest = parse_dest(&d, family)?;
                match (cmd, key) {
                    (Cmd::DelDest, Some(k)) => Body::DestKey(k, dest),
                    _ => Body::Dest(key, dest),
                }
            }
            (Some((_, Some(s))), None, None) => Body::Service(s),
            (Some((k, None)), None, None) => Body::Key(k),
            (None, None, None) => Body::Empty,
        };
        Ok(Self { cmd, body })
    }
}
