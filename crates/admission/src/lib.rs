//! Pure admission: defaulting, validation and IP/port allocation for API
//! objects, as a Kubernetes API server does it.
//!
//! The API server hands every create and update to [`admit_create`] /
//! [`admit_update`] with the object's `kind`; admission returns the object to
//! store (defaulted, with cluster IPs, node ports and load-balancer ingress
//! filled in) or the list of [`FieldError`]s a 422 `Status` carries, with
//! upstream's messages. Services take their addresses from [`Allocators`],
//! which the API server keeps under a mutex across admission and the store
//! write, [`Allocators::release`]s on delete and [`Allocators::rebuild`]s
//! from the stored services at startup.
//!
//! This crate never does I/O, never reads the clock and never spawns: it is
//! a function of its inputs, which is what lets it be tested exhaustively.
//! Objects are decoded into k8s-openapi types, which prunes unknown fields
//! the way a real API server does.

mod alloc;
mod codec;
mod error;
mod service;
pub mod syntax;

use serde_json::Value;

pub use alloc::{
    AdmissionConfig, AllocError, Allocators, DEFAULT_DNS_IP, DEFAULT_LB_POOL, DEFAULT_SERVICE_CIDR,
    Protocol, family_of,
};
pub use error::{BadValue, ConfigError, FieldError, FieldErrorKind};
pub use service::SVCNET_LB_CLASS;
pub use service::defaults::DEFAULT_CLIENT_IP_TIMEOUT;
pub use service::validate::MAX_CLIENT_IP_TIMEOUT;

/// Admits a new object of `kind`. Kinds admission does not know pass
/// through unchanged.
pub fn admit_create(
    kind: &str,
    obj: Value,
    allocs: &mut Allocators,
) -> Result<Value, Vec<FieldError>> {
    match kind {
        "Service" => service::admit_create(obj, allocs),
        _ => Ok(obj),
    }
}

/// Admits a replacement of `old` by `new` (a PUT or the result of a PATCH on
/// the main resource). For Services, allocations follow the change: what
/// the new object no longer uses is released, what it newly needs is
/// allocated, and on failure the allocators are left untouched.
pub fn admit_update(
    kind: &str,
    old: &Value,
    new: Value,
    allocs: &mut Allocators,
) -> Result<Value, Vec<FieldError>> {
    match kind {
        "Service" => service::admit_update(old, new, allocs),
        _ => Ok(new),
    }
}

/// Admits a write to the `status` subresource: the stored spec is kept and
/// only the status is taken from `new` (and validated). Never allocates.
pub fn admit_status_update(kind: &str, old: &Value, new: Value) -> Result<Value, Vec<FieldError>> {
    match kind {
        "Service" => service::admit_status_update(old, new),
        _ => Ok(new),
    }
}
