//! Node proxy core: change tracking and the dataplane-neutral desired state.
