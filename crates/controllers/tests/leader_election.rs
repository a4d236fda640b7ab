//! Leader election against the real svcnet API server (in-process, on a free port, its data
//! in a temporary directory): the server's resourceVersion check on Lease updates that the
//! elector relies on, a race that only one candidate wins, and a takeover after the leader
//! stops renewing, with the Lease watched through the API to check that the two never lead
//! at once.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use kube::api::{Api, ObjectMeta, PostParams};
use kube::runtime::watcher;
use svcnet_controllers::leader::{
    Attempt, ElectionConfig, Ended, KubeLeaseLock, LeaderElector, LeaseError, LeaseLock,
};

mod common;

const NS: &str = "kube-system";

async fn start() -> Result<common::TestServer> {
    common::start_server().await
}

/// A lock that can be cut off from the API server (every call fails, as in a partition),
/// and that can wait at a barrier after its next read (to line two candidates' writes up).
struct TestLock {
    inner: KubeLeaseLock,
    cut: Arc<AtomicBool>,
    after_read: Option<Arc<tokio::sync::Barrier>>,
}

impl TestLock {
    fn new(client: &kube::Client, name: &str) -> Self {
        Self {
            inner: KubeLeaseLock::new(client.clone(), NS, name),
            cut: Arc::default(),
            after_read: None,
        }
    }

    fn check(&self) -> Result<(), LeaseError> {
        if self.cut.load(Ordering::SeqCst) {
            return Err(LeaseError::Api {
                lease: self.describe(),
                action: "get",
                source: kube::Error::Api(Box::new(kube::core::Status {
                    code: 503,
                    message: "cut off by the test".into(),
                    ..Default::default()
                })),
            });
        }
        Ok(())
    }
}

impl LeaseLock for TestLock {
    async fn get(&mut self) -> Result<Option<LeaseSpec>, LeaseError> {
        self.check()?;
        let read = self.inner.get().await;
        if let Some(barrier) = self.after_read.take() {
            barrier.wait().await;
        }
        read
    }

    async fn create(&mut self, spec: LeaseSpec) -> Result<(), LeaseError> {
        self.check()?;
        self.inner.create(spec).await
    }

    async fn update(&mut self, spec: LeaseSpec) -> Result<(), LeaseError> {
        self.check()?;
        self.inner.update(spec).await
    }

    fn describe(&self) -> String {
        self.inner.describe()
    }
}

fn short(identity: &str) -> ElectionConfig {
    ElectionConfig {
        lease_duration: Duration::from_secs(3),
        renew_deadline: Duration::from_secs(2),
        retry_period: Duration::from_millis(500),
        ..ElectionConfig::new(identity)
    }
}

fn lease(name: &str, spec: LeaseSpec) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(NS.into()),
            ..ObjectMeta::default()
        },
        spec: Some(spec),
    }
}

#[tokio::test]
async fn a_stale_lease_update_gets_409() -> Result<()> {
    let s = start().await?;
    let api: Api<Lease> = Api::namespaced(s.client.clone(), NS);
    let spec = LeaseSpec {
        holder_identity: Some("a".into()),
        lease_duration_seconds: Some(15),
        ..LeaseSpec::default()
    };
    api.create(&PostParams::default(), &lease("le-stale", spec))
        .await?;
    let read = api.get("le-stale").await?;
    let mut first = read.clone();
    first.spec.get_or_insert_default().holder_identity = Some("b".into());
    api.replace("le-stale", &PostParams::default(), &first)
        .await?;
    let mut stale = read;
    stale.spec.get_or_insert_default().holder_identity = Some("c".into());
    match api
        .replace("le-stale", &PostParams::default(), &stale)
        .await
    {
        Err(kube::Error::Api(status)) if status.code == 409 => {}
        other => bail!("a PUT with a stale resourceVersion must get 409, got {other:?}"),
    }
    let now = api.get("le-stale").await?;
    assert_eq!(
        now.spec.and_then(|s| s.holder_identity).as_deref(),
        Some("b")
    );
    s.server.shutdown().await?;
    Ok(())
}

#[tokio::test]
async fn of_two_candidates_writing_the_same_read_only_one_wins() -> Result<()> {
    let s = start().await?;
    let api: Api<Lease> = Api::namespaced(s.client.clone(), NS);
    // A released lease (no holder): both candidates may take it at once.
    let released = LeaseSpec {
        holder_identity: Some(String::new()),
        lease_duration_seconds: Some(1),
        lease_transitions: Some(3),
        ..LeaseSpec::default()
    };
    api.create(&PostParams::default(), &lease("le-race", released))
        .await?;
    let barrier = Arc::new(tokio::sync::Barrier::new(2));
    let mut electors = Vec::new();
    for who in ["le-a", "le-b"] {
        let mut lock = TestLock::new(&s.client, "le-race");
        lock.after_read = Some(Arc::clone(&barrier));
        electors.push(LeaderElector::new(short(who), lock)?);
    }
    let mut b = electors.pop().context("b")?;
    let mut a = electors.pop().context("a")?;
    // Both read the same resourceVersion before either writes.
    let (ra, rb) = tokio::join!(a.try_acquire_or_renew(), b.try_acquire_or_renew());
    let won: Vec<bool> = [&ra, &rb]
        .iter()
        .map(|r| matches!(r, Attempt::Leading))
        .collect();
    assert_eq!(won.iter().filter(|w| **w).count(), 1, "{ra:?} / {rb:?}");
    let loser = if won[0] { &rb } else { &ra };
    assert!(
        matches!(loser, Attempt::Failed(e) if e.is_conflict()),
        "the loser's write conflicts: {loser:?}"
    );
    let now = api.get("le-race").await?.spec.context("spec")?;
    let winner = if won[0] { "le-a" } else { "le-b" };
    assert_eq!(now.holder_identity.as_deref(), Some(winner));
    assert_eq!(now.lease_transitions, Some(4));
    s.server.shutdown().await?;
    Ok(())
}

/// When each candidate started and stopped leading, by the test's clock.
#[derive(Default)]
struct Terms(Mutex<Vec<(String, Instant, Option<Instant>)>>);

impl Terms {
    fn start(self: &Arc<Self>, who: &str) -> TermGuard {
        let mut t = self.0.lock().unwrap_or_else(|e| e.into_inner());
        t.push((who.into(), Instant::now(), None));
        TermGuard {
            terms: Arc::clone(self),
            index: t.len() - 1,
        }
    }

    fn all(&self) -> Vec<(String, Instant, Option<Instant>)> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// Marks the end of a term when the leading work is dropped or returns.
struct TermGuard {
    terms: Arc<Terms>,
    index: usize,
}

impl Drop for TermGuard {
    fn drop(&mut self) {
        let mut t = self.terms.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(term) = t.get_mut(self.index) {
            term.2 = Some(Instant::now());
        }
    }
}

fn candidate(
    client: &kube::Client,
    who: &'static str,
    terms: &Arc<Terms>,
) -> Result<(Arc<AtomicBool>, tokio::task::JoinHandle<Ended<()>>)> {
    let lock = TestLock::new(client, "le-takeover");
    let cut = Arc::clone(&lock.cut);
    let elector = LeaderElector::new(short(who), lock)?;
    let terms = Arc::clone(terms);
    let task = tokio::spawn(elector.run(std::future::pending(), move |stop| async move {
        let _term = terms.start(who);
        stop.await;
    }));
    Ok((cut, task))
}

#[tokio::test]
async fn a_standby_takes_over_after_the_lease_duration_and_never_leads_with_the_leader()
-> Result<()> {
    let s = start().await?;
    let api: Api<Lease> = Api::namespaced(s.client.clone(), NS);
    // Every version of the Lease as the API shows it, with when the watch saw it.
    let seen = Arc::new(Mutex::new(Vec::<(Instant, String, Option<String>)>::new()));
    let watch = {
        let seen = Arc::clone(&seen);
        let cfg = watcher::Config::default().fields("metadata.name=le-takeover");
        let stream = watcher(api.clone(), cfg);
        tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(ev) = stream.next().await {
                if let Ok(watcher::Event::Apply(l) | watcher::Event::InitApply(l)) = ev {
                    let holder = l.spec.as_ref().and_then(|s| s.holder_identity.clone());
                    let rv = l.metadata.resource_version.clone();
                    seen.lock().unwrap_or_else(|e| e.into_inner()).push((
                        Instant::now(),
                        holder.unwrap_or_default(),
                        rv,
                    ));
                }
            }
        })
    };
    let terms = Arc::new(Terms::default());
    let (cut_a, task_a) = candidate(&s.client, "le-a", &terms)?;
    wait_until("le-a leads", || !terms.all().is_empty()).await?;
    let (_cut_b, task_b) = candidate(&s.client, "le-b", &terms)?;
    // The standby stays one while the leader renews.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(terms.all().len(), 1, "only le-a leads: {:?}", names(&terms));
    let cut_at = Instant::now();
    cut_a.store(true, Ordering::SeqCst);
    let ended_a = tokio::time::timeout(Duration::from_secs(10), task_a).await??;
    let a_stopped = Instant::now();
    assert!(matches!(ended_a, Ended::LostLease), "{ended_a:?}");
    wait_until("le-b leads", || terms.all().len() == 2).await?;
    let terms_now = terms.all();
    let (a_name, _, a_end) = &terms_now[0];
    let (b_name, b_start, b_end) = &terms_now[1];
    assert_eq!((a_name.as_str(), b_name.as_str()), ("le-a", "le-b"));
    assert!(b_end.is_none(), "le-b still leads");
    let a_end = a_end.context("le-a's term ended")?;
    assert!(
        a_end < *b_start,
        "never two leaders: le-a stopped before le-b started"
    );
    // Through the API: the holder changed once, from le-a to le-b, and le-b's first version
    // came at least the lease duration after le-a's last one.
    tokio::time::sleep(Duration::from_millis(300)).await;
    watch.abort();
    let seen = seen.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let holders: Vec<&str> = seen.iter().map(|(_, h, _)| h.as_str()).collect();
    let first_b = holders
        .iter()
        .position(|h| *h == "le-b")
        .context("le-b seen through the API")?;
    assert!(
        holders[..first_b].iter().all(|h| *h == "le-a"),
        "{holders:?}"
    );
    assert!(
        holders[first_b..].iter().all(|h| *h == "le-b"),
        "{holders:?}"
    );
    let last_a = seen[first_b - 1].0;
    let takeover = seen[first_b].0;
    let gap = takeover - last_a;
    let lost_after = a_stopped - cut_at;
    eprintln!(
        "le-a cut off; it stopped leading {lost_after:?} later (renew deadline 2 s); le-b's \
         first write came {gap:?} after le-a's last renewal (lease 3 s, retry 0.5 s); \
         le-a stopped {:?} before le-b started",
        *b_start - a_end
    );
    assert!(
        a_end < takeover,
        "le-a stopped before le-b's write reached the API"
    );
    // The last renewal was at most a retry period before the cut; the deadline is 2 s after
    // the retry period that follows it; one second of slack for a loaded machine.
    assert!(
        lost_after <= Duration::from_millis(2_500) + Duration::from_secs(1),
        "{lost_after:?}"
    );
    assert!(
        gap >= Duration::from_secs(3) - Duration::from_millis(100),
        "{gap:?}"
    );
    // le-b sees le-a's last renewal at most one jittered retry (0.5 s × 2.2) after it was
    // written, and takes over at its first try at least 3 s after that: at most another.
    let retry_max = Duration::from_millis(1_100);
    // One second of slack for a loaded machine.
    let bound = Duration::from_secs(3) + 2 * retry_max + Duration::from_secs(1);
    assert!(gap <= bound, "{gap:?} > {bound:?}");
    task_b.abort();
    s.server.shutdown().await?;
    Ok(())
}

fn names(terms: &Terms) -> Vec<String> {
    terms.all().into_iter().map(|(n, _, _)| n).collect()
}

async fn wait_until(what: &str, mut done: impl FnMut() -> bool) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done() {
        if Instant::now() > deadline {
            bail!("timed out waiting until {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}
