//! Cluster DNS per the Kubernetes DNS specification, and environment-variable discovery.
