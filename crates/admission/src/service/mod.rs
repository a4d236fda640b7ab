//! Service admission: defaulting, validation, then allocation of cluster
//! IPs, node ports, health-check node ports and load-balancer ingress IPs.
//!
//! **Invariant:** a refused create or update leaves the [`Allocators`]
//! exactly as they were: allocation runs on the live allocators after a
//! snapshot is taken, and the snapshot is put back on any error.

pub(crate) mod allocate;
pub(crate) mod defaults;
pub(crate) mod validate;

use k8s_openapi::api::core::v1::{Service, ServiceSpec, ServiceStatus};
use serde_json::Value;

use crate::alloc::Allocators;
use crate::codec::{decode, encode};
use crate::error::FieldError;

pub use allocate::SVCNET_LB_CLASS;

pub(crate) fn admit_create(obj: Value, allocs: &mut Allocators) -> Result<Value, Vec<FieldError>> {
    let mut svc: Service = decode(obj)?;
    defaults::set_defaults(&mut svc);
    let spec = svc.spec.get_or_insert_with(Default::default);
    defaults::normalize_cluster_ips(spec, None);
    // A new service starts with an empty status; the load-balancer
    // controller (below) fills it in.
    svc.status = Some(ServiceStatus {
        load_balancer: Some(Default::default()),
        conditions: None,
    });
    let errs = validate::validate_service(&svc, &allocs.families());
    if !errs.is_empty() {
        return Err(errs);
    }
    transactional(allocs, |allocs| allocate::on_create(&mut svc, allocs))?;
    encode(&svc)
}

pub(crate) fn admit_update(
    old: &Value,
    new: Value,
    allocs: &mut Allocators,
) -> Result<Value, Vec<FieldError>> {
    let old_svc: Service = decode(old.clone())?;
    let mut svc: Service = decode(new)?;
    let default_spec = ServiceSpec::default();
    let old_spec = old_svc.spec.as_ref().unwrap_or(&default_spec);
    // Writes to the main resource never change the status.
    svc.status = old_svc.status.clone();
    defaults::set_defaults(&mut svc);
    defaults::patch_allocated_values(svc.spec.get_or_insert_with(Default::default), old_spec);
    defaults::drop_type_dependent_fields(&mut svc, old_spec);
    defaults::normalize_cluster_ips(
        svc.spec.get_or_insert_with(Default::default),
        Some(old_spec),
    );
    let mut errs = validate::validate_service(&svc, &allocs.families());
    errs.extend(validate::validate_service_update(
        svc.spec.as_ref().unwrap_or(&default_spec),
        old_spec,
    ));
    if !errs.is_empty() {
        return Err(errs);
    }
    transactional(allocs, |allocs| {
        allocate::on_update(&mut svc, &old_svc, allocs)
    })?;
    encode(&svc)
}

/// A write to the `status` subresource: the spec stays as stored, the status
/// is the client's (a load-balancer controller's, for example).
pub(crate) fn admit_status_update(old: &Value, new: Value) -> Result<Value, Vec<FieldError>> {
    let old_svc: Service = decode(old.clone())?;
    let mut svc: Service = decode(new)?;
    svc.spec = old_svc.spec;
    let mut errs = Vec::new();
    let ingress = svc
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|l| l.ingress.as_ref());
    for (i, ing) in ingress.into_iter().flatten().enumerate() {
        if let Some(ip) = ing.ip.as_deref().filter(|s| !s.is_empty())
            && crate::syntax::parse_ip(ip).is_none()
        {
            errs.push(FieldError::invalid(
                format!("status.loadBalancer.ingress[{i}].ip"),
                ip,
                crate::syntax::IP_MSG,
            ));
        }
        if let Some(mode) = ing.ip_mode.as_deref()
            && mode != "VIP"
            && mode != "Proxy"
        {
            errs.push(FieldError::not_supported(
                format!("status.loadBalancer.ingress[{i}].ipMode"),
                mode,
                &["Proxy", "VIP"],
            ));
        }
    }
    if !errs.is_empty() {
        return Err(errs);
    }
    encode(&svc)
}

/// Runs `f` on the allocators; on error puts back the state from before.
fn transactional<T>(
    allocs: &mut Allocators,
    f: impl FnOnce(&mut Allocators) -> Result<T, Vec<FieldError>>,
) -> Result<T, Vec<FieldError>> {
    let snapshot = allocs.clone();
    let result = f(allocs);
    if result.is_err() {
        *allocs = snapshot;
    }
    result
}
