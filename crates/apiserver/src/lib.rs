//! Kubernetes-compatible API server over the embedded store.
