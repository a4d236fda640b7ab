//! `apps/v1` Deployments, StatefulSets and DaemonSets: defaulting (apps/v1
//! `SetDefaults_*` plus the pod-template defaults), validation of replicas,
//! selector and template, and what may not change on update.

use k8s_openapi::api::apps::v1::{
    DaemonSet, DaemonSetUpdateStrategy, Deployment, DeploymentStrategy, RollingUpdateDaemonSet,
    RollingUpdateDeployment, RollingUpdateStatefulSetStrategy, StatefulSet,
    StatefulSetPersistentVolumeClaimRetentionPolicy, StatefulSetUpdateStrategy,
};
use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::Value;

use crate::codec::{decode, encode};
use crate::error::FieldError;
use crate::pod::{default_pod_spec, validate_pod_spec};
use crate::syntax::{self, NameRule};

fn default_template(t: &mut PodTemplateSpec) {
    default_pod_spec(t.spec.get_or_insert_with(Default::default));
}

fn selector_json(sel: &LabelSelector) -> String {
    serde_json::to_string(sel).unwrap_or_else(|_| "{}".into())
}

/// Upstream `ValidateLabelSelector`.
pub(crate) fn validate_selector(sel: &LabelSelector, path: &str) -> Vec<FieldError> {
    let mut errs =
        syntax::validate_labels(sel.match_labels.as_ref(), &format!("{path}.matchLabels"));
    const OPS: &[&str] = &["DoesNotExist", "Exists", "In", "NotIn"];
    for (i, r) in sel.match_expressions.iter().flatten().enumerate() {
        let p = format!("{path}.matchExpressions[{i}]");
        let n = r.values.as_ref().map_or(0, Vec::len);
        match r.operator.as_str() {
            "In" | "NotIn" if n == 0 => errs.push(FieldError::required(
                format!("{p}.values"),
                "must be specified when `operator` is 'In' or 'NotIn'",
            )),
            "Exists" | "DoesNotExist" if n > 0 => errs.push(FieldError::forbidden(
                format!("{p}.values"),
                "may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
            )),
            "In" | "NotIn" | "Exists" | "DoesNotExist" => {}
            op => errs.push(FieldError::not_supported(format!("{p}.operator"), op, OPS)),
        }
        errs.extend(
            syntax::is_qualified_name(&r.key)
                .into_iter()
                .map(|m| FieldError::invalid(format!("{p}.key"), &r.key, m)),
        );
    }
    errs
}

/// Does `sel` select a pod with `labels`?
fn selects(sel: &LabelSelector, labels: &std::collections::BTreeMap<String, String>) -> bool {
    let labels_ok = sel
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let exprs_ok = sel.match_expressions.iter().flatten().all(|r| {
        let vals = r.values.as_deref().unwrap_or(&[]);
        match r.operator.as_str() {
            "In" => labels.get(&r.key).is_some_and(|v| vals.contains(v)),
            "NotIn" => labels.get(&r.key).is_none_or(|v| !vals.contains(v)),
            "Exists" => labels.contains_key(&r.key),
            "DoesNotExist" => !labels.contains_key(&r.key),
            _ => false,
        }
    });
    labels_ok && exprs_ok
}

/// Replicas, selector against the template's labels, and the template.
fn validate_workload(
    meta: &ObjectMeta,
    replicas: Option<i32>,
    selector: &LabelSelector,
    template: &PodTemplateSpec,
    kind: &str,
) -> Vec<FieldError> {
    let mut errs = syntax::validate_object_meta(meta, true, NameRule::Dns1123Subdomain);
    if let Some(r) = replicas
        && r < 0
    {
        errs.push(FieldError::invalid(
            "spec.replicas",
            r,
            "must be greater than or equal to 0",
        ));
    }
    let empty_sel = selector.match_labels.as_ref().is_none_or(|m| m.is_empty())
        && selector
            .match_expressions
            .as_ref()
            .is_none_or(|m| m.is_empty());
    if empty_sel {
        if *selector == LabelSelector::default() {
            errs.push(FieldError::required("spec.selector", ""));
        } else {
            errs.push(FieldError::invalid(
                "spec.selector",
                selector_json(selector),
                format!("empty selector is invalid for {kind}"),
            ));
        }
    } else {
        errs.extend(validate_selector(selector, "spec.selector"));
        let labels = template
            .metadata
            .as_ref()
            .and_then(|m| m.labels.clone())
            .unwrap_or_default();
        if !selects(selector, &labels) {
            errs.push(FieldError {
                kind: crate::FieldErrorKind::Invalid,
                field: "spec.template.metadata.labels".into(),
                value: Some(serde_json::to_string(&labels).unwrap_or_default()),
                detail: "`selector` does not match template `labels`".into(),
            });
        }
    }
    let labels = template.metadata.as_ref().and_then(|m| m.labels.as_ref());
    errs.extend(syntax::validate_labels(
        labels,
        "spec.template.metadata.labels",
    ));
    let default_spec = Default::default();
    let spec = template.spec.as_ref().unwrap_or(&default_spec);
    errs.extend(validate_pod_spec(spec, "spec.template.spec", true));
    if let Some(rp) = spec.restart_policy.as_deref()
        && rp != "Always"
    {
        errs.push(FieldError::not_supported(
            "spec.template.spec.restartPolicy",
            rp,
            &["Always"],
        ));
    }
    if spec.active_deadline_seconds.is_some() {
        errs.push(FieldError::forbidden(
            "spec.template.spec.activeDeadlineSeconds",
            "activeDeadlineSeconds in ReplicaSet is not Supported",
        ));
    }
    errs
}

fn validate_int_or_percent(v: &IntOrString, path: &str) -> (Vec<FieldError>, bool) {
    match v {
        IntOrString::Int(n) if *n < 0 => (
            vec![FieldError::invalid(
                path,
                *n,
                "must be greater than or equal to 0",
            )],
            false,
        ),
        IntOrString::Int(n) => (vec![], *n == 0),
        IntOrString::String(s) => {
            let pct = s.strip_suffix('%').and_then(|n| n.parse::<i32>().ok());
            match pct {
                None => (
                    vec![FieldError::invalid(
                        path,
                        s,
                        "a valid percent string must be a numeric string followed by an ending '%' (e.g. '1%',  or '93%', regex used for validation is '[0-9]+%')",
                    )],
                    false,
                ),
                Some(p) if p > 100 => (
                    vec![FieldError::invalid(
                        path,
                        s,
                        "must not be greater than 100%",
                    )],
                    false,
                ),
                Some(p) => (vec![], p == 0),
            }
        }
    }
}

/// A rolling update's `maxUnavailable` and `maxSurge` under `path` (Deployments' and
/// DaemonSets' rules): each an int ≥ 0 or a percentage ≤ 100 %, and not both 0.
fn validate_rolling(
    max_unavailable: Option<&IntOrString>,
    max_surge: Option<&IntOrString>,
    path: &str,
) -> Vec<FieldError> {
    let (mut errs, unavailable_zero) = max_unavailable.map_or((vec![], false), |v| {
        validate_int_or_percent(v, &format!("{path}.maxUnavailable"))
    });
    let (e2, surge_zero) = max_surge.map_or((vec![], false), |v| {
        validate_int_or_percent(v, &format!("{path}.maxSurge"))
    });
    errs.extend(e2);
    if unavailable_zero && surge_zero {
        let rendered = match max_unavailable.cloned().unwrap_or(IntOrString::Int(0)) {
            IntOrString::Int(n) => n.to_string(),
            IntOrString::String(s) => crate::error::quote(&s),
        };
        errs.push(FieldError {
            kind: crate::FieldErrorKind::Invalid,
            field: format!("{path}.maxUnavailable"),
            value: Some(rendered),
            detail: "may not be 0 when `maxSurge` is 0".into(),
        });
    }
    errs
}

/// Bumps `metadata.generation` on a spec change, unless the API server
/// already did (idempotent with a generic bump).
fn bump_generation(meta: &mut ObjectMeta, old_meta: &ObjectMeta, spec_changed: bool) {
    let old_gen = old_meta.generation.unwrap_or(1);
    if spec_changed {
        if meta.generation.unwrap_or(0) <= old_gen {
            meta.generation = Some(old_gen + 1);
        }
    } else {
        meta.generation = Some(old_gen);
    }
}

fn default_deployment(d: &mut Deployment) {
    let spec = d.spec.get_or_insert_with(Default::default);
    spec.replicas.get_or_insert(1);
    let strategy = spec
        .strategy
        .get_or_insert_with(DeploymentStrategy::default);
    if strategy.type_.as_deref().unwrap_or("").is_empty() {
        strategy.type_ = Some("RollingUpdate".into());
    }
    if strategy.type_.as_deref() == Some("RollingUpdate") {
        let ru = strategy
            .rolling_update
            .get_or_insert_with(RollingUpdateDeployment::default);
        ru.max_unavailable
            .get_or_insert(IntOrString::String("25%".into()));
        ru.max_surge
            .get_or_insert(IntOrString::String("25%".into()));
    }
    spec.revision_history_limit.get_or_insert(10);
    spec.progress_deadline_seconds.get_or_insert(600);
    default_template(&mut spec.template);
}

fn validate_deployment(d: &Deployment) -> Vec<FieldError> {
    let default_spec = Default::default();
    let spec = d.spec.as_ref().unwrap_or(&default_spec);
    let mut errs = validate_workload(
        &d.metadata,
        spec.replicas,
        &spec.selector,
        &spec.template,
        "deployment",
    );
    if let Some(s) = &spec.strategy {
        let ty = s.type_.as_deref().unwrap_or("");
        match ty {
            "Recreate" if s.rolling_update.is_some() => errs.push(FieldError::forbidden(
                "spec.strategy.rollingUpdate",
                "may not be specified when strategy `type` is 'Recreate'",
            )),
            "Recreate" => {}
            "RollingUpdate" => {
                if let Some(ru) = &s.rolling_update {
                    errs.extend(validate_rolling(
                        ru.max_unavailable.as_ref(),
                        ru.max_surge.as_ref(),
                        "spec.strategy.rollingUpdate",
                    ));
                }
            }
            other => errs.push(FieldError::not_supported(
                "spec.strategy.type",
                other,
                &["Recreate", "RollingUpdate"],
            )),
        }
    }
    if let Some(r) = spec.revision_history_limit
        && r < 0
    {
        errs.push(FieldError::invalid(
            "spec.revisionHistoryLimit",
            r,
            "must be greater than or equal to 0",
        ));
    }
    if let Some(p) = spec.progress_deadline_seconds {
        if p < 0 {
            errs.push(FieldError::invalid(
                "spec.progressDeadlineSeconds",
                p,
                "must be greater than or equal to 0",
            ));
        } else if p <= spec.min_ready_seconds.unwrap_or(0) {
            errs.push(FieldError::invalid(
                "spec.progressDeadlineSeconds",
                p,
                "must be greater than minReadySeconds",
            ));
        }
    }
    errs
}

pub(crate) fn admit_deployment_create(obj: Value) -> Result<Value, Vec<FieldError>> {
    let mut d: Deployment = decode(obj)?;
    default_deployment(&mut d);
    d.status = Some(Default::default());
    d.metadata.generation = Some(1);
    let errs = validate_deployment(&d);
    if !errs.is_empty() {
        return Err(errs);
    }
    encode(&d)
}

pub(crate) fn admit_deployment_update(old: &Value, new: Value) -> Result<Value, Vec<FieldError>> {
    let old_d: Deployment = decode(old.clone())?;
    let mut d: Deployment = decode(new)?;
    default_deployment(&mut d);
    d.status = old_d.status.clone();
    let mut errs = validate_deployment(&d);
    let (new_sel, old_sel) = (
        d.spec.as_ref().map(|s| &s.selector),
        old_d.spec.as_ref().map(|s| &s.selector),
    );
    if let (Some(n), Some(o)) = (new_sel, old_sel)
        && n != o
    {
        errs.push(FieldError::invalid(
            "spec.selector",
            selector_json(n),
            "field is immutable",
        ));
    }
    if !errs.is_empty() {
        return Err(errs);
    }
    let changed = d.spec != old_d.spec;
    bump_generation(&mut d.metadata, &old_d.metadata, changed);
    encode(&d)
}

fn default_statefulset(s: &mut StatefulSet) {
    let spec = s.spec.get_or_insert_with(Default::default);
    spec.replicas.get_or_insert(1);
    if spec
        .pod_management_policy
        .as_deref()
        .unwrap_or("")
        .is_empty()
    {
        spec.pod_management_policy = Some("OrderedReady".into());
    }
    let us = spec
        .update_strategy
        .get_or_insert_with(StatefulSetUpdateStrategy::default);
    if us.type_.as_deref().unwrap_or("").is_empty() {
        us.type_ = Some("RollingUpdate".into());
    }
    if us.type_.as_deref() == Some("RollingUpdate") {
        us.rolling_update
            .get_or_insert_with(RollingUpdateStatefulSetStrategy::default)
            .partition
            .get_or_insert(0);
    }
    spec.revision_history_limit.get_or_insert(10);
    let policy = spec
        .persistent_volume_claim_retention_policy
        .get_or_insert_with(StatefulSetPersistentVolumeClaimRetentionPolicy::default);
    policy.when_deleted.get_or_insert_with(|| "Retain".into());
    policy.when_scaled.get_or_insert_with(|| "Retain".into());
    default_template(&mut spec.template);
}

fn validate_statefulset(s: &StatefulSet) -> Vec<FieldError> {
    let default_spec = Default::default();
    let spec = s.spec.as_ref().unwrap_or(&default_spec);
    let mut errs = validate_workload(
        &s.metadata,
        spec.replicas,
        &spec.selector,
        &spec.template,
        "statefulset",
    );
    if let Some(p) = spec.pod_management_policy.as_deref()
        && p != "OrderedReady"
        && p != "Parallel"
    {
        errs.push(FieldError::not_supported(
            "spec.podManagementPolicy",
            p,
            &["OrderedReady", "Parallel"],
        ));
    }
    if let Some(us) = &spec.update_strategy {
        match us.type_.as_deref().unwrap_or("") {
            "OnDelete" if us.rolling_update.is_some() => errs.push(FieldError::invalid(
                "spec.updateStrategy.rollingUpdate",
                "{}",
                "only allowed for updateStrategy 'RollingUpdate'",
            )),
            "OnDelete" | "RollingUpdate" => {}
            other => errs.push(FieldError::not_supported(
                "spec.updateStrategy.type",
                other,
                &["OnDelete", "RollingUpdate"],
            )),
        }
        if let Some(p) = us.rolling_update.as_ref().and_then(|r| r.partition)
            && p < 0
        {
            errs.push(FieldError::invalid(
                "spec.updateStrategy.rollingUpdate.partition",
                p,
                "must be greater than or equal to 0",
            ));
        }
    }
    if let Some(name) = spec.service_name.as_deref().filter(|n| !n.is_empty()) {
        errs.extend(
            syntax::is_dns1123_label(name)
                .into_iter()
                .map(|m| FieldError::invalid("spec.serviceName", name, m)),
        );
    }
    if let Some(p) = &spec.persistent_volume_claim_retention_policy {
        for (field, v) in [
            ("whenDeleted", &p.when_deleted),
            ("whenScaled", &p.when_scaled),
        ] {
            if let Some(v) = v.as_deref()
                && v != "Retain"
                && v != "Delete"
            {
                errs.push(FieldError::not_supported(
                    format!("spec.persistentVolumeClaimRetentionPolicy.{field}"),
                    v,
                    &["Delete", "Retain"],
                ));
            }
        }
    }
    errs
}

pub(crate) fn admit_statefulset_create(obj: Value) -> Result<Value, Vec<FieldError>> {
    let mut s: StatefulSet = decode(obj)?;
    default_statefulset(&mut s);
    s.status = Some(Default::default());
    s.metadata.generation = Some(1);
    let errs = validate_statefulset(&s);
    if !errs.is_empty() {
        return Err(errs);
    }
    encode(&s)
}

pub(crate) fn admit_statefulset_update(old: &Value, new: Value) -> Result<Value, Vec<FieldError>> {
    let old_s: StatefulSet = decode(old.clone())?;
    let mut s: StatefulSet = decode(new)?;
    default_statefulset(&mut s);
    s.status = old_s.status.clone();
    let mut errs = validate_statefulset(&s);
    // Only these may change: replicas, ordinals, template, updateStrategy,
    // persistentVolumeClaimRetentionPolicy, minReadySeconds.
    if let (Some(n), Some(o)) = (s.spec.as_ref(), old_s.spec.as_ref()) {
        let mut masked = n.clone();
        masked.replicas = o.replicas;
        masked.ordinals = o.ordinals.clone();
        masked.template = o.template.clone();
        masked.update_strategy = o.update_strategy.clone();
        masked.persistent_volume_claim_retention_policy =
            o.persistent_volume_claim_retention_policy.clone();
        masked.min_ready_seconds = o.min_ready_seconds;
        if masked != *o {
            errs.push(FieldError::forbidden(
                "spec",
                "updates to statefulset spec for fields other than 'replicas', 'ordinals', 'template', 'updateStrategy', 'persistentVolumeClaimRetentionPolicy' and 'minReadySeconds' are forbidden",
            ));
        }
    }
    if !errs.is_empty() {
        return Err(errs);
    }
    let changed = s.spec != old_s.spec;
    bump_generation(&mut s.metadata, &old_s.metadata, changed);
    encode(&s)
}

fn default_daemonset(d: &mut DaemonSet) {
    let spec = d.spec.get_or_insert_with(Default::default);
    let us = spec
        .update_strategy
        .get_or_insert_with(DaemonSetUpdateStrategy::default);
    if us.type_.as_deref().unwrap_or("").is_empty() {
        us.type_ = Some("RollingUpdate".into());
    }
    if us.type_.as_deref() == Some("RollingUpdate") {
        let ru = us
            .rolling_update
            .get_or_insert_with(RollingUpdateDaemonSet::default);
        ru.max_unavailable.get_or_insert(IntOrString::Int(1));
        ru.max_surge.get_or_insert(IntOrString::Int(0));
    }
    spec.revision_history_limit.get_or_insert(10);
    default_template(&mut spec.template);
}

fn validate_daemonset(d: &DaemonSet) -> Vec<FieldError> {
    let default_spec = Default::default();
    let spec = d.spec.as_ref().unwrap_or(&default_spec);
    let mut errs = validate_workload(
        &d.metadata,
        None,
        &spec.selector,
        &spec.template,
        "daemonset",
    );
    if let Some(us) = &spec.update_strategy {
        match us.type_.as_deref().unwrap_or("") {
            "OnDelete" => {}
            "RollingUpdate" => {
                if let Some(ru) = &us.rolling_update {
                    errs.extend(validate_rolling(
                        ru.max_unavailable.as_ref(),
                        ru.max_surge.as_ref(),
                        "spec.updateStrategy.rollingUpdate",
                    ));
                }
            }
            other => errs.push(FieldError::not_supported(
                "spec.updateStrategy.type",
                other,
                &["OnDelete", "RollingUpdate"],
            )),
        }
    }
    if let Some(r) = spec.revision_history_limit
        && r < 0
    {
        errs.push(FieldError::invalid(
            "spec.revisionHistoryLimit",
            r,
            "must be greater than or equal to 0",
        ));
    }
    errs
}

pub(crate) fn admit_daemonset_create(obj: Value) -> Result<Value, Vec<FieldError>> {
    let mut d: DaemonSet = decode(obj)?;
    default_daemonset(&mut d);
    d.status = Some(Default::default());
    d.metadata.generation = Some(1);
    let errs = validate_daemonset(&d);
    if !errs.is_empty() {
        return Err(errs);
    }
    encode(&d)
}

pub(crate) fn admit_daemonset_update(old: &Value, new: Value) -> Result<Value, Vec<FieldError>> {
    let old_d: DaemonSet = decode(old.clone())?;
    let mut d: DaemonSet = decode(new)?;
    default_daemonset(&mut d);
    d.status = old_d.status.clone();
    let mut errs = validate_daemonset(&d);
    if let (Some(n), Some(o)) = (d.spec.as_ref(), old_d.spec.as_ref())
        && n.selector != o.selector
    {
        errs.push(FieldError::invalid(
            "spec.selector",
            selector_json(&n.selector),
            "field is immutable",
        ));
    }
    if !errs.is_empty() {
        return Err(errs);
    }
    let changed = d.spec != old_d.spec;
    bump_generation(&mut d.metadata, &old_d.metadata, changed);
    encode(&d)
}
