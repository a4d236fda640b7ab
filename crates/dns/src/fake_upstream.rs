//! A fake upstream resolver for tests and benchmarks: serves fixed records over UDP and TCP on a
//! loopback port, follows CNAMEs among them, answers NXDOMAIN/NODATA with an SOA, truncates UDP
//! answers over the client's size, and counts the questions it gets. It never reaches beyond
//! the machine.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

use hickory_proto::op::{Message, MessageType, ResponseCode};
use hickory_proto::rr::rdata::SOA;
use hickory_proto::rr::{Name, RData, Record, RecordType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, UdpSocket};
use tokio::task::JoinSet;

/// A running fake upstream; stops when dropped.
pub struct FakeUpstream {
    addr: SocketAddr,
    queries: Arc<AtomicUsize>,
    tcp_queries: Arc<AtomicUsize>,
    records: Arc<RwLock<Vec<Record>>>,
    _tasks: JoinSet<()>,
}

/// A UDP socket and a TCP listener on the same free loopback port. The UDP port is free, but
/// its TCP twin may be taken by another process: try other ports a bounded number of times.
async fn bind_pair() -> std::io::Result<(UdpSocket, TcpListener)> {
    let mut last = None;
    for _ in 0..50 {
        let udp = UdpSocket::bind("127.0.0.1:0").await?;
        match TcpListener::bind(udp.local_addr()?).await {
            Ok(tcp) => return Ok((udp, tcp)),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("no free port pair")))
}

impl FakeUpstream {
    /// Serve `records` on a free loopback port (UDP and TCP).
    pub async fn start(records: Vec<Record>) -> std::io::Result<FakeUpstream> {
        let (udp, tcp) = bind_pair().await?;
        let addr = udp.local_addr()?;
        let records = Arc::new(RwLock::new(records));
        let queries = Arc::new(AtomicUsize::new(0));
        let tcp_queries = Arc::new(AtomicUsize::new(0));
        let mut tasks = JoinSet::new();
        {
            let (records, queries) = (records.clone(), queries.clone());
            tasks.spawn(async move {
                let mut buf = vec![0u8; 65535];
                while let Ok((n, peer)) = udp.recv_from(&mut buf).await {
                    queries.fetch_add(1, Ordering::Relaxed);
                    if let Some(reply) = answer(&records, &buf[..n], true) {
                        let _ = udp.send_to(&reply, peer).await;
                    }
                }
            });
        }
        {
            let (records, queries) = (records.clone(), queries.clone());
            let tcp_queries = tcp_queries.clone();
            tasks.spawn(async move {
                while let Ok((mut stream, _)) = tcp.accept().await {
                    let records = records.clone();
                    let queries = queries.clone();
                    let tcp_queries = tcp_queries.clone();
                    tokio::spawn(async move {
                        let mut len = [0u8; 2];
                        while stream.read_exact(&mut len).await.is_ok() {
                            let mut buf = vec![0u8; usize::from(u16::from_be_bytes(len))];
                            if stream.read_exact(&mut buf).await.is_err() {
                                return;
                            }
                            queries.fetch_add(1, Ordering::Relaxed);
                            tcp_queries.fetch_add(1, Ordering::Relaxed);
                            let Some(reply) = answer(&records, &buf, false) else {
                                return;
                            };
                            let Ok(n) = u16::try_from(reply.len()) else {
                                return;
                            };
                            if stream.write_all(&n.to_be_bytes()).await.is_err()
                                || stream.write_all(&reply).await.is_err()
                            {
                                return;
                            }
                        }
                    });
                }
            });
        }
        Ok(FakeUpstream {
            addr,
            queries,
            tcp_queries,
            records,
            _tasks: tasks,
        })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Questions received so far (UDP and TCP).
    pub fn queries(&self) -> usize {
        self.queries.load(Ordering::Relaxed)
    }

    /// Serves `records` from now on.
    pub fn set_records(&self, records: Vec<Record>) {
        if let Ok(mut r) = self.records.write() {
            *r = records;
        }
    }

    /// Questions received over TCP so far.
    pub fn tcp_queries(&self) -> usize {
        self.tcp_queries.load(Ordering::Relaxed)
    }
}

/// The SOA the fake puts in negative answers (TTL and minimum 5 s).
pub fn fake_soa() -> Record {
    let origin = Name::root();
    let soa = SOA::new(origin.clone(), origin.clone(), 1, 3600, 600, 86400, 5);
    Record::from_rdata(origin, 5, RData::SOA(soa))
}

fn answer(records: &RwLock<Vec<Record>>, query: &[u8], udp: bool) -> Option<Vec<u8>> {
    let records = records.read().ok()?;
    let request = Message::from_vec(query).ok()?;
    let q = request.queries.first()?.clone();
    let mut response = Message::response(request.metadata.id, request.metadata.op_code);
    response.metadata.recursion_desired = request.metadata.recursion_desired;
    response.metadata.recursion_available = true;
    response.add_query(q.clone());
    let mut name = q.name().clone();
    for _ in 0..8 {
        let at_name: Vec<&Record> = records.iter().filter(|r| r.name == name).collect();
        if at_name.is_empty() {
            if response.answers.is_empty() {
                response.metadata.response_code = ResponseCode::NXDomain;
            }
            response.add_authority(fake_soa());
            break;
        }
        let wanted: Vec<Record> = at_name
            .iter()
            .filter(|r| r.record_type() == q.query_type())
            .map(|r| (*r).clone())
            .collect();
        if !wanted.is_empty() {
            response.add_answers(wanted);
            break;
        }
        match at_name.iter().find_map(|r| match &r.data {
            RData::CNAME(c) => Some(((*r).clone(), c.0.clone())),
            _ => None,
        }) {
            Some((cname, target)) if q.query_type() != RecordType::CNAME => {
                response.add_answer(cname);
                name = target;
            }
            _ => {
                response.add_authority(fake_soa());
                break;
            }
        }
    }
    let bytes = response.to_vec().ok()?;
    let limit = usize::from(request.max_payload().max(512));
    if udp && bytes.len() > limit {
        let mut truncated = Message::response(request.metadata.id, request.metadata.op_code);
        truncated.metadata.message_type = MessageType::Response;
        truncated.metadata.truncation = true;
        truncated.add_query(q);
        return truncated.to_vec().ok();
    }
    Some(bytes)
}
