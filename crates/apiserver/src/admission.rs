//! The API server's seam to `svcnet-admission`: it owns the [`Allocators`] behind a mutex and
//! turns field errors into causes of a 422 (or a 400 for bodies that do not decode).

use std::sync::{Mutex, MutexGuard, PoisonError};

use serde_json::Value;
use svcnet_admission::{AdmissionConfig, Allocators, FieldError};

use crate::config::ServerConfig;
use crate::machinery::typed_kind;
use crate::registry::ResourceInfo;
use crate::status::{ApiError, Cause};

/// Admission state shared by all requests.
pub struct Admission {
    allocs: Mutex<Allocators>,
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
        Ok(Admission {
            allocs: Mutex::new(allocs),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Allocators> {
        // Allocators are plain values that admission restores on refusal; a panic elsewhere
        // cannot leave them half-updated, and a rebuild follows any failed write anyway.
        self.allocs.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Rebuilds the allocators from every stored service; returns warnings.
    pub fn rebuild(&self, services: &[Value]) -> Vec<String> {
        self.lock().rebuild(services)
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
        svcnet_admission::admit_create(kind, obj, &mut self.lock())
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
            svcnet_admission::admit_update(kind, old, new, &mut self.lock())
        };
        result.map_err(|e| to_api_error(res, name, e))
    }

    /// Frees a deleted service's allocations.
    pub fn release(&self, service: &Value) {
        self.lock().release(service);
    }
}
