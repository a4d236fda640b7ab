//! CoreDNS's Prometheus metrics, in its names and labels, so that dashboards and alerts made
//! for CoreDNS work unchanged: `coredns_dns_requests_total{server,zone,view,proto,family,type}`,
//! `coredns_dns_responses_total{server,zone,view,rcode,plugin}`, the
//! `coredns_dns_request_duration_seconds{server,zone,view}` histogram with CoreDNS's buckets,
//! `coredns_dns_request_size_bytes`/`coredns_dns_response_size_bytes{server,zone,view,proto}`
//! (UDP: the TCP path answers through hickory, which does not hand back the bytes), and the
//! answer cache as CoreDNS's cache plugin reports its own (`coredns_cache_hits_total{type}`,
//! `coredns_cache_misses_total`, `coredns_cache_entries`).
//!
//! Counting is a few relaxed atomic adds per answer into fixed arrays: no lock, no label
//! lookup, no allocation on the packet path. The text is made only when scraped.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The query types CoreDNS names in its labels; the rest are `other` (its `monitorType`).
const TYPES: [(u16, &str); 19] = [
    (1, "A"),
    (2, "NS"),
    (5, "CNAME"),
    (6, "SOA"),
    (12, "PTR"),
    (15, "MX"),
    (16, "TXT"),
    (28, "AAAA"),
    (33, "SRV"),
    (43, "DS"),
    (46, "RRSIG"),
    (47, "NSEC"),
    (48, "DNSKEY"),
    (50, "NSEC3"),
    (64, "SVCB"),
    (65, "HTTPS"),
    (251, "IXFR"),
    (252, "AXFR"),
    (255, "ANY"),
];
const OTHER: usize = TYPES.len();
const NTYPES: usize = TYPES.len() + 1;

/// CoreDNS's `plugin.TimeBuckets`: 0.25 ms doubling 16 times.
const TIME_BUCKETS: [f64; 16] = [
    0.00025, 0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1.024,
    2.048, 4.096, 8.192,
];
/// CoreDNS's size buckets.
const SIZE_BUCKETS: [f64; 14] = [
    0.0, 100.0, 200.0, 300.0, 400.0, 511.0, 1023.0, 2047.0, 4095.0, 8291.0, 16e3, 32e3, 48e3, 64e3,
];

/// The transport a question came on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proto {
    Udp = 0,
    Tcp = 1,
}

/// Who wrote an answer (CoreDNS's `plugin` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The cluster zone (CoreDNS's `kubernetes`, also for `k8s_external` names).
    Zone = 0,
    /// The upstream (CoreDNS's `forward`).
    Forward = 1,
    /// The server itself (malformed questions, unsupported opcodes): no plugin.
    Server = 2,
}

/// A histogram of atomics: per-bucket counts (not cumulative), sum and count.
#[derive(Debug)]
struct Histogram<const N: usize> {
    bounds: [f64; N],
    buckets: [AtomicU64; N],
    /// Sum in millionths (microseconds or micro-bytes), so it stays an integer add.
    sum_micros: AtomicU64,
    count: AtomicU64,
}

impl<const N: usize> Histogram<N> {
    fn new(bounds: [f64; N]) -> Self {
        Histogram {
            bounds,
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            sum_micros: AtomicU64::new(0),
            count: AtomicU64::new(0),
        }
    }

    fn observe(&self, value: f64) {
        if let Some(i) = self.bounds.iter().position(|b| value <= *b) {
            self.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
        // Values are small (seconds, bytes): the product fits, and rounding is below a µ.
        self.sum_micros
            .fetch_add((value * 1e6) as u64, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    fn write(&self, out: &mut String, name: &str, labels: &str) {
        let mut cumulative = 0;
        for (bound, count) in self.bounds.iter().zip(&self.buckets) {
            cumulative += count.load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{bound}\"}} {cumulative}");
        }
        let count = self.count.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {count}");
        let sum = self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(out, "{name}_sum{{{labels}}} {sum}");
        let _ = writeln!(out, "{name}_count{{{labels}}} {count}");
    }
}

/// Every counter of one server.
#[derive(Debug)]
pub struct DnsMetrics {
    /// CoreDNS's `server` label: `dns://<listen address>`.
    server: String,
    /// proto × family × type.
    requests: [AtomicU64; 2 * 2 * NTYPES],
    /// rcode (0-15) × source.
    responses: [AtomicU64; 16 * 3],
    duration: Histogram<16>,
    request_size: [Histogram<14>; 2],
    response_size: [Histogram<14>; 2],
    cache_hits: [AtomicU64; 2],
    cache_misses: AtomicU64,
}

/// One answered question, as the packet paths see it.
pub struct Observation {
    pub proto: Proto,
    pub ipv6: bool,
    pub qtype: Option<u16>,
    pub rcode: u8,
    pub source: Source,
    pub elapsed: Duration,
    /// The request's and the response's bytes, where the path has them.
    pub sizes: Option<(usize, usize)>,
    /// `Some(true)` answered from the answer cache, `Some(false)` a miss that the zone answered.
    pub cached: Option<bool>,
}

impl DnsMetrics {
    pub fn new(listen: std::net::SocketAddr) -> Self {
        DnsMetrics {
            server: format!("dns://{listen}"),
            requests: std::array::from_fn(|_| AtomicU64::new(0)),
            responses: std::array::from_fn(|_| AtomicU64::new(0)),
            duration: Histogram::new(TIME_BUCKETS),
            request_size: [Histogram::new(SIZE_BUCKETS), Histogram::new(SIZE_BUCKETS)],
            response_size: [Histogram::new(SIZE_BUCKETS), Histogram::new(SIZE_BUCKETS)],
            cache_hits: [AtomicU64::new(0), AtomicU64::new(0)],
            cache_misses: AtomicU64::new(0),
        }
    }

    /// Counts one answer.
    pub fn observe(&self, o: &Observation) {
        let ty = o
            .qtype
            .and_then(|q| TYPES.iter().position(|(t, _)| *t == q))
            .unwrap_or(OTHER);
        let index = (o.proto as usize * 2 + usize::from(o.ipv6)) * NTYPES + ty;
        self.requests[index].fetch_add(1, Ordering::Relaxed);
        let rcode = usize::from(o.rcode & 0x0f);
        self.responses[rcode * 3 + o.source as usize].fetch_add(1, Ordering::Relaxed);
        self.duration.observe(o.elapsed.as_secs_f64());
        if let Some((request, response)) = o.sizes {
            self.request_size[o.proto as usize].observe(request as f64);
            self.response_size[o.proto as usize].observe(response as f64);
        }
        match o.cached {
            Some(true) => {
                let denial = usize::from(rcode == 3);
                self.cache_hits[denial].fetch_add(1, Ordering::Relaxed);
            }
            Some(false) => {
                self.cache_misses.fetch_add(1, Ordering::Relaxed);
            }
            None => {}
        }
    }

    /// The Prometheus text format (0.0.4); `cache_entries` is the answer cache's size now.
    pub fn render(&self, cache_entries: usize) -> String {
        let mut out = String::with_capacity(8192);
        let base = format!("server=\"{}\",zone=\".\",view=\"\"", self.server);
        out.push_str("# HELP coredns_dns_requests_total Counter of DNS requests made per zone, protocol and family.\n# TYPE coredns_dns_requests_total counter\n");
        for proto in [Proto::Udp, Proto::Tcp] {
            for ipv6 in [false, true] {
                for ty in 0..NTYPES {
                    let index = (proto as usize * 2 + usize::from(ipv6)) * NTYPES + ty;
                    let n = self.requests[index].load(Ordering::Relaxed);
                    if n == 0 {
                        continue;
                    }
                    let name = TYPES.get(ty).map_or("other", |(_, n)| n);
                    let (p, f) = (proto_name(proto), if ipv6 { 2 } else { 1 });
                    let _ = writeln!(
                        out,
                        "coredns_dns_requests_total{{{base},proto=\"{p}\",family=\"{f}\",type=\"{name}\"}} {n}"
                    );
                }
            }
        }
        out.push_str("# HELP coredns_dns_responses_total Counter of response status codes.\n# TYPE coredns_dns_responses_total counter\n");
        for rcode in 0..16usize {
            for (source, plugin) in ["kubernetes", "forward", ""].iter().enumerate() {
                let n = self.responses[rcode * 3 + source].load(Ordering::Relaxed);
                if n == 0 {
                    continue;
                }
                let rc = rcode_name(rcode);
                let _ = writeln!(
                    out,
                    "coredns_dns_responses_total{{{base},rcode=\"{rc}\",plugin=\"{plugin}\"}} {n}"
                );
            }
        }
        out.push_str("# HELP coredns_dns_request_duration_seconds Histogram of the time (in seconds) each request took per zone.\n# TYPE coredns_dns_request_duration_seconds histogram\n");
        self.duration
            .write(&mut out, "coredns_dns_request_duration_seconds", &base);
        for (name, help, sizes) in [
            (
                "coredns_dns_request_size_bytes",
                "Size of the EDNS0 UDP buffer in bytes (64K for TCP) per zone and protocol.",
                &self.request_size,
            ),
            (
                "coredns_dns_response_size_bytes",
                "Size of the returned response in bytes.",
                &self.response_size,
            ),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
            for proto in [Proto::Udp, Proto::Tcp] {
                let labels = format!("{base},proto=\"{}\"", proto_name(proto));
                sizes[proto as usize].write(&mut out, name, &labels);
            }
        }
        let cache = format!("server=\"{}\",zones=\".\",view=\"\"", self.server);
        out.push_str("# HELP coredns_cache_hits_total The count of cache hits.\n# TYPE coredns_cache_hits_total counter\n");
        for (i, ty) in ["success", "denial"].iter().enumerate() {
            let n = self.cache_hits[i].load(Ordering::Relaxed);
            let _ = writeln!(out, "coredns_cache_hits_total{{{cache},type=\"{ty}\"}} {n}");
        }
        out.push_str("# HELP coredns_cache_misses_total The count of cache misses.\n# TYPE coredns_cache_misses_total counter\n");
        let misses = self.cache_misses.load(Ordering::Relaxed);
        let _ = writeln!(out, "coredns_cache_misses_total{{{cache}}} {misses}");
        out.push_str("# HELP coredns_cache_entries The number of elements in the cache.\n# TYPE coredns_cache_entries gauge\n");
        let _ = writeln!(
            out,
            "coredns_cache_entries{{{cache},type=\"success\"}} {cache_entries}"
        );
        out
    }
}

fn proto_name(proto: Proto) -> &'static str {
    match proto {
        Proto::Udp => "udp",
        Proto::Tcp => "tcp",
    }
}

/// The rcode as CoreDNS's label names it (miekg/dns's `RcodeToString`).
fn rcode_name(rcode: usize) -> String {
    const NAMES: [&str; 11] = [
        "NOERROR", "FORMERR", "SERVFAIL", "NXDOMAIN", "NOTIMP", "REFUSED", "YXDOMAIN", "YXRRSET",
        "NXRRSET", "NOTAUTH", "NOTZONE",
    ];
    NAMES
        .get(rcode)
        .map_or_else(|| rcode.to_string(), |n| (*n).to_string())
}

/// The question type of a DNS message in wire form (the first question's), if it has one
/// written without compression (as every query's is).
pub fn question_type(message: &[u8]) -> Option<u16> {
    let questions = u16::from_be_bytes([*message.get(4)?, *message.get(5)?]);
    if questions == 0 {
        return None;
    }
    let mut at = 12;
    loop {
        let len = usize::from(*message.get(at)?);
        if len == 0 {
            break;
        }
        if len & 0xc0 != 0 {
            return None;
        }
        at += len + 1;
    }
    Some(u16::from_be_bytes([
        *message.get(at + 1)?,
        *message.get(at + 2)?,
    ]))
}

/// The rcode and whether the answer is authoritative, from a response in wire form.
pub fn response_flags(response: &[u8]) -> (u8, bool) {
    match (response.get(2), response.get(3)) {
        (Some(flags), Some(rcode)) => (rcode & 0x0f, flags & 0x04 != 0),
        _ => (2, false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(name: &[u8], qtype: u16) -> Vec<u8> {
        let mut m = vec![0, 1, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0];
        m.extend_from_slice(name);
        m.extend_from_slice(&qtype.to_be_bytes());
        m.extend_from_slice(&[0, 1]);
        m
    }

    #[test]
    fn reads_the_question_type() {
        assert_eq!(question_type(&query(b"\x01a\x03svc\x00", 33)), Some(33));
        assert_eq!(question_type(&query(b"\x00", 1)), Some(1));
        assert_eq!(question_type(&query(b"\xc0\x0c", 1)), None);
        assert_eq!(question_type(&[0; 12]), None);
        assert_eq!(question_type(&query(b"\x05ab", 1)[..15]), None);
    }

    #[test]
    fn renders_coredns_names_and_counts() {
        let m = DnsMetrics::new("127.0.0.1:1053".parse().unwrap());
        let observe = |proto, qtype, rcode, source, cached| {
            m.observe(&Observation {
                proto,
                ipv6: false,
                qtype: Some(qtype),
                rcode,
                source,
                elapsed: Duration::from_micros(300),
                sizes: (proto == Proto::Udp).then_some((40, 90)),
                cached,
            });
        };
        observe(Proto::Udp, 1, 0, Source::Zone, Some(false));
        observe(Proto::Udp, 1, 0, Source::Zone, Some(true));
        observe(Proto::Udp, 1, 3, Source::Zone, Some(true));
        observe(Proto::Tcp, 33, 0, Source::Zone, None);
        observe(Proto::Udp, 99, 3, Source::Forward, None);
        let text = m.render(7);
        let s = "server=\"dns://127.0.0.1:1053\",zone=\".\",view=\"\"";
        for line in [
            format!("coredns_dns_requests_total{{{s},proto=\"udp\",family=\"1\",type=\"A\"}} 3"),
            format!("coredns_dns_requests_total{{{s},proto=\"tcp\",family=\"1\",type=\"SRV\"}} 1"),
            format!("coredns_dns_requests_total{{{s},proto=\"udp\",family=\"1\",type=\"other\"}} 1"),
            format!("coredns_dns_responses_total{{{s},rcode=\"NOERROR\",plugin=\"kubernetes\"}} 3"),
            format!("coredns_dns_responses_total{{{s},rcode=\"NXDOMAIN\",plugin=\"forward\"}} 1"),
            format!("coredns_dns_request_duration_seconds_bucket{{{s},le=\"0.0005\"}} 5"),
            format!("coredns_dns_request_duration_seconds_count{{{s}}} 5"),
            format!("coredns_dns_response_size_bytes_bucket{{{s},proto=\"udp\",le=\"100\"}} 4"),
            "coredns_cache_hits_total{server=\"dns://127.0.0.1:1053\",zones=\".\",view=\"\",type=\"denial\"} 1".to_string(),
            "coredns_cache_misses_total{server=\"dns://127.0.0.1:1053\",zones=\".\",view=\"\"} 1".to_string(),
            "coredns_cache_entries{server=\"dns://127.0.0.1:1053\",zones=\".\",view=\"\",type=\"success\"} 7".to_string(),
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line}\n{text}");
        }
        assert!(
            !text.contains("le=\"0.00025\"} 5"),
            "300 µs is above the first bucket"
        );
    }
}
