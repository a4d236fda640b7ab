//! `GET /metrics`: the API server's Prometheus metrics in kube-apiserver's names and labels,
//! so that dashboards and alerts written for a real cluster read svcnet's unchanged.
//!
//! Requests are counted as upstream's `endpoints/metrics` does: `apiserver_request_total` and
//! the `apiserver_request_duration_seconds` histogram by verb (`LIST`/`WATCH`/`APPLY` told
//! apart from `GET`/`PATCH`), dry run, group, version, resource, subresource, scope and
//! component; long-running requests (watches, logs, exec) are recorded when they end, and
//! meanwhile show in `apiserver_longrunning_requests` (watches also in
//! `apiserver_registered_watchers`). Requests that are not long-running show in
//! `apiserver_current_inflight_requests`, as the high-water mark of the last second, as
//! upstream's max-in-flight filter reports it. Storage metrics (`etcd_request_duration_seconds`,
//! `apiserver_storage_objects`, `apiserver_storage_size_bytes`) come from [`crate::metered`].
//!
//! The exposition is Prometheus text format 0.0.4, what kube-apiserver serves. Nothing here
//! does I/O; the store is read by the caller.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::http::Method;

use crate::request::{ApiRequest, Subresource, Verb};

/// upstream's buckets of `apiserver_request_duration_seconds` and
/// `etcd_request_duration_seconds` (seconds).
pub(crate) const BUCKETS: [f64; 23] = [
    0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0,
    10.0, 15.0, 20.0, 30.0, 45.0, 60.0,
];

/// A histogram with [`BUCKETS`].
#[derive(Debug, Clone, Default)]
pub(crate) struct Histogram {
    /// Observations per bucket (not cumulative); the last slot is `+Inf`.
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    pub(crate) fn observe(&mut self, seconds: f64) {
        if self.counts.is_empty() {
            self.counts = vec![0; BUCKETS.len() + 1];
        }
        let slot = BUCKETS
            .iter()
            .position(|b| seconds <= *b)
            .unwrap_or(BUCKETS.len());
        self.counts[slot] += 1;
        self.sum += seconds;
        self.count += 1;
    }
}

/// The labels of one request, as upstream's `MonitorRequest` gives them.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Default)]
pub(crate) struct RequestLabels {
    pub verb: String,
    pub dry_run: String,
    pub group: String,
    pub version: String,
    pub resource: String,
    pub subresource: String,
    pub scope: String,
    pub component: String,
}

impl RequestLabels {
    fn pairs(&self) -> [(&'static str, &str); 8] {
        [
            ("component", &self.component),
            ("dry_run", &self.dry_run),
            ("group", &self.group),
            ("resource", &self.resource),
            ("scope", &self.scope),
            ("subresource", &self.subresource),
            ("verb", &self.verb),
            ("version", &self.version),
        ]
    }
}

/// What the dispatcher knows of a request before serving it.
#[derive(Debug, Clone)]
pub(crate) struct RequestInfo {
    pub labels: RequestLabels,
    /// Watches, logs and exec: counted while open, recorded when they end, and outside the
    /// in-flight gauge (upstream's `LongRunningRequestCheck`).
    pub long_running: bool,
    /// A write (counted as `mutating` in flight).
    pub mutating: bool,
    /// For a watch: its group, version and kind (`apiserver_registered_watchers`).
    pub watch_kind: Option<(String, String, String)>,
}

/// upstream's `cleanDryRun`: the values given, `invalid` when one is not `All`.
fn dry_run_label(uri: &axum::http::Uri) -> String {
    let values: Vec<String> = uri
        .query()
        .map(|q| {
            q.split('&')
                .filter_map(|kv| kv.split_once('=').or(Some((kv, ""))))
                .filter(|(k, _)| *k == "dryRun")
                .map(|(_, v)| v.to_string())
                .collect()
        })
        .unwrap_or_default();
    if values.is_empty() {
        String::new()
    } else if values.iter().all(|v| v == "All") {
        "All".into()
    } else {
        "invalid".into()
    }
}

impl RequestInfo {
    /// The labels of a request that parsed into `parsed` (or failed to parse).
    pub(crate) fn of(
        method: &Method,
        uri: &axum::http::Uri,
        content_type: &str,
        parsed: Option<&ApiRequest>,
    ) -> RequestInfo {
        let mut labels = RequestLabels {
            verb: method.as_str().to_ascii_uppercase(),
            dry_run: dry_run_label(uri),
            component: "apiserver".into(),
            ..Default::default()
        };
        let mutating = !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS);
        let Some(ApiRequest::Resource(r)) = parsed else {
            // A non-resource request is labelled by its path, as upstream does; an unknown
            // path by nothing, so that clients cannot grow the label set without bound.
            if parsed.is_some() {
                labels.subresource = uri.path().to_string();
            }
            return RequestInfo {
                labels,
                long_running: false,
                mutating,
                watch_kind: None,
            };
        };
        let res = r.resource;
        labels.verb = match r.verb {
            Verb::Get => "GET",
            Verb::List => "LIST",
            Verb::Watch => "WATCH",
            Verb::Create => "POST",
            Verb::Update => "PUT",
            Verb::Patch if crate::machinery::is_apply(content_type) => "APPLY",
            Verb::Patch => "PATCH",
            Verb::Delete => "DELETE",
            Verb::DeleteCollection => "DELETECOLLECTION",
            Verb::Connect => "CONNECT",
        }
        .into();
        labels.group = res.group.into();
        labels.version = res.version.into();
        labels.resource = res.plural.into();
        labels.subresource = match r.subresource {
            None => "",
            Some(Subresource::Status) => "status",
            Some(Subresource::Scale) => "scale",
            Some(Subresource::Log) => "log",
            Some(Subresource::Exec) => "exec",
            Some(Subresource::Attach) => "attach",
            Some(Subresource::PortForward) => "portforward",
        }
        .into();
        // upstream's CleanScope; a namespace's own path names the namespace.
        labels.scope = if r.namespace.is_some() || (res.plural == "namespaces" && r.name.is_some())
        {
            "namespace"
        } else if r.name.is_some() {
            "resource"
        } else {
            "cluster"
        }
        .into();
        let long_running = matches!(r.verb, Verb::Watch | Verb::Connect)
            || r.subresource == Some(Subresource::Log);
        RequestInfo {
            labels,
            long_running,
            mutating,
            watch_kind: (r.verb == Verb::Watch)
                .then(|| (res.group.into(), res.version.into(), res.kind.into())),
        }
    }
}

/// The storage side: one histogram per (operation, type).
pub(crate) type StorageKey = (&'static str, String);

/// What the server counts. One per [`crate::AppState`].
#[derive(Debug, Default)]
pub struct Metrics {
    requests: Mutex<BTreeMap<(RequestLabels, u16), u64>>,
    durations: Mutex<BTreeMap<RequestLabels, Histogram>>,
    longrunning: Mutex<BTreeMap<RequestLabels, i64>>,
    watchers: Mutex<BTreeMap<(String, String, String), i64>>,
    storage: Mutex<BTreeMap<StorageKey, Histogram>>,
    inflight: Mutex<Inflight>,
}

/// Requests in flight now, and the most of the last second, per kind (read-only, mutating).
#[derive(Debug, Default)]
struct Inflight {
    now: [u64; 2],
    peak: [u64; 2],
    since: Option<Instant>,
}

const PEAK_WINDOW: Duration = Duration::from_secs(1);

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while counting leaves at worst one count off; the metrics stay usable.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Held while a request that is not long-running is served.
pub(crate) struct InflightGuard<'a> {
    metrics: &'a Metrics,
    slot: usize,
}

impl Drop for InflightGuard<'_> {
    fn drop(&mut self) {
        let mut f = lock(&self.metrics.inflight);
        f.now[self.slot] = f.now[self.slot].saturating_sub(1);
    }
}

/// Held while a long-running request is open; records it when dropped (its body ended).
pub(crate) struct LongRunningGuard {
    metrics: std::sync::Arc<Metrics>,
    info: RequestInfo,
    code: u16,
    started: Instant,
}

impl Drop for LongRunningGuard {
    fn drop(&mut self) {
        self.metrics.close_long_running(&self.info);
        self.metrics.record(&self.info, self.code, self.started);
    }
}

impl Metrics {
    /// Counts a request that is not long-running as in flight until the guard drops.
    pub(crate) fn inflight(&self, mutating: bool) -> InflightGuard<'_> {
        let slot = usize::from(mutating);
        let mut f = lock(&self.inflight);
        let now = Instant::now();
        if f.since.is_none_or(|t| now.duration_since(t) > PEAK_WINDOW) {
            f.peak = f.now;
            f.since = Some(now);
        }
        f.now[slot] += 1;
        f.peak[slot] = f.peak[slot].max(f.now[slot]);
        InflightGuard {
            metrics: self,
            slot,
        }
    }

    /// Records a finished request.
    pub(crate) fn record(&self, info: &RequestInfo, code: u16, started: Instant) {
        *lock(&self.requests)
            .entry((info.labels.clone(), code))
            .or_default() += 1;
        lock(&self.durations)
            .entry(info.labels.clone())
            .or_default()
            .observe(started.elapsed().as_secs_f64());
    }

    /// Opens a long-running request; it is recorded when the returned guard drops.
    pub(crate) fn open_long_running(
        self: &std::sync::Arc<Self>,
        info: RequestInfo,
        code: u16,
        started: Instant,
    ) -> LongRunningGuard {
        *lock(&self.longrunning)
            .entry(long_running_labels(&info.labels))
            .or_default() += 1;
        if let Some(k) = &info.watch_kind {
            *lock(&self.watchers).entry(k.clone()).or_default() += 1;
        }
        LongRunningGuard {
            metrics: self.clone(),
            info,
            code,
            started,
        }
    }

    fn close_long_running(&self, info: &RequestInfo) {
        if let Some(n) = lock(&self.longrunning).get_mut(&long_running_labels(&info.labels)) {
            *n -= 1;
        }
        if let Some(k) = &info.watch_kind
            && let Some(n) = lock(&self.watchers).get_mut(k)
        {
            *n -= 1;
        }
    }

    /// Records one storage operation (`operation` as upstream's etcd3 store names it, `type`
    /// the group-resource).
    pub(crate) fn storage(&self, operation: &'static str, kind: String, started: Instant) {
        lock(&self.storage)
            .entry((operation, kind))
            .or_default()
            .observe(started.elapsed().as_secs_f64());
    }

    /// The exposition: every metric, with the stored object counts (per group-resource) and
    /// the database size the caller read from the store.
    pub(crate) fn render(&self, objects: &[(String, i64)], size_bytes: Option<u64>) -> String {
        let mut out = String::new();
        header(
            &mut out,
            "apiserver_request_total",
            "counter",
            "[STABLE] Counter of apiserver requests broken out for each verb, dry run value, group, version, resource, scope, component, and HTTP response code.",
        );
        for ((labels, code), n) in lock(&self.requests).iter() {
            let mut pairs = labels.pairs().to_vec();
            let code = code.to_string();
            pairs.insert(0, ("code", &code));
            sample(&mut out, "apiserver_request_total", &pairs, *n as f64);
        }
        header(
            &mut out,
            "apiserver_request_duration_seconds",
            "histogram",
            "[STABLE] Response latency distribution in seconds for each verb, dry run value, group, version, resource, subresource, scope and component.",
        );
        for (labels, h) in lock(&self.durations).iter() {
            histogram(
                &mut out,
                "apiserver_request_duration_seconds",
                &labels.pairs(),
                h,
            );
        }
        header(
            &mut out,
            "apiserver_longrunning_requests",
            "gauge",
            "[STABLE] Gauge of all active long-running apiserver requests broken out by verb, group, version, resource, scope and component. Not all requests are tracked this way.",
        );
        for (labels, n) in lock(&self.longrunning).iter() {
            let pairs: Vec<_> = labels
                .pairs()
                .into_iter()
                .filter(|(k, _)| *k != "dry_run")
                .collect();
            sample(
                &mut out,
                "apiserver_longrunning_requests",
                &pairs,
                *n as f64,
            );
        }
        header(
            &mut out,
            "apiserver_registered_watchers",
            "gauge",
            "[ALPHA] Number of currently registered watchers for a given resources",
        );
        for ((g, v, k), n) in lock(&self.watchers).iter() {
            let pairs = [("group", g.as_str()), ("kind", k), ("version", v)];
            sample(&mut out, "apiserver_registered_watchers", &pairs, *n as f64);
        }
        header(
            &mut out,
            "apiserver_current_inflight_requests",
            "gauge",
            "[STABLE] Maximal number of currently used inflight request limit of this apiserver per request kind in last second.",
        );
        let peak = {
            let f = lock(&self.inflight);
            let fresh = f.since.is_some_and(|t| t.elapsed() <= PEAK_WINDOW);
            if fresh {
                [f.peak[0].max(f.now[0]), f.peak[1].max(f.now[1])]
            } else {
                f.now
            }
        };
        for (kind, n) in [("mutating", peak[1]), ("readOnly", peak[0])] {
            let pairs = [("request_kind", kind)];
            sample(
                &mut out,
                "apiserver_current_inflight_requests",
                &pairs,
                n as f64,
            );
        }
        header(
            &mut out,
            "etcd_request_duration_seconds",
            "histogram",
            "[ALPHA] Etcd request latency in seconds for each operation and object type.",
        );
        for ((op, kind), h) in lock(&self.storage).iter() {
            let pairs = [("operation", *op), ("type", kind.as_str())];
            histogram(&mut out, "etcd_request_duration_seconds", &pairs, h);
        }
        header(
            &mut out,
            "apiserver_storage_objects",
            "gauge",
            "[STABLE] Number of stored objects at the time of last check split by kind. In case of a fetching error, the value will be -1.",
        );
        for (resource, n) in objects {
            let pairs = [("resource", resource.as_str())];
            sample(&mut out, "apiserver_storage_objects", &pairs, *n as f64);
        }
        if let Some(size) = size_bytes {
            header(
                &mut out,
                "apiserver_storage_size_bytes",
                "gauge",
                "[STABLE] Size of the storage database file physically allocated in bytes.",
            );
            let pairs = [("storage_cluster_id", "redb-0")];
            sample(
                &mut out,
                "apiserver_storage_size_bytes",
                &pairs,
                size as f64,
            );
        }
        out
    }
}

fn long_running_labels(l: &RequestLabels) -> RequestLabels {
    RequestLabels {
        dry_run: String::new(),
        ..l.clone()
    }
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// A label value escaped as the text format requires (backslash, quote, newline).
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn sample(out: &mut String, name: &str, labels: &[(&str, &str)], value: f64) {
    let labels: Vec<String> = labels
        .iter()
        .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
        .collect();
    let _ = writeln!(out, "{name}{{{}}} {}", labels.join(","), number(value));
}

fn number(v: f64) -> String {
    if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else {
        format!("{v}")
    }
}

fn histogram(out: &mut String, name: &str, labels: &[(&str, &str)], h: &Histogram) {
    let mut cumulative = 0u64;
    for (i, bound) in BUCKETS
        .iter()
        .map(|b| number(*b))
        .chain(["+Inf".to_string()])
        .enumerate()
    {
        cumulative += h.counts.get(i).copied().unwrap_or(0);
        let mut pairs = labels.to_vec();
        pairs.push(("le", &bound));
        sample(out, &format!("{name}_bucket"), &pairs, cumulative as f64);
    }
    sample(out, &format!("{name}_sum"), labels, h.sum);
    sample(out, &format!("{name}_count"), labels, h.count as f64);
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn histograms_are_cumulative_with_upstream_buckets() {
        let mut h = Histogram::default();
        for s in [0.001, 0.03, 0.03, 100.0] {
            h.observe(s);
        }
        let mut out = String::new();
        histogram(&mut out, "x", &[("a", "b\"c")], &h);
        assert!(
            out.contains("x_bucket{a=\"b\\\"c\",le=\"0.005\"} 1\n"),
            "{out}"
        );
        assert!(
            out.contains("x_bucket{a=\"b\\\"c\",le=\"0.05\"} 3\n"),
            "{out}"
        );
        assert!(
            out.contains("x_bucket{a=\"b\\\"c\",le=\"60\"} 3\n"),
            "{out}"
        );
        assert!(
            out.contains("x_bucket{a=\"b\\\"c\",le=\"+Inf\"} 4\n"),
            "{out}"
        );
        assert!(out.contains("x_count{a=\"b\\\"c\"} 4\n"), "{out}");
        assert_eq!(out.lines().count(), BUCKETS.len() + 3);
    }

    #[test]
    fn verbs_scopes_and_dry_run_as_upstream_labels_them() {
        let info = |m: &str, uri: &str, ct: &str| {
            let method: Method = m.parse().unwrap();
            let uri: axum::http::Uri = uri.parse().unwrap();
            let parsed = crate::request::parse(&method, &uri).ok();
            RequestInfo::of(&method, &uri, ct, parsed.as_ref())
        };
        let l = info("GET", "/api/v1/namespaces/a/pods", "").labels;
        assert_eq!((l.verb.as_str(), l.scope.as_str()), ("LIST", "namespace"));
        let i = info("GET", "/api/v1/pods?watch=true", "");
        assert_eq!(
            (i.labels.verb.as_str(), i.labels.scope.as_str()),
            ("WATCH", "cluster")
        );
        assert!(i.long_running && i.watch_kind.is_some());
        let l = info("GET", "/api/v1/nodes/n1", "").labels;
        assert_eq!((l.verb.as_str(), l.scope.as_str()), ("GET", "resource"));
        let l = info(
            "PATCH",
            "/apis/apps/v1/namespaces/a/deployments/d/scale?dryRun=All",
            "application/apply-patch+yaml",
        )
        .labels;
        assert_eq!(
            (
                l.verb.as_str(),
                l.group.as_str(),
                l.subresource.as_str(),
                l.dry_run.as_str()
            ),
            ("APPLY", "apps", "scale", "All")
        );
        let l = info("POST", "/api/v1/namespaces/a/configmaps?dryRun=true", "").labels;
        assert_eq!((l.verb.as_str(), l.dry_run.as_str()), ("POST", "invalid"));
        let l = info("GET", "/openapi/v3/apis/apps/v1", "").labels;
        assert_eq!(
            (l.resource.as_str(), l.subresource.as_str()),
            ("", "/openapi/v3/apis/apps/v1")
        );
        let l = info("GET", "/nothing/here", "").labels;
        assert_eq!((l.verb.as_str(), l.subresource.as_str()), ("GET", ""));
    }
}
