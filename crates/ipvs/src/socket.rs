//! A blocking IPVS client over generic netlink: resolves the "IPVS" family through the
//! controller, then sends [`Op`]s batched into few datagrams (each request acknowledged, the
//! acknowledgements collected by sequence number) and dumps services and destinations. The
//! socket belongs to the network namespace of the thread that opens it (open it inside
//! `NetNs::run` for a node namespace).

use netlink_packet_core::{
    NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload,
};
use netlink_packet_generic::GenlMessage;
use netlink_packet_generic::ctrl::nlas::GenlCtrlAttrs;
use netlink_packet_generic::ctrl::{GenlCtrl, GenlCtrlCmd};
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_GENERIC};

use crate::types::{Dest, Op, Rejected, Service, ServiceKey, Timeouts};
use crate::wire::{Body, Cmd, IpvsMsg};
use crate::{Ipvs, IpvsError};

/// Requests per datagram (each ~100 bytes; their acknowledgements are 36 bytes each).
const BATCH: usize = 256;

/// Dump messages, and the first error with the sequence number of its request.
type Replies = (Vec<IpvsMsg>, Option<(u32, i32)>);

/// An open IPVS generic-netlink socket.
pub struct IpvsSocket {
    sock: Socket,
    family: u16,
    seq: u32,
}

impl std::fmt::Debug for IpvsSocket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IpvsSocket")
            .field("family", &self.family)
            .finish()
    }
}

fn io(what: &'static str) -> impl FnOnce(std::io::Error) -> IpvsError {
    move |source| IpvsError::Io { what, source }
}

impl IpvsSocket {
    /// Opens a socket in the current network namespace and resolves the IPVS family (which
    /// makes the kernel load `ip_vs` when it can). [`IpvsError::NotAvailable`] when the
    /// kernel has no IPVS.
    pub fn open() -> Result<Self, IpvsError> {
        let mut sock =
            Socket::new(NETLINK_GENERIC).map_err(io("opening a generic netlink socket"))?;
        sock.bind_auto().map_err(io("binding the netlink socket"))?;
        sock.connect(&SocketAddr::new(0, 0))
            .map_err(io("connecting the netlink socket"))?;
        // Acknowledgements without the request echoed; errors carry the kernel's message.
        let _ = sock.set_cap_ack(true);
        let _ = sock.set_ext_ack(true);
        let _ = sock.set_rx_buf_sz(4 << 20);
        let mut s = Self {
            sock,
            family: 0,
            seq: 0,
        };
        s.family = s.resolve()?;
        Ok(s)
    }

    fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1);
        self.seq
    }

    fn resolve(&mut self) -> Result<u16, IpvsError> {
        let mut msg = NetlinkMessage::from(GenlMessage::from_payload(GenlCtrl {
            cmd: GenlCtrlCmd::GetFamily,
            nlas: vec![GenlCtrlAttrs::FamilyName(
                crate::wire::FAMILY_NAME.to_string(),
            )],
        }));
        msg.header.flags = NLM_F_REQUEST | NLM_F_ACK;
        msg.header.sequence_number = self.next_seq();
        msg.finalize();
        let mut buf = vec![0u8; msg.buffer_len()];
        msg.serialize(&mut buf);
        self.sock
            .send(&buf, 0)
            .map_err(io("sending to the netlink controller"))?;
        let mut family = None;
        loop {
            let (data, _) = self
                .sock
                .recv_from_full()
                .map_err(io("reading from the netlink controller"))?;
            let mut off = 0;
            while off < data.len() {
                let msg = NetlinkMessage::<GenlMessage<GenlCtrl>>::deserialize(&data[off..])
                    .map_err(|e| IpvsError::Decode(e.to_string()))?;
                let len = aligned(msg.header.length as usize);
                if len == 0 {
                    break;
                }
                off += len;
                match msg.payload {
                    NetlinkPayload::InnerMessage(m) => {
                        family = m.payload.nlas.iter().find_map(|a| match a {
                            GenlCtrlAttrs::FamilyId(id) => Some(*id),
                            _ => None,
                        });
                    }
                    NetlinkPayload::Error(e) if e.code.is_none() => {
                        return family.ok_or_else(|| {
                            IpvsError::Decode("the controller named no family id".into())
                        });
                    }
                    NetlinkPayload::Error(e) => {
                        let errno = -e.raw_code();
                        return Err(if errno == libc::ENOENT {
                            IpvsError::NotAvailable
                        } else {
                            IpvsError::Io {
                                what: "resolving the IPVS family",
                                source: std::io::Error::from_raw_os_error(errno),
                            }
                        });
                    }
                    _ => {}
                }
            }
        }
    }

    fn message(&mut self, msg: IpvsMsg, flags: u16) -> (u32, Vec<u8>) {
        let seq = self.next_seq();
        (seq, encode(msg, self.family, seq, flags))
    }

    /// Reads replies until `pending` (sequence numbers) are all acknowledged or a dump's
    /// DONE arrives; returns dump messages and the first error with its sequence number.
    fn collect(
        &mut self,
        pending: &mut std::collections::BTreeSet<u32>,
        dump: bool,
    ) -> Result<Replies, IpvsError> {
        let mut out = Vec::new();
        let mut first_err = None;
        while !pending.is_empty() {
            let (data, _) = self
                .sock
                .recv_from_full()
                .map_err(io("reading IPVS replies"))?;
            let mut off = 0;
            while off + 16 <= data.len() {
                let msg = NetlinkMessage::<GenlMessage<IpvsMsg>>::deserialize(&data[off..])
                    .map_err(|e| IpvsError::Decode(e.to_string()))?;
                let len = aligned(msg.header.length as usize);
                if len == 0 {
                    break;
                }
                off += len;
                let seq = msg.header.sequence_number;
                match msg.payload {
                    NetlinkPayload::InnerMessage(m) => out.push(m.payload),
                    NetlinkPayload::Done(_) if dump => {
                        pending.remove(&seq);
                    }
                    NetlinkPayload::Error(e) => {
                        // Only answers to this batch's requests count (not a late one).
                        let ours = pending.remove(&seq);
                        if ours && e.code.is_some() && first_err.is_none() {
                            first_err = Some((seq, -e.raw_code()));
                        }
                    }
                    _ => {}
                }
            }
        }
        Ok((out, first_err))
    }

    /// Sets the connection timeouts (ipvsadm `--set`, kube-proxy's `--ipvs-tcp-timeout`,
    /// `--ipvs-tcpfin-timeout`, `--ipvs-udp-timeout`): whole seconds, 0 leaves one as it is.
    pub fn set_timeouts(&mut self, t: Timeouts) -> Result<(), IpvsError> {
        let msg = IpvsMsg::new(Cmd::SetConfig, Body::Timeouts(t.tcp, t.tcp_fin, t.udp));
        match self.request(msg, false, "sending the IPVS timeouts")? {
            (_, Some((_, errno))) => Err(IpvsError::Rejected(Rejected {
                op: format!("--set {} {} {}", t.tcp, t.tcp_fin, t.udp),
                errno,
            })),
            _ => Ok(()),
        }
    }

    /// The connection timeouts in force (ipvsadm `-L --timeout`).
    pub fn timeouts(&mut self) -> Result<Timeouts, IpvsError> {
        let msg = IpvsMsg::new(Cmd::GetConfig, Body::Empty);
        let (replies, err) = self.request(msg, false, "asking for the IPVS timeouts")?;
        if let Some((_, errno)) = err {
            return Err(IpvsError::Io {
                what: "reading the IPVS timeouts",
                source: std::io::Error::from_raw_os_error(errno),
            });
        }
        replies
            .into_iter()
            .find_map(|m| match m.body {
                Body::Timeouts(tcp, tcp_fin, udp) => Some(Timeouts { tcp, tcp_fin, udp }),
                _ => None,
            })
            .ok_or_else(|| IpvsError::Decode("the timeouts reply carried no timeouts".into()))
    }

    /// Sends one request (a dump with `dump`) and reads its replies and its error, if any.
    fn request(
        &mut self,
        msg: IpvsMsg,
        dump: bool,
        sending: &'static str,
    ) -> Result<Replies, IpvsError> {
        let flags = NLM_F_REQUEST | NLM_F_ACK | if dump { NLM_F_DUMP } else { 0 };
        let (seq, buf) = self.message(msg, flags);
        self.sock.send(&buf, 0).map_err(io(sending))?;
        let mut pending = [seq].into_iter().collect();
        self.collect(&mut pending, dump)
    }

    fn dump(&mut self, msg: IpvsMsg) -> Result<Vec<IpvsMsg>, IpvsError> {
        let (out, err) = self.request(msg, true, "sending an IPVS dump request")?;
        if let Some((_, errno)) = err {
            return Err(IpvsError::Io {
                what: "dumping IPVS",
                source: std::io::Error::from_raw_os_error(errno),
            });
        }
        Ok(out)
    }
}

/// The bytes of one request: netlink header (`family` as its type, `seq`, `flags`, port 0),
/// generic-netlink header and attributes.
pub fn encode(msg: IpvsMsg, family: u16, seq: u32, flags: u16) -> Vec<u8> {
    let mut genl = GenlMessage::from_payload(msg);
    genl.set_resolved_family_id(family);
    let mut nl = NetlinkMessage::new(NetlinkHeader::default(), NetlinkPayload::InnerMessage(genl));
    nl.header.flags = flags;
    nl.header.sequence_number = seq;
    nl.finalize();
    let mut buf = vec![0u8; nl.buffer_len()];
    nl.serialize(&mut buf);
    buf
}

/// Decodes one reply (or request) message: the IPVS message, or `None` for a netlink
/// control message (ack, done).
pub fn decode(bytes: &[u8]) -> Result<Option<IpvsMsg>, IpvsError> {
    let msg = NetlinkMessage::<GenlMessage<IpvsMsg>>::deserialize(bytes)
        .map_err(|e| IpvsError::Decode(e.to_string()))?;
    Ok(match msg.payload {
        NetlinkPayload::InnerMessage(m) => Some(m.payload),
        _ => None,
    })
}

fn aligned(len: usize) -> usize {
    (len + 3) & !3
}

/// The message of one operation.
pub fn op_message(op: &Op) -> IpvsMsg {
    match op {
        Op::AddService(s) => IpvsMsg::new(Cmd::NewService, Body::Service(s.clone())),
        Op::EditService(s) => IpvsMsg::new(Cmd::SetService, Body::Service(s.clone())),
        Op::DelService(k) => IpvsMsg::new(Cmd::DelService, Body::Key(*k)),
        Op::AddDest(k, d) => IpvsMsg::new(Cmd::NewDest, Body::Dest(Some(*k), d.clone())),
        Op::EditDest(k, d) => IpvsMsg::new(Cmd::SetDest, Body::Dest(Some(*k), d.clone())),
        Op::DelDest(k, d) => IpvsMsg::new(
            Cmd::DelDest,
            Body::DestKey(*k, Dest::masq(d.addr, d.port, 0)),
        ),
        Op::Flush => IpvsMsg::new(Cmd::Flush, Body::Empty),
    }
}

impl Ipvs for IpvsSocket {
    fn apply(&mut self, ops: &[Op]) -> Result<(), IpvsError> {
        let mut first: Option<Rejected> = None;
        for chunk in ops.chunks(BATCH) {
            let mut buf = Vec::new();
            let mut seqs = Vec::with_capacity(chunk.len());
            for op in chunk {
                let (seq, bytes) = self.message(op_message(op), NLM_F_REQUEST | NLM_F_ACK);
                seqs.push(seq);
                buf.extend_from_slice(&bytes);
            }
            self.sock
                .send(&buf, 0)
                .map_err(io("sending IPVS requests"))?;
            let mut pending = seqs.iter().copied().collect();
            let (_, err) = self.collect(&mut pending, false)?;
            if let (Some((seq, errno)), None) = (err, &first) {
                let i = seqs.iter().position(|s| *s == seq).unwrap_or(0);
                first = Some(Rejected {
                    op: chunk[i].to_string(),
                    errno,
                });
            }
        }
        match first {
            Some(r) => Err(IpvsError::Rejected(r)),
            None => Ok(()),
        }
    }

    fn services(&mut self) -> Result<Vec<Service>, IpvsError> {
        Ok(self
            .dump(IpvsMsg::new(Cmd::GetService, Body::Empty))?
            .into_iter()
            .filter_map(|m| match m.body {
                Body::Service(s) => Some(s),
                _ => None,
            })
            .collect())
    }

    fn dests(&mut self, key: &ServiceKey) -> Result<Vec<Dest>, IpvsError> {
        Ok(self
            .dump(IpvsMsg::new(Cmd::GetDest, Body::Key(*key)))?
            .into_iter()
            .filter_map(|m| match m.body {
                Body::Dest(_, d) => Some(d),
                _ => None,
            })
            .collect())
    }
}
