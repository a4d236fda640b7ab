//! Pure API machinery for svcnet's Kubernetes-compatible API server: label and field
//! selectors, JSON / merge / strategic-merge patch, `meta.k8s.io/v1` Table output and strict
//! (unknown-field) checks and server-side apply's field ownership (`managedFields`), all as functions on `serde_json::Value` that follow upstream
//! `k8s.io/apimachinery` semantics.
//!
//! This crate never does I/O: no sockets, no files, no tokio. Only `table::to_table` reads the
//! clock (for the AGE column); `table::to_table_at` takes `now` instead.

pub mod managed;
pub mod patch;
pub mod selector;
pub mod strict;
pub mod table;
