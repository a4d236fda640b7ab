//! Controllers: EndpointSlices, Endpoints, mirroring, Deployments, StatefulSets, scheduling.
