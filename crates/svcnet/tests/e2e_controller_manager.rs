//! `svcnet controller-manager` with leader election, end to end and without root: `svcnet up
//! --disable proxy,dns,agent,controllers` is the API server only, and separate
//! controller-manager processes with short lease flags (3 s lease, 2 s renew deadline, 0.5 s
//! retry) compete for the Lease `kube-system/svcnet-controller-manager`. Pods get their
//! status by hand (no agent), as the other tests without an agent do.
//!
//! Killing the leader (SIGKILL) moves the Lease to the standby after the lease duration, and
//! the new leader's controllers follow pod changes. Stopping a leader (SIGSTOP) past its
//! lease lets another take over; when it wakes it writes nothing and exits with status 1.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{Up, wait_for};
use k8s_openapi::jiff::Timestamp;

const LEASE: &str = "svcnet-controller-manager";
/// The flags' lease duration and the longest jittered retry (0.5 s × (1 + 1.2)).
const LEASE_DURATION: Duration = Duration::from_secs(3);
const RETRY_MAX: Duration = Duration::from_millis(1_100);

/// A controller-manager process, its log in a file.
struct Cm {
    name: &'static str,
    child: Child,
    log: PathBuf,
}

/// Every controller-manager of the test, killed (SIGKILL) and reaped on drop, also when the
/// test fails.
struct Cms(Vec<Cm>);

impl Drop for Cms {
    fn drop(&mut self) {
        for cm in &mut self.0 {
            let _ = cm.child.kill();
            let _ = cm.child.wait();
        }
    }
}

impl Cms {
    fn spawn(&mut self, up: &Up, dir: &Path, name: &'static str) {
        let log = dir.join(format!("{name}.log"));
        let child = Command::new(env!("CARGO_BIN_EXE_svcnet"))
            .arg("controller-manager")
            .arg("--kubeconfig")
            .arg(up.kubeconfig())
            .args(["--leader-elect-lease-duration", "3s"])
            .args(["--leader-elect-renew-deadline", "2s"])
            .args(["--leader-elect-retry-period", "0.5s"])
            .env("SVCNET_LOG", "info")
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        self.0.push(Cm { name, child, log });
    }

    fn get(&mut self, name: &str) -> &mut Cm {
        self.0.iter_mut().find(|c| c.name == name).unwrap()
    }

    /// The process whose identity holds the lease.
    fn named_by(&self, identity: &str) -> &'static str {
        self.0
            .iter()
            .find(|c| c.identity().as_deref() == Some(identity))
            .map(|c| c.name)
            .unwrap_or_else(|| panic!("no controller-manager has identity {identity}"))
    }
}

impl Cm {
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Its candidate identity, from its start-up log line.
    fn identity(&self) -> Option<String> {
        let log = self.log();
        let line = log
            .lines()
            .find(|l| l.contains("candidate for the controller-manager lease"))?;
        let rest = &line[line.find("identity=")? + "identity=".len()..];
        Some(rest.split_whitespace().next()?.to_string())
    }

    fn signal(&self, sig: &str) {
        let status = Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill {sig} {}", self.name);
    }
}

/// The Lease as the API shows it.
#[derive(Debug, Clone, PartialEq)]
struct LeaseNow {
    holder: String,
    renew: Timestamp,
    acquire: Timestamp,
    transitions: i64,
}

fn lease(up: &Up) -> Option<LeaseNow> {
    let out = up.kubectl(&[
        "get",
        "lease",
        "-n",
        "kube-system",
        LEASE,
        "-o",
        "jsonpath={.spec.holderIdentity}|{.spec.renewTime}|{.spec.acquireTime}|{.spec.leaseTransitions}",
    ]);
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let f: Vec<&str> = text.trim().split('|').collect();
    Some(LeaseNow {
        holder: f.first()?.to_string(),
        renew: f.get(1)?.parse().ok()?,
        acquire: f.get(2)?.parse().ok()?,
        transitions: f.get(3)?.parse().ok()?,
    })
}

/// Waits (polling every 50 ms, at most `within`) for a lease held by someone `ok` accepts.
fn wait_holder(up: &Up, within: Duration, ok: impl Fn(&str) -> bool) -> LeaseNow {
    let deadline = Instant::now() + within;
    loop {
        if let Some(l) = lease(up)
            && ok(&l.holder)
        {
            return l;
        }
        assert!(
            Instant::now() < deadline,
            "the lease did not move within {within:?}: {:?}",
            lease(up)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn apply(up: &Up, dir: &Path, name: &str, manifest: serde_json::Value) {
    let path = dir.join(format!("{name}.json"));
    std::fs::write(&path, manifest.to_string()).unwrap();
    up.ok(&["apply", "-f", path.to_str().unwrap()]);
}

/// A pod on the node, then its status set as a kubelet would: Running, Ready, with `ip`.
fn ready_pod(up: &Up, dir: &Path, name: &str, ip: &str) {
    apply(
        up,
        dir,
        name,
        serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"app": "le-web"}},
            "spec": {"nodeName": "le-node", "containers": [{"name": "c", "image": "busybox",
                     "ports": [{"containerPort": 8080}]}]}
        }),
    );
    let status = serde_json::json!({"status": {
        "phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
        "conditions": [{"type": "Ready", "status": "True"}]
    }});
    up.ok(&[
        "patch",
        "pod",
        name,
        "--subresource=status",
        "--type=merge",
        "-p",
        &status.to_string(),
    ]);
}

/// Waits until the service's EndpointSlices list exactly these ready addresses.
fn wait_slice(up: &Up, want: &[&str]) -> Duration {
    let start = Instant::now();
    let want = want.join(" ");
    wait_for(&format!("the EndpointSlice to list {want}"), || {
        let out = up.ok(&[
            "get",
            "endpointslices",
            "-l",
            "kubernetes.io/service-name=le-web",
            "-o",
            "jsonpath={range .items[*].endpoints[*]}{.addresses[0]}={.conditions.ready} {end}",
        ]);
        let mut got: Vec<&str> = out
            .split_whitespace()
            .filter_map(|e| e.strip_suffix("=true"))
            .collect();
        got.sort_unstable();
        (got.join(" ") == want).then_some(out)
    });
    start.elapsed()
}

fn secs(d: k8s_openapi::jiff::SignedDuration) -> Duration {
    Duration::try_from(d).unwrap_or(Duration::ZERO)
}

#[test]
fn the_lease_moves_when_the_leader_dies_and_the_controllers_follow() {
    let up = Up::start(&[
        "--disable",
        "proxy,dns,agent,controllers",
        "--node-name",
        "le-node",
    ]);
    let dir = tempfile::tempdir().unwrap();
    let mut cms = Cms(Vec::new());
    cms.spawn(&up, dir.path(), "cm-a");
    cms.spawn(&up, dir.path(), "cm-b");
    wait_for("both candidates' identities", || {
        (cms.get("cm-a").identity().is_some() && cms.get("cm-b").identity().is_some())
            .then(String::new)
    });
    let first = wait_holder(&up, Duration::from_secs(20), |h| !h.is_empty());
    let leader = cms.named_by(&first.holder);
    let standby = if leader == "cm-a" { "cm-b" } else { "cm-a" };
    let standby_id = cms.get(standby).identity().unwrap();
    eprintln!("{leader} leads ({}); {standby} waits", first.holder);

    apply(
        &up,
        dir.path(),
        "le-web",
        serde_json::json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "le-web"},
            "spec": {"selector": {"app": "le-web"}, "ports": [{"port": 80, "targetPort": 8080}]}
        }),
    );
    ready_pod(&up, dir.path(), "le-web-1", "10.244.0.11");
    ready_pod(&up, dir.path(), "le-web-2", "10.244.0.12");
    wait_slice(&up, &["10.244.0.11", "10.244.0.12"]);
    // The standby stays one while the leader renews.
    std::thread::sleep(Duration::from_secs(2));
    let before = lease(&up).unwrap();
    assert_eq!(before.holder, first.holder, "the leader kept the lease");
    assert!(before.renew > first.renew, "the leader renews");

    // SIGKILL the leader: the standby takes over after the lease duration.
    let killed_at = Timestamp::now();
    let killed = Instant::now();
    cms.get(leader).child.kill().unwrap();
    cms.get(leader).child.wait().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let last = lease(&up).unwrap();
    assert_eq!(last.holder, first.holder);
    let taken = wait_holder(&up, Duration::from_secs(15), |h| h == standby_id);
    let seen_after = killed.elapsed();
    let after_kill = secs(taken.acquire.duration_since(killed_at));
    let after_last_renewal = secs(taken.acquire.duration_since(last.renew));
    eprintln!(
        "takeover: {standby} acquired the lease {after_kill:?} after the SIGKILL and \
         {after_last_renewal:?} after the last renewal (lease 3 s, retry 0.5 s; seen through \
         kubectl {seen_after:?} after the kill)"
    );
    assert_eq!(taken.transitions, last.transitions + 1);
    // Never before the lease duration from the last renewal (by the standby's own clock)...
    assert!(
        after_last_renewal >= LEASE_DURATION - Duration::from_millis(50),
        "{after_last_renewal:?}"
    );
    // ... and at most a jittered retry after the standby saw that renewal plus one more
    // until its first try past the duration, with 1 s for a loaded machine.
    let bound = LEASE_DURATION + 2 * RETRY_MAX + Duration::from_secs(1);
    assert!(after_kill <= bound, "{after_kill:?} > {bound:?}");

    // The new leader's controllers follow pod changes.
    ready_pod(&up, dir.path(), "le-web-3", "10.244.0.13");
    let followed = wait_slice(&up, &["10.244.0.11", "10.244.0.12", "10.244.0.13"]);
    eprintln!("a new ready pod was in the EndpointSlice {followed:?} after its status patch");

    // A third candidate; then the leader is stopped (SIGSTOP) past its lease.
    cms.spawn(&up, dir.path(), "cm-c");
    wait_for("cm-c's identity", || {
        cms.get("cm-c").identity().map(|_| String::new())
    });
    let third_id = cms.get("cm-c").identity().unwrap();
    std::thread::sleep(Duration::from_secs(1));
    cms.get(standby).signal("-STOP");
    let stopped = Instant::now();
    let third = wait_holder(&up, Duration::from_secs(15), |h| h == third_id);
    eprintln!(
        "cm-c took the lease {:?} after {standby} was stopped",
        stopped.elapsed()
    );
    assert_eq!(third.transitions, taken.transitions + 1);
    cms.get(standby).signal("-CONT");
    let woke = Instant::now();
    let status = loop {
        if let Some(status) = cms.get(standby).child.try_wait().unwrap() {
            break status;
        }
        assert!(
            woke.elapsed() < Duration::from_secs(10),
            "{standby} did not exit after losing the lease"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    eprintln!(
        "{standby} exited {:?} after waking: {status}",
        woke.elapsed()
    );
    assert_eq!(
        status.code(),
        Some(1),
        "losing the lease exits with status 1"
    );
    let log = cms.get(standby).log();
    assert!(
        log.contains("leader election lost: the controllers stopped; exiting"),
        "{log}"
    );
    // It wrote nothing on waking: cm-c still holds the lease, no transition since.
    let now = lease(&up).unwrap();
    assert_eq!(
        (now.holder.as_str(), now.transitions),
        (third_id.as_str(), third.transitions)
    );

    // cm-c's controllers act.
    up.ok(&["delete", "pod", "le-web-1", "--wait=false"]);
    wait_slice(&up, &["10.244.0.12", "10.244.0.13"]);

    // SIGTERM: cm-c stops its controllers, releases the lease and exits 0; a standby takes
    // it at its next try instead of after the lease duration.
    cms.spawn(&up, dir.path(), "cm-d");
    wait_for("cm-d's identity", || {
        cms.get("cm-d").identity().map(|_| String::new())
    });
    let fourth_id = cms.get("cm-d").identity().unwrap();
    std::thread::sleep(Duration::from_secs(1));
    cms.get("cm-c").signal("-TERM");
    let termed = Instant::now();
    let status = loop {
        if let Some(status) = cms.get("cm-c").child.try_wait().unwrap() {
            break status;
        }
        assert!(
            termed.elapsed() < Duration::from_secs(10),
            "cm-c did not stop on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "cm-c exited {status} on SIGTERM");
    let fourth = wait_holder(&up, Duration::from_secs(10), |h| h == fourth_id);
    let handed = termed.elapsed();
    eprintln!("after SIGTERM to cm-c, cm-d held the lease {handed:?} later");
    assert!(
        handed < RETRY_MAX + Duration::from_secs(1),
        "{handed:?}: released, not expired"
    );
    assert_eq!(fourth.transitions, third.transitions + 1);
}
