//! Column definitions per kind, as upstream's `AddHandlers` declares them (names are title
//! case; kubectl upper-cases them). Descriptions are the fields' API documentation.

/// One `TableColumnDefinition`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Column {
    pub name: &'static str,
    /// `string`, `integer`, `number`, `boolean` or `date`.
    pub ty: &'static str,
    /// `name` for the object's name column, else empty.
    pub format: &'static str,
    pub description: &'static str,
    /// 0 for default columns, 1 for `-o wide` columns.
    pub priority: i32,
}

const NAME_DESC: &str = "Name must be unique within a namespace. Is required when creating resources, although some resources may allow a client to request the generation of an appropriate name automatically. Name is primarily intended for creation idempotence and configuration definition. Cannot be updated. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names";
const AGE_DESC: &str = "CreationTimestamp is a timestamp representing the server time when this object was created. It is not guaranteed to be set in happens-before order across separate operations. Clients may not set this value. It is represented in RFC3339 form and is in UTC.\n\nPopulated by the system. Read-only. Null for lists. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata";
const CONTAINERS_DESC: &str = "Names of each container in the template.";
const IMAGES_DESC: &str = "Images referenced by each container in the template.";

const fn col(name: &'static str, ty: &'static str, description: &'static str) -> Column {
    Column {
        name,
        ty,
        format: "",
        description,
        priority: 0,
    }
}

const fn wide(name: &'static str, ty: &'static str, description: &'static str) -> Column {
    Column {
        name,
        ty,
        format: "",
        description,
        priority: 1,
    }
}

const NAME: Column = Column {
    name: "Name",
    ty: "string",
    format: "name",
    description: NAME_DESC,
    priority: 0,
};
const AGE: Column = col("Age", "string", AGE_DESC);

const POD: &[Column] = &[
    NAME,
    col(
        "Ready",
        "string",
        "The aggregate readiness state of this pod for accepting traffic.",
    ),
    col(
        "Status",
        "string",
        "The aggregate status of the containers in this pod.",
    ),
    col(
        "Restarts",
        "string",
        "The number of times the containers in this pod have been restarted and when the last container in this pod has restarted.",
    ),
    AGE,
    wide(
        "IP",
        "string",
        "podIP address allocated to the pod. Routable at least within the cluster. Empty if not yet allocated.",
    ),
    wide(
        "Node",
        "string",
        "NodeName indicates in which node this pod is scheduled. If empty, this pod is a candidate for preemption by the scheduler or has not been scheduled yet.",
    ),
    wide(
        "Nominated Node",
        "string",
        "nominatedNodeName is set only when this pod preempts other pods on the node, but it cannot be scheduled right away as preemption victims receive their graceful termination periods.",
    ),
    wide(
        "Readiness Gates",
        "string",
        "If specified, all readiness gates will be evaluated for pod readiness. A pod is ready when all its containers are ready AND all conditions specified in the readiness gates have status equal to \"True\"",
    ),
];

const SERVICE: &[Column] = &[
    NAME,
    col(
        "Type",
        "string",
        "type determines how the Service is exposed. Defaults to ClusterIP. Valid options are ExternalName, ClusterIP, NodePort, and LoadBalancer.",
    ),
    col(
        "Cluster-IP",
        "string",
        "clusterIP is the IP address of the service and is usually assigned randomly.",
    ),
    col(
        "External-IP",
        "string",
        "externalIPs is a list of IP addresses for which nodes in the cluster will also accept traffic for this service.",
    ),
    col(
        "Port(s)",
        "string",
        "The list of ports that are exposed by this service.",
    ),
    AGE,
    wide(
        "Selector",
        "string",
        "Route service traffic to pods with label keys and values matching this selector.",
    ),
];

const ENDPOINTS: &[Column] = &[
    NAME,
    col(
        "Endpoints",
        "string",
        "The set of all endpoints is the union of all subsets. Addresses are placed into subsets according to the IPs they share.",
    ),
    AGE,
];

const ENDPOINT_SLICE: &[Column] = &[
    NAME,
    col(
        "AddressType",
        "string",
        "addressType specifies the type of address carried by this EndpointSlice. All addresses in this slice must be the same type.",
    ),
    col(
        "Ports",
        "string",
        "ports specifies the list of network ports exposed by each endpoint in this slice.",
    ),
    col(
        "Endpoints",
        "string",
        "endpoints is a list of unique endpoints in this slice.",
    ),
    AGE,
];

const DEPLOYMENT: &[Column] = &[
    NAME,
    col("Ready", "string", "Number of the pod with ready state"),
    col(
        "Up-to-date",
        "string",
        "Total number of non-terminating pods targeted by this deployment that have the desired template spec.",
    ),
    col(
        "Available",
        "string",
        "Total number of available non-terminating pods (ready for at least minReadySeconds) targeted by this deployment.",
    ),
    AGE,
    wide("Containers", "string", CONTAINERS_DESC),
    wide("Images", "string", IMAGES_DESC),
    wide(
        "Selector",
        "string",
        "Label selector for pods. Existing ReplicaSets whose pods are selected by this will be the ones affected by this deployment.",
    ),
];

const REPLICA_SET: &[Column] = &[
    NAME,
    col("Desired", "integer", "Number of desired pods"),
    col("Current", "integer", "Number of actually running pods"),
    col("Ready", "integer", "Number of ready pods"),
    AGE,
    wide("Containers", "string", CONTAINERS_DESC),
    wide("Images", "string", IMAGES_DESC),
    wide(
        "Selector",
        "string",
        "Label selector for pods. Existing ReplicaSets whose pods are selected by this will be the ones affected by this deployment.",
    ),
];

const CONTROLLER_REVISION: &[Column] = &[
    NAME,
    col("Controller", "string", "Controller of the object"),
    col("Revision", "string", "Revision of the ControllerRevision"),
    AGE,
];

const STATEFUL_SET: &[Column] = &[
    NAME,
    col("Ready", "string", "Number of the pod with ready state"),
    AGE,
    wide("Containers", "string", CONTAINERS_DESC),
    wide("Images", "string", IMAGES_DESC),
];

/// upstream `daemonSetColumnDefinitions`.
const DAEMON_SET: &[Column] = &[
    NAME,
    col(
        "Desired",
        "integer",
        "The desired number of nodes that should be running the daemon pod.",
    ),
    col(
        "Current",
        "integer",
        "The number of nodes that are running at least 1 daemon pod and are supposed to run the daemon pod.",
    ),
    col(
        "Ready",
        "integer",
        "The number of nodes that should be running the daemon pod and have one or more of the daemon pod running and ready.",
    ),
    col(
        "Up-to-date",
        "integer",
        "The total number of nodes that are running updated daemon pod",
    ),
    col(
        "Available",
        "integer",
        "The number of nodes that should be running the daemon pod and have one or more of the daemon pod running and available (ready for at least spec.minReadySeconds)",
    ),
    col(
        "Node Selector",
        "string",
        "NodeSelector is a selector which must be true for the pod to fit on a node. Selector which must match a node's labels for the pod to be scheduled on that node. More info: https://kubernetes.io/docs/concepts/configuration/assign-pod-node/",
    ),
    AGE,
    wide("Containers", "string", CONTAINERS_DESC),
    wide("Images", "string", IMAGES_DESC),
    wide(
        "Selector",
        "string",
        "A label query over pods that are managed by the daemon set. Must match in order to be controlled. It must match the pod template's labels. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/#label-selectors",
    ),
];

const NODE: &[Column] = &[
    NAME,
    col("Status", "string", "The status of the node"),
    col("Roles", "string", "The roles of the node"),
    AGE,
    col("Version", "string", "Kubelet Version reported by the node."),
    wide(
        "Internal-IP",
        "string",
        "List of addresses reachable to the node.",
    ),
    wide(
        "External-IP",
        "string",
        "List of addresses reachable to the node.",
    ),
    wide(
        "OS-Image",
        "string",
        "OS Image reported by the node from /etc/os-release (e.g. Debian GNU/Linux 7 (wheezy)).",
    ),
    wide(
        "Kernel-Version",
        "string",
        "Kernel Version reported by the node from 'uname -r' (e.g. 3.16.0-0.bpo.4-amd64).",
    ),
    wide(
        "Container-Runtime",
        "string",
        "ContainerRuntime Version reported by the node through runtime remote API (e.g. containerd://1.4.2).",
    ),
];

const NAMESPACE: &[Column] = &[
    NAME,
    col("Status", "string", "The status of the namespace"),
    AGE,
];

const EVENT: &[Column] = &[
    col(
        "Last Seen",
        "string",
        "The time at which the most recent occurrence of this event was recorded.",
    ),
    col(
        "Type",
        "string",
        "Type of this event (Normal, Warning), new types could be added in the future",
    ),
    col(
        "Reason",
        "string",
        "This should be a short, machine understandable string that gives the reason for the transition into the object's current status.",
    ),
    col("Object", "string", "The object that this event is about."),
    wide(
        "Subobject",
        "string",
        "If referring to a piece of an object instead of an entire object, this string should contain a valid JSON/Go field access statement, such as desiredState.manifest.containers[2].",
    ),
    wide(
        "Source",
        "string",
        "The component reporting this event. Should be a short machine understandable string.",
    ),
    col(
        "Message",
        "string",
        "A human-readable description of the status of this operation.",
    ),
    wide(
        "First Seen",
        "string",
        "The time at which the event was first recorded. (Time of server receipt is in TypeMeta.)",
    ),
    wide(
        "Count",
        "string",
        "The number of times this event has occurred.",
    ),
    Column {
        name: "Name",
        ty: "string",
        format: "name",
        description: NAME_DESC,
        priority: 1,
    },
];

const CONFIG_MAP: &[Column] = &[
    NAME,
    col("Data", "string", "Data contains the configuration data."),
    AGE,
];

const NETWORK_POLICY: &[Column] = &[
    NAME,
    col(
        "Pod-Selector",
        "string",
        "podSelector selects the pods to which this NetworkPolicy object applies. An empty podSelector selects all pods in the namespace.",
    ),
    AGE,
];

/// upstream's `roleColumnDefinitions` (Roles and ClusterRoles).
const ROLE: &[Column] = &[
    NAME,
    col(
        "Created At",
        "date",
        "CreationTimestamp is a timestamp representing the server time when this object was created. It is not guaranteed to be set in happens-before order across separate operations. Clients may not set this value. It is represented in RFC3339 form and is in UTC.",
    ),
];

/// upstream's `roleBindingsColumnDefinitions` (RoleBindings and ClusterRoleBindings).
const ROLE_BINDING: &[Column] = &[
    NAME,
    col("Role", "string", "Role of the binding."),
    AGE,
    wide("Users", "string", "Users in the binding."),
    wide("Groups", "string", "Groups in the binding."),
    wide(
        "ServiceAccounts",
        "string",
        "ServiceAccounts in the binding.",
    ),
];

const DEFAULT: &[Column] = &[NAME, AGE];

/// The columns of `kind`'s Table; kinds without a printer get `Name` and `Age`.
pub fn columns(kind: &str) -> &'static [Column] {
    match kind {
        "Pod" => POD,
        "Service" => SERVICE,
        "Endpoints" => ENDPOINTS,
        "EndpointSlice" => ENDPOINT_SLICE,
        "Deployment" => DEPLOYMENT,
        "StatefulSet" => STATEFUL_SET,
        "DaemonSet" => DAEMON_SET,
        "ReplicaSet" => REPLICA_SET,
        "ControllerRevision" => CONTROLLER_REVISION,
        "Node" => NODE,
        "Namespace" => NAMESPACE,
        "Event" => EVENT,
        "ConfigMap" => CONFIG_MAP,
        "NetworkPolicy" => NETWORK_POLICY,
        "Role" | "ClusterRole" => ROLE,
        "RoleBinding" | "ClusterRoleBinding" => ROLE_BINDING,
        _ => DEFAULT,
    }
}
