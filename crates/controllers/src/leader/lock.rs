//! The lock the elector takes: one `coordination.k8s.io/v1` Lease (client-go's `LeaseLock`).
//!
//! An update always replaces the Lease last read, carrying that read's `resourceVersion`:
//! the API server refuses it with 409 Conflict when anyone wrote the Lease in between. That
//! compare-and-swap is what makes two candidates that both saw an expired lease unable to
//! both take it.

use std::future::Future;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use kube::Api;
use kube::api::{ObjectMeta, PostParams};

/// The field manager of the lease writes (`managedFields`).
const FIELD_MANAGER: &str = "svcnet-leader-election";

/// Errors of reading or writing the lock.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    /// Someone wrote the Lease after it was read (409 Conflict on the resourceVersion), or
    /// created it first: another candidate won this round.
    #[error("lease {lease}: another candidate wrote it first (409 Conflict)")]
    Conflict { lease: String },
    /// The API call failed.
    #[error("lease {lease}: {action}: {source}")]
    Api {
        lease: String,
        action: &'static str,
        #[source]
        source: kube::Error,
    },
    /// An update was asked for before any read (a bug in the caller).
    #[error("lease {lease}: update before the lease was read or created")]
    NotRead { lease: String },
}

impl LeaseError {
    /// Whether another candidate's write beat this one.
    pub fn is_conflict(&self) -> bool {
        matches!(self, Self::Conflict { .. })
    }
}

/// A lock holding one leader-election record.
pub trait LeaseLock: Send {
    /// The record, or `None` when the Lease does not exist.
    fn get(&mut self) -> impl Future<Output = Result<Option<LeaseSpec>, LeaseError>> + Send;
    /// Creates the Lease with `spec`; [`LeaseError::Conflict`] when it exists already.
    fn create(&mut self, spec: LeaseSpec) -> impl Future<Output = Result<(), LeaseError>> + Send;
    /// Replaces the record of the Lease last read or written, conditional on its
    /// resourceVersion; [`LeaseError::Conflict`] when it changed since.
    fn update(&mut self, spec: LeaseSpec) -> impl Future<Output = Result<(), LeaseError>> + Send;
    /// `namespace/name`, for messages.
    fn describe(&self) -> String;
}

/// The Lease `namespace/name` through the Kubernetes API.
#[derive(Clone)]
pub struct KubeLeaseLock {
    api: Api<Lease>,
    namespace: String,
    name: String,
    /// The Lease as last read or written: its resourceVersion is the precondition of the
    /// next update.
    last: Option<Lease>,
}

impl KubeLeaseLock {
    pub fn new(client: kube::Client, namespace: &str, name: &str) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            namespace: namespace.to_string(),
            name: name.to_string(),
            last: None,
        }
    }

    fn api_error(&self, action: &'static str, source: kube::Error) -> LeaseError {
        match &source {
            kube::Error::Api(s) if s.is_conflict() || s.is_already_exists() => {
                LeaseError::Conflict {
                    lease: self.describe(),
                }
            }
            _ => LeaseError::Api {
                lease: self.describe(),
                action,
                source,
            },
        }
    }
}

fn params() -> PostParams {
    PostParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..PostParams::default()
    }
}

impl LeaseLock for KubeLeaseLock {
    async fn get(&mut self) -> Result<Option<LeaseSpec>, LeaseError> {
        let got = self
            .api
            .get_opt(&self.name)
            .await
            .map_err(|e| self.api_error("get", e))?;
        let spec = got.as_ref().map(|l| l.spec.clone().unwrap_or_default());
        self.last = got;
        Ok(spec)
    }

    async fn create(&mut self, spec: LeaseSpec) -> Result<(), LeaseError> {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                namespace: Some(self.namespace.clone()),
                ..ObjectMeta::default()
            },
            spec: Some(spec),
        };
        let created = self
            .api
            .create(&params(), &lease)
            .await
            .map_err(|e| self.api_error("create", e))?;
        self.last = Some(created);
        Ok(())
    }

    async fn update(&mut self, spec: LeaseSpec) -> Result<(), LeaseError> {
        let Some(mut lease) = self.last.clone() else {
            return Err(LeaseError::NotRead {
                lease: self.describe(),
            });
        };
        // The read's metadata, resourceVersion included, goes back unchanged: the server
        // compares it with the stored one.
        lease.spec = Some(spec);
        let written = self
            .api
            .replace(&self.name, &params(), &lease)
            .await
            .map_err(|e| self.api_error("update", e))?;
        self.last = Some(written);
        Ok(())
    }

    fn describe(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}
