//! Deletion as upstream's generic registry does it: preconditions, finalizers, and graceful
//! deletion of pods.
//!
//! A pod bound to a node and not terminal is not removed by a DELETE: it gets
//! `metadata.deletionTimestamp` = now + grace and `metadata.deletionGracePeriodSeconds` = grace
//! (grace = `DeleteOptions.gracePeriodSeconds`, else `spec.terminationGracePeriodSeconds`,
//! else 30) and stays until the node agent, having stopped it, confirms with a DELETE of grace
//! 0 (`pkg/registry/core/pod/strategy.go` `CheckGracefulDelete`). A second DELETE may shorten
//! the grace period but never extend it (`staging/.../registry/rest/delete.go`
//! `BeforeDelete`). Objects with finalizers are marked (grace 0) and kept until the last
//! finalizer goes. [`plan`] is the pure decision; [`delete_one`] applies it atomically.

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::apimachinery::pkg::apis::meta::v1 as meta;
use serde_json::{Value, json};
use svcnet_store::{Mutation, Outcome};

use crate::objects::{finalizers, is_terminating, meta_str};
use crate::registry::ResourceInfo;
use crate::request::ResourceRequest;
use crate::state::SharedState;
use crate::status::ApiError;

/// `DeleteOptions` fields the server honours (from the body and the query).
#[derive(Debug, Default, Clone)]
pub(crate) struct DeleteOptions {
    pub uid: Option<String>,
    pub resource_version: Option<String>,
    pub grace_period_seconds: Option<i64>,
    pub propagation: Option<String>,
    pub dry_run: bool,
}

/// Reads `DeleteOptions` from a DELETE body (which may be empty) and the query parameters;
/// the body wins where both give a value. The body is decoded through its typed schema, so a
/// field of the wrong type (`{"preconditions":{"uid":123}}`) is a 400 and nothing is deleted;
/// options upstream refuses (an unknown `propagationPolicy`, both it and `orphanDependents`,
/// a `dryRun` other than `All`) are a 422 on `DeleteOptions`.
pub(crate) fn delete_options(
    req: &ResourceRequest,
    body: &[u8],
) -> Result<DeleteOptions, ApiError> {
    let mut opts = DeleteOptions {
        propagation: req.query.propagation_policy.clone(),
        grace_period_seconds: req.query.grace_period_seconds,
        dry_run: req.query.dry_run,
        ..Default::default()
    };
    let mut orphan_dependents = None;
    if !body.iter().all(u8::is_ascii_whitespace) {
        let typed: meta::DeleteOptions = serde_json::from_slice(body).map_err(|e| {
            ApiError::BadRequest(format!(
                "DeleteOptions in version \"v1\" cannot be handled as a DeleteOptions: {e}"
            ))
        })?;
        if let Some(p) = typed.preconditions {
            opts.uid = p.uid;
            opts.resource_version = p.resource_version;
        }
        if let Some(g) = typed.grace_period_seconds {
            opts.grace_period_seconds = Some(g);
        }
        if let Some(p) = typed.propagation_policy {
            opts.propagation = Some(p);
        }
        orphan_dependents = typed.orphan_dependents;
        if let Some(values) = typed.dry_run {
            crate::request::validate_dry_run("DeleteOptions", &values)?;
            if !values.is_empty() {
                opts.dry_run = true;
            }
        }
    }
    if let Some(p) = &opts.propagation
        && !matches!(p.as_str(), "Foreground" | "Background" | "Orphan")
    {
        return Err(invalid_propagation(format!(
            "Unsupported value: {p:?}: supported values: \"Foreground\", \"Background\", \"Orphan\", \"nil\""
        )));
    }
    if let Some(orphan) = orphan_dependents {
        if opts.propagation.is_some() {
            return Err(invalid_propagation(format!(
                "Invalid value: {:?}: orphanDependents and deletionPropagation cannot be both set",
                opts.propagation.as_deref().unwrap_or("")
            )));
        }
        if orphan {
            opts.propagation = Some("Orphan".into());
        }
    }
    Ok(opts)
}

/// A 422 on `DeleteOptions.propagationPolicy`, as upstream's `ValidateDeleteOptions` gives it.
fn invalid_propagation(message: String) -> ApiError {
    crate::request::options_invalid("DeleteOptions", "propagationPolicy", message)
}

const PROTECTED_NAMESPACES: &[&str] = &["default", "kube-system", "kube-public"];

/// Pods are the one kind deleted gracefully.
fn is_pod(res: &ResourceInfo) -> bool {
    res.group.is_empty() && res.kind == "Pod"
}

fn format_ts(t: Timestamp) -> String {
    t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

fn grace_of(obj: &Value) -> Option<i64> {
    obj.pointer("/metadata/deletionGracePeriodSeconds")
        .and_then(Value::as_i64)
}

/// The grace period a first DELETE gives a pod (`CheckGracefulDelete`).
fn pod_grace(pod: &Value, requested: Option<i64>) -> i64 {
    let mut period = requested.unwrap_or_else(|| {
        pod.pointer("/spec/terminationGracePeriodSeconds")
            .and_then(Value::as_i64)
            .unwrap_or(30)
    });
    let bound = pod
        .pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .is_some_and(|n| !n.is_empty());
    let terminal = matches!(
        pod.pointer("/status/phase").and_then(Value::as_str),
        Some("Succeeded" | "Failed")
    );
    if !bound || terminal {
        period = 0;
    }
    if period < 0 { 1 } else { period }
}

/// Marks `cur` as deleting with the given grace, bumping its generation like upstream.
fn mark(cur: &Value, now: Timestamp, grace: i64) -> Value {
    let mut next = cur.clone();
    let at = now
        .saturating_add(SignedDuration::from_secs(grace))
        .unwrap_or(now);
    next["metadata"]["deletionTimestamp"] = json!(format_ts(at));
    next["metadata"]["deletionGracePeriodSeconds"] = json!(grace);
    if let Some(g) = cur.pointer("/metadata/generation").and_then(Value::as_i64)
        && g > 0
    {
        next["metadata"]["generation"] = json!(g + 1);
    }
    next
}

/// What one DELETE does to the stored object `cur`: the decision of upstream's
/// `BeforeDelete` + `updateForGracefulDeletionAndFinalizers`, as a store mutation.
pub(crate) fn plan(
    res: &ResourceInfo,
    cur: &Value,
    opts: &DeleteOptions,
    now: Timestamp,
) -> Result<Mutation, ApiError> {
    let name = meta_str(cur, "name").unwrap_or("");
    let precondition = |what: &str, want: &str, have: &str| ApiError::Conflict {
        resource: res.qualified(),
        name: name.to_string(),
        detail: format!(
            "Precondition failed: {what} in precondition: {want}, {what} in object meta: {have}"
        ),
    };
    if let Some(uid) = &opts.uid {
        let have = meta_str(cur, "uid").unwrap_or("");
        if uid != have {
            return Err(precondition("UID", uid, have));
        }
    }
    if let Some(rv) = &opts.resource_version {
        let have = meta_str(cur, "resourceVersion").unwrap_or("");
        if rv != have {
            return Err(precondition("ResourceVersion", rv, have));
        }
    }
    if res.kind == "Namespace" && res.group.is_empty() {
        if is_terminating(cur) {
            return Ok(Mutation::Keep);
        }
        let mut next = mark(cur, now, 0);
        next["status"] = json!({"phase": "Terminating"});
        return Ok(Mutation::Put(next));
    }
    let requested = opts.grace_period_seconds.map(|g| if g < 0 { 1 } else { g });
    let pending_finalizers = !finalizers(cur).is_empty();
    if is_terminating(cur) {
        let current = grace_of(cur).unwrap_or(0);
        if current > 0 && is_pod(res) {
            // Graceful deletion in progress: only a shorter grace period changes anything.
            let Some(shorter) = requested.filter(|g| *g < current) else {
                return Ok(Mutation::Keep);
            };
            let since = meta_str(cur, "deletionTimestamp")
                .and_then(|t| t.parse::<Timestamp>().ok())
                .map(|t| t.saturating_sub(SignedDuration::from_secs(current)))
                .transpose()
                .ok()
                .flatten()
                .unwrap_or(now);
            if shorter == 0 && !pending_finalizers {
                return Ok(Mutation::Delete);
            }
            let mut next = cur.clone();
            let at = since
                .saturating_add(SignedDuration::from_secs(shorter))
                .unwrap_or(now);
            next["metadata"]["deletionTimestamp"] = json!(format_ts(at));
            next["metadata"]["deletionGracePeriodSeconds"] = json!(shorter);
            return Ok(Mutation::Put(next));
        }
        // Marked with grace 0: waiting for finalizers, or left over from an interrupted delete.
        return Ok(if pending_finalizers {
            Mutation::Keep
        } else {
            Mutation::Delete
        });
    }
    let grace = if is_pod(res) {
        pod_grace(cur, requested)
    } else {
        0
    };
    if grace > 0 || pending_finalizers {
        return Ok(Mutation::Put(mark(cur, now, grace)));
    }
    Ok(Mutation::Delete)
}

/// Whether a DELETE of the stored `cur` would be refused, decided without writing: a
/// collection delete checks every object first and changes nothing when one would fail.
pub(crate) fn precheck(
    res: &ResourceInfo,
    cur: &Value,
    opts: &DeleteOptions,
) -> Result<(), ApiError> {
    protected(res, meta_str(cur, "name").unwrap_or(""))?;
    plan(res, cur, opts, Timestamp::now()).map(|_| ())
}

fn protected(res: &ResourceInfo, name: &str) -> Result<(), ApiError> {
    if res.kind == "Namespace" && res.group.is_empty() && PROTECTED_NAMESPACES.contains(&name) {
        return Err(ApiError::Forbidden(format!(
            "namespaces \"{name}\" is forbidden: this namespace may not be deleted"
        )));
    }
    Ok(())
}

/// Deletes one object: removes it, or marks it deleting while its grace period runs or
/// finalizers remain (see [`plan`]).
pub(crate) async fn delete_one(
    state: &SharedState,
    res: &'static ResourceInfo,
    namespace: Option<&str>,
    name: &str,
    opts: &DeleteOptions,
) -> Result<Outcome, ApiError> {
    protected(res, name)?;
    let n = name.to_string();
    let o = opts.clone();
    let outcome = state
        .write(res, &res.key(namespace, name), opts.dry_run, move |cur| {
            let cur = cur.ok_or_else(|| ApiError::not_found(res, &n))?;
            plan(res, cur, &o, Timestamp::now())
        })
        .await?;
    if !opts.dry_run {
        state.gc.notify_one();
    }
    Ok(outcome)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::lookup;

    fn pods() -> &'static ResourceInfo {
        lookup("", "v1", "pods").unwrap()
    }

    fn now() -> Timestamp {
        "2025-01-01T00:00:00Z".parse().unwrap()
    }

    fn grace(g: i64) -> DeleteOptions {
        DeleteOptions {
            grace_period_seconds: Some(g),
            ..Default::default()
        }
    }

    fn put(m: Mutation) -> Value {
        match m {
            Mutation::Put(v) => v,
            other => panic!("expected a write, got {other:?}"),
        }
    }

    fn deletion(v: &Value) -> (String, i64) {
        (
            v["metadata"]["deletionTimestamp"].as_str().unwrap().into(),
            v["metadata"]["deletionGracePeriodSeconds"]
                .as_i64()
                .unwrap(),
        )
    }

    fn pod(node: &str, phase: &str, tgps: Option<i64>) -> Value {
        let mut p = json!({"metadata": {"name": "p", "uid": "u1", "resourceVersion": "5", "generation": 1},
                           "spec": {"nodeName": node, "containers": [{"name": "c"}]},
                           "status": {"phase": phase}});
        if let Some(t) = tgps {
            p["spec"]["terminationGracePeriodSeconds"] = json!(t);
        }
        p
    }

    #[test]
    fn bound_running_pods_are_deleted_gracefully() {
        let d = DeleteOptions::default();
        let out = put(plan(pods(), &pod("n1", "Running", None), &d, now()).unwrap());
        assert_eq!(deletion(&out), ("2025-01-01T00:00:30Z".into(), 30));
        assert_eq!(out["metadata"]["generation"], 2);
        let out = put(plan(pods(), &pod("n1", "Running", Some(5)), &d, now()).unwrap());
        assert_eq!(deletion(&out), ("2025-01-01T00:00:05Z".into(), 5));
        let out = put(plan(pods(), &pod("n1", "Pending", Some(5)), &grace(12), now()).unwrap());
        assert_eq!(deletion(&out), ("2025-01-01T00:00:12Z".into(), 12));
        let out = put(plan(pods(), &pod("n1", "Running", None), &grace(-3), now()).unwrap());
        assert_eq!(deletion(&out).1, 1, "negative grace is one second");
    }

    #[test]
    fn unbound_terminal_and_forced_pods_go_at_once() {
        let d = DeleteOptions::default();
        for p in [
            pod("", "Running", Some(30)),
            pod("n1", "Succeeded", None),
            pod("n1", "Failed", None),
        ] {
            assert!(matches!(plan(pods(), &p, &d, now()), Ok(Mutation::Delete)));
        }
        assert!(matches!(
            plan(pods(), &pod("n1", "Running", None), &grace(0), now()),
            Ok(Mutation::Delete)
        ));
        let svc = lookup("", "v1", "services").unwrap();
        assert!(matches!(
            plan(svc, &json!({"metadata": {"name": "s"}}), &d, now()),
            Ok(Mutation::Delete)
        ));
    }

    #[test]
    fn a_second_delete_only_shortens_and_zero_confirms() {
        let marked = put(plan(pods(), &pod("n1", "Running", None), &grace(30), now()).unwrap());
        // Longer, equal or unspecified: nothing changes.
        for opts in [grace(60), grace(30), DeleteOptions::default()] {
            assert!(matches!(
                plan(pods(), &marked, &opts, now()),
                Ok(Mutation::Keep)
            ));
        }
        // Shorter: the deadline moves relative to when deletion started.
        let later: Timestamp = "2025-01-01T00:00:10Z".parse().unwrap();
        let shorter = put(plan(pods(), &marked, &grace(5), later).unwrap());
        assert_eq!(deletion(&shorter), ("2025-01-01T00:00:05Z".into(), 5));
        // The agent's confirmation, with its uid precondition.
        let confirm = DeleteOptions {
            uid: Some("u1".into()),
            ..grace(0)
        };
        assert!(matches!(
            plan(pods(), &shorter, &confirm, later),
            Ok(Mutation::Delete)
        ));
        let wrong = DeleteOptions {
            uid: Some("u0".into()),
            ..grace(0)
        };
        let err = plan(pods(), &shorter, &wrong, later).unwrap_err();
        assert_eq!(err.code(), 409);
        assert!(err.to_string().contains("UID in precondition: u0"), "{err}");
    }

    #[test]
    fn finalizers_hold_the_object_after_grace_zero() {
        let mut p = pod("n1", "Running", None);
        p["metadata"]["finalizers"] = json!(["example.com/hold"]);
        let marked = put(plan(pods(), &p, &DeleteOptions::default(), now()).unwrap());
        assert_eq!(deletion(&marked).1, 30);
        let zero = put(plan(pods(), &marked, &grace(0), now()).unwrap());
        assert_eq!(deletion(&zero), ("2025-01-01T00:00:00Z".into(), 0));
        assert!(matches!(
            plan(pods(), &zero, &grace(0), now()),
            Ok(Mutation::Keep)
        ));
        let cm = lookup("", "v1", "configmaps").unwrap();
        let held = json!({"metadata": {"name": "c", "finalizers": ["x"], "generation": 1}});
        let out = put(plan(cm, &held, &grace(10), now()).unwrap());
        assert_eq!(
            deletion(&out),
            ("2025-01-01T00:00:00Z".into(), 0),
            "only pods are graceful"
        );
    }
}
