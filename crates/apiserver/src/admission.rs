//! The API server's seam to `svcnet-admission`: it turns field errors into causes of a 422 (or
//! a 400 for bodies that do not decode). The allocators' state lives in the store
//! (`crate::allocations`); a Service write lends admission a working copy loaded from there for
//! one attempt ([`Admission::with_working`]) and commits what changed in it itself, so
//! admission never changes state that outlives an attempt.

use std::cell::RefCell;

use serde_json::Value;
use svcnet_admission::{AdmissionConfig, Allocators, FieldError};

use crate::config::ServerConfig;
use crate::machinery::typed_kind;
use crate::registry::ResourceInfo;
use crate::status::{ApiError, Cause};

/// Admission state shared by all requests.
pub struct Admission {
    /// The configuration, nothing allocated.
    template: Allocators,
}

thread_local! {
    /// The working copy lent to the Service admission running on this thread. A write calls
    /// its decision synchronously inside [`Admission::with_working`] (no await in between), so
    /// concurrent Service writes on other threads each see their own.
    static WORKING: RefCell<Option<Allocators>> = const { RefCell::new(None) };
}

fn to_api_error(res: &ResourceInfo, name: &str, errors: Vec<FieldError>) -> ApiError {
    if let Some(decode) = errors.iter().find(|e| e.is_decode_error()) {
        return ApiError::BadRequest(decode.detail.clone());
    }
    let causes = errors
        .iter()
        .map(|e| Cause {
            reason: e.kind.reason().to_string(),
            field: e.field.clone(),
            message: e.body(),
        })
        .collect();
    ApiError::invalid(res, name, causes)
}

impl Admission {
    pub fn new(cfg: &ServerConfig) -> Result<Self, String> {
        let allocs = Allocators::new(AdmissionConfig {
            service_cidrs: cfg.service_cidrs.clone(),
            node_port_range: cfg.node_port_range.clone(),
            lb_pool: cfg.lb_pool,
            reserved_ips: vec![cfg.dns_service_ip],
        })
        .map_err(|e| e.to_string())?;
        Ok(Admission { template: allocs })
    }

    /// The configured allocators with nothing allocated.
    pub fn template(&self) -> &Allocators {
        &self.template
    }

    /// Runs `f` (which admits one Service write) with `working` as the allocators, and returns
    /// what `f` returned and the allocators after it.
    pub fn with_working<T>(&self, working: Allocators, f: impl FnOnce() -> T) -> (T, Allocators) {
        let previous = WORKING.with(|w| w.borrow_mut().replace(working));
        let out = f();
        let after = WORKING.with(|w| std::mem::replace(&mut *w.borrow_mut(), previous));
        (out, after.unwrap_or_else(|| self.template.clone()))
    }

    /// Runs admission with the allocators a write of `kind` uses: the lent working copy for a
    /// Service, the configuration (nothing allocated) for kinds that only read it.
    fn admit<T>(&self, kind: &str, f: impl FnOnce(&mut Allocators) -> T) -> Result<T, ApiError> {
        if kind != "Service" {
            return Ok(f(&mut self.template.clone()));
        }
        WORKING.with(|w| match w.borrow_mut().as_mut() {
            Some(working) => Ok(f(working)),
            None => Err(ApiError::Internal(
                "a Service was admitted outside a Service write".into(),
            )),
        })
    }

    pub fn admit_create(
        &self,
        res: &ResourceInfo,
        name: &str,
        obj: Value,
    ) -> Result<Value, ApiError> {
        let Some(kind) = typed_kind(res) else {
            return Ok(obj);
        };
        self.admit(kind, |a| svcnet_admission::admit_create(kind, obj, a))?
            .map_err(|e| to_api_error(res, name, e))
    }

    /// Admits an update of the main resource, or of the `status` subresource.
    pub fn admit_update(
        &self,
        res: &ResourceInfo,
        name: &str,
        old: &Value,
        new: Value,
        status: bool,
    ) -> Result<Value, ApiError> {
        let Some(kind) = typed_kind(res) else {
            return Ok(new);
        };
        let result = if status {
            svcnet_admission::admit_status_update(kind, old, new)
        } else {
            self.admit(kind, |a| svcnet_admission::admit_update(kind, old, new, a))?
        };
        result.map_err(|e| to_api_error(res, name, e))
    }
}
