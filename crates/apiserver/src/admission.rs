//! The API server's seam to admission (defaulting, validation, allocation). Holds the
//! allocators; fallback pass-through until `svcnet-admission` lands.

use std::sync::Mutex;

use serde_json::Value;

use crate::config::ServerConfig;
use crate::status::Cause;

/// Admission state shared by all requests.
pub struct Admission {
    allocs: Mutex<()>,
}

impl Admission {
    pub fn new(_cfg: &ServerConfig) -> Result<Self, String> {
        Ok(Admission {
            allocs: Mutex::new(()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ()> {
        self.allocs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Rebuilds the allocators from every stored service; returns warnings.
    pub fn rebuild(&self, _services: &[Value]) -> Vec<String> {
        let _g = self.lock();
        Vec::new()
    }

    pub fn admit_create(&self, _kind: &str, obj: Value) -> Result<Value, Vec<Cause>> {
        let _g = self.lock();
        Ok(obj)
    }

    pub fn admit_update(&self, _kind: &str, _old: &Value, new: Value) -> Result<Value, Vec<Cause>> {
        let _g = self.lock();
        Ok(new)
    }

    pub fn release(&self, _service: &Value) {
        let _g = self.lock();
    }
}
