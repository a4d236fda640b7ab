//! The store's error type.

/// Everything a [`crate::Store`] operation can fail with.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// No object under the key.
    #[error("{key} not found")]
    NotFound { key: String },
    /// `create` on a key that is taken.
    #[error("{key} already exists")]
    AlreadyExists { key: String },
    /// A revision precondition did not hold.
    #[error("{key}: expected resourceVersion {expected}, found {actual}")]
    Conflict {
        key: String,
        expected: u64,
        actual: u64,
    },
    /// A watch asked for history that was compacted away (HTTP 410).
    #[error("too old resource version: {requested} (compacted to {compacted})")]
    Gone { requested: u64, compacted: u64 },
    /// A read at a revision the store has not reached yet.
    #[error("too large resource version: {requested}, current: {current}")]
    FutureRevision { requested: u64, current: u64 },
    /// The value cannot be stored (not an object with a `metadata` map, or a bad key).
    #[error("invalid object at {key}: {reason}")]
    InvalidObject { key: String, reason: String },
    /// A [`crate::UpdateFn`] refused to go on; the caller's own error is carried through.
    #[error("{0}")]
    Aborted(Box<dyn std::error::Error + Send + Sync>),
    /// The storage backend failed (I/O, corruption, a panicked worker).
    #[error("storage backend: {0}")]
    Backend(String),
}

impl StoreError {
    pub fn is_not_found(&self) -> bool {
        matches!(self, StoreError::NotFound { .. })
    }
    pub fn is_already_exists(&self) -> bool {
        matches!(self, StoreError::AlreadyExists { .. })
    }
    pub fn is_conflict(&self) -> bool {
        matches!(self, StoreError::Conflict { .. })
    }
    pub fn is_gone(&self) -> bool {
        matches!(self, StoreError::Gone { .. })
    }
    pub fn is_invalid(&self) -> bool {
        matches!(self, StoreError::InvalidObject { .. })
    }
    /// Whether trying again later may succeed (only backend trouble qualifies).
    pub fn is_retryable(&self) -> bool {
        matches!(self, StoreError::Backend(_))
    }

    /// Wraps a caller's error raised inside a [`crate::UpdateFn`].
    pub fn aborted(err: impl std::error::Error + Send + Sync + 'static) -> Self {
        StoreError::Aborted(Box::new(err))
    }

    /// The caller's error carried by [`StoreError::Aborted`], if it is of type `E`.
    pub fn downcast_aborted<E: std::error::Error + 'static>(&self) -> Option<&E> {
        match self {
            StoreError::Aborted(inner) => inner.downcast_ref::<E>(),
            _ => None,
        }
    }

    /// Takes the caller's error out of [`StoreError::Aborted`], if it is of type `E`.
    pub fn into_aborted<E: std::error::Error + Send + Sync + 'static>(self) -> Result<E, Self> {
        match self {
            StoreError::Aborted(inner) => match inner.downcast::<E>() {
                Ok(e) => Ok(*e),
                Err(inner) => Err(StoreError::Aborted(inner)),
            },
            other => Err(other),
        }
    }
}

macro_rules! backend_from {
    ($($t:ty),*) => {$(
        impl From<$t> for StoreError {
            fn from(e: $t) -> Self {
                StoreError::Backend(e.to_string())
            }
        }
    )*};
}

backend_from!(
    redb::Error,
    redb::DatabaseError,
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError,
    redb::SetDurabilityError,
    serde_json::Error,
    tokio::task::JoinError
);
