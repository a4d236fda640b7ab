//! Network namespaces, links and routes: the one crate that does syscalls.
