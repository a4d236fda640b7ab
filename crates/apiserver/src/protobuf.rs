//! Request bodies in Kubernetes' protobuf encoding (`application/vnd.kubernetes.protobuf`),
//! which kubectl's typed commands send (`kubectl create namespace`, `create service`,
//! `create configmap`, `create serviceaccount`, `create deployment`, `run`, ...) and from which client-go has no JSON fallback (it falls back only
//! from CBOR). The body is decoded into the JSON object the rest of the server handles.
//!
//! Wire format: the magic `k8s\0`, then a `runtime.Unknown` {typeMeta = 1 {apiVersion = 1,
//! kind = 2}, raw = 2, contentEncoding = 3, contentType = 4} whose `raw` is the object's
//! message. Field numbers come from `k8s.io/api` `core/v1` and `apps/v1` `generated.proto` and
//! apimachinery's `meta/v1`, `intstr` and `resource` protos; only the kinds in [`KINDS`] are
//! described. The generated Go marshallers write every non-pointer field, so a zero value of a
//! value field is dropped (it is what "unset" looks like), while pointer fields ([`F::opt`])
//! keep theirs (`replicas: 0`). A field this table does not know is refused when it carries a
//! value, never silently lost; when it carries only its zero value it is skipped.

use serde_json::{Map, Value, json};

/// The magic prefix of every Kubernetes protobuf body.
pub const MAGIC: &[u8] = b"k8s\0";

/// A decoding failure, served as 415 by the caller (the client can send JSON instead).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ProtoError(String);

#[derive(Clone, Copy)]
enum Ty {
    Str,
    Int,
    Bool,
    Msg(&'static [F]),
    MapStr,
    MapQuantity,
    /// `map<string, bytes>`: values become base64, as in JSON.
    MapBytes,
    IntOrString,
    Time,
}

/// One field of a message: number, JSON name, type, repeated, and whether it is a pointer in
/// Go (so an explicit zero is meaningful).
#[derive(Clone, Copy)]
struct F {
    num: u64,
    name: &'static str,
    ty: Ty,
    rep: bool,
    opt: bool,
}

const fn f(num: u64, name: &'static str, ty: Ty) -> F {
    F {
        num,
        name,
        ty,
        rep: false,
        opt: false,
    }
}
const fn rep(num: u64, name: &'static str, ty: Ty) -> F {
    F {
        rep: true,
        ..f(num, name, ty)
    }
}
const fn opt(num: u64, name: &'static str, ty: Ty) -> F {
    F {
        opt: true,
        ..f(num, name, ty)
    }
}

use Ty::{Bool, Int, IntOrString, MapBytes, MapQuantity, MapStr, Msg, Str, Time};

const OWNER_REFERENCE: &[F] = &[
    f(5, "apiVersion", Str),
    f(1, "kind", Str),
    f(3, "name", Str),
    f(4, "uid", Str),
    opt(6, "controller", Bool),
    opt(7, "blockOwnerDeletion", Bool),
];
const OBJECT_META: &[F] = &[
    f(1, "name", Str),
    f(2, "generateName", Str),
    f(3, "namespace", Str),
    f(5, "uid", Str),
    f(6, "resourceVersion", Str),
    f(7, "generation", Int),
    f(8, "creationTimestamp", Time),
    f(9, "deletionTimestamp", Time),
    opt(10, "deletionGracePeriodSeconds", Int),
    f(11, "labels", MapStr),
    f(12, "annotations", MapStr),
    rep(13, "ownerReferences", Msg(OWNER_REFERENCE)),
    rep(14, "finalizers", Str),
];
const SELECTOR_REQUIREMENT: &[F] = &[
    f(1, "key", Str),
    f(2, "operator", Str),
    rep(3, "values", Str),
];
const LABEL_SELECTOR: &[F] = &[
    f(1, "matchLabels", MapStr),
    rep(2, "matchExpressions", Msg(SELECTOR_REQUIREMENT)),
];

const NAMESPACE_SPEC: &[F] = &[rep(1, "finalizers", Str)];
const NAMESPACE_STATUS: &[F] = &[f(1, "phase", Str)];
const NAMESPACE: &[F] = &[
    f(1, "metadata", Msg(OBJECT_META)),
    f(2, "spec", Msg(NAMESPACE_SPEC)),
    f(3, "status", Msg(NAMESPACE_STATUS)),
];

const SERVICE_PORT: &[F] = &[
    f(1, "name", Str),
    f(2, "protocol", Str),
    opt(6, "appProtocol", Str),
    f(3, "port", Int),
    f(4, "targetPort", IntOrString),
    f(5, "nodePort", Int),
];
const CLIENT_IP_CONFIG: &[F] = &[opt(1, "timeoutSeconds", Int)];
const SESSION_AFFINITY_CONFIG: &[F] = &[opt(1, "clientIP", Msg(CLIENT_IP_CONFIG))];
const SERVICE_SPEC: &[F] = &[
    rep(1, "ports", Msg(SERVICE_PORT)),
    f(2, "selector", MapStr),
    f(3, "clusterIP", Str),
    rep(18, "clusterIPs", Str),
    f(4, "type", Str),
    rep(5, "externalIPs", Str),
    f(7, "sessionAffinity", Str),
    f(8, "loadBalancerIP", Str),
    rep(9, "loadBalancerSourceRanges", Str),
    f(10, "externalName", Str),
    f(11, "externalTrafficPolicy", Str),
    f(12, "healthCheckNodePort", Int),
    f(13, "publishNotReadyAddresses", Bool),
    opt(14, "sessionAffinityConfig", Msg(SESSION_AFFINITY_CONFIG)),
    rep(19, "ipFamilies", Str),
    opt(17, "ipFamilyPolicy", Str),
    opt(20, "allocateLoadBalancerNodePorts", Bool),
    opt(21, "loadBalancerClass", Str),
    opt(22, "internalTrafficPolicy", Str),
    opt(23, "trafficDistribution", Str),
];
/// The server owns a Service's status; a create's (empty) status is read and dropped.
const IGNORED_STATUS: &[F] = &[];
const SERVICE: &[F] = &[
    f(1, "metadata", Msg(OBJECT_META)),
    f(2, "spec", Msg(SERVICE_SPEC)),
    f(3, "status", Msg(IGNORED_STATUS)),
];

const CONTAINER_PORT: &[F] = &[
    f(1, "name", Str),
    f(2, "hostPort", Int),
    f(3, "containerPort", Int),
    f(4, "protocol", Str),
    f(5, "hostIP", Str),
];
const ENV_VAR: &[F] = &[f(1, "name", Str), f(2, "value", Str)];
const RESOURCES: &[F] = &[f(1, "limits", MapQuantity), f(2, "requests", MapQuantity)];
const CONTAINER: &[F] = &[
    f(1, "name", Str),
    f(2, "image", Str),
    rep(3, "command", Str),
    rep(4, "args", Str),
    f(5, "workingDir", Str),
    rep(6, "ports", Msg(CONTAINER_PORT)),
    rep(7, "env", Msg(ENV_VAR)),
    f(8, "resources", Msg(RESOURCES)),
    f(13, "terminationMessagePath", Str),
    f(20, "terminationMessagePolicy", Str),
    f(14, "imagePullPolicy", Str),
    f(16, "stdin", Bool),
    f(17, "stdinOnce", Bool),
    f(18, "tty", Bool),
];
const POD_SPEC: &[F] = &[
    rep(20, "initContainers", Msg(CONTAINER)),
    rep(2, "containers", Msg(CONTAINER)),
    f(3, "restartPolicy", Str),
    opt(4, "terminationGracePeriodSeconds", Int),
    f(6, "dnsPolicy", Str),
    f(7, "nodeSelector", MapStr),
    f(8, "serviceAccountName", Str),
    f(10, "nodeName", Str),
    f(11, "hostNetwork", Bool),
    f(16, "hostname", Str),
    f(17, "subdomain", Str),
    f(19, "schedulerName", Str),
    opt(30, "enableServiceLinks", Bool),
];
const POD_TEMPLATE_SPEC: &[F] = &[
    f(1, "metadata", Msg(OBJECT_META)),
    f(2, "spec", Msg(POD_SPEC)),
];
const ROLLING_UPDATE: &[F] = &[
    opt(1, "maxUnavailable", IntOrString),
    opt(2, "maxSurge", IntOrString),
];
const DEPLOYMENT_STRATEGY: &[F] = &[
    f(1, "type", Str),
    opt(2, "rollingUpdate", Msg(ROLLING_UPDATE)),
];
const DEPLOYMENT_SPEC: &[F] = &[
    opt(1, "replicas", Int),
    opt(2, "selector", Msg(LABEL_SELECTOR)),
    f(3, "template", Msg(POD_TEMPLATE_SPEC)),
    f(4, "strategy", Msg(DEPLOYMENT_STRATEGY)),
    f(5, "minReadySeconds", Int),
    opt(6, "revisionHistoryLimit", Int),
    f(7, "paused", Bool),
    opt(9, "progressDeadlineSeconds", Int),
];
const DEPLOYMENT: &[F] = &[
    f(1, "metadata", Msg(OBJECT_META)),
    f(2, "spec", Msg(DEPLOYMENT_SPEC)),
    f(3, "status", Msg(IGNORED_STATUS)),
];

const POD: &[F] = &[
    f(1, "metadata", Msg(OBJECT_META)),
    f(2, "spec", Msg(POD_SPEC)),
    f(3, "status", Msg(IGNORED_STATUS)),
];
const CONFIG_MAP: &[F] = &[
    f(1, "metadata", Msg(OBJECT_META)),
    f(2, "data", MapStr),
    f(3, "binaryData", MapBytes),
    opt(4, "immutable", Bool),
];
const OBJECT_REFERENCE: &[F] = &[
    f(1, "kind", Str),
    f(2, "namespace", Str),
    f(3, "name", Str),
    f(4, "uid", Str),
    f(5, "apiVersion", Str),
    f(6, "resourceVersion", Str),
    f(7, "fieldPath", Str),
];
const LOCAL_OBJECT_REFERENCE: &[F] = &[f(1, "name", Str)];
const SERVICE_ACCOUNT: &[F] = &[
    f(1, "metadata", Msg(OBJECT_META)),
    rep(2, "secrets", Msg(OBJECT_REFERENCE)),
    rep(3, "imagePullSecrets", Msg(LOCAL_OBJECT_REFERENCE)),
    opt(4, "automountServiceAccountToken", Bool),
];

const IP_BLOCK: &[F] = &[f(1, "cidr", Str), rep(2, "except", Str)];
/// Every peer field is a pointer in Go: a present empty selector selects everything.
const NETWORK_POLICY_PEER: &[F] = &[
    opt(1, "podSelector", Msg(LABEL_SELECTOR)),
    opt(2, "namespaceSelector", Msg(LABEL_SELECTOR)),
    opt(3, "ipBlock", Msg(IP_BLOCK)),
];
const NETWORK_POLICY_PORT: &[F] = &[
    opt(1, "protocol", Str),
    opt(2, "port", IntOrString),
    opt(3, "endPort", Int),
];
const NETWORK_POLICY_INGRESS_RULE: &[F] = &[
    rep(1, "ports", Msg(NETWORK_POLICY_PORT)),
    rep(2, "from", Msg(NETWORK_POLICY_PEER)),
];
const NETWORK_POLICY_EGRESS_RULE: &[F] = &[
    rep(1, "ports", Msg(NETWORK_POLICY_PORT)),
    rep(2, "to", Msg(NETWORK_POLICY_PEER)),
];
const NETWORK_POLICY_SPEC: &[F] = &[
    f(1, "podSelector", Msg(LABEL_SELECTOR)),
    rep(2, "ingress", Msg(NETWORK_POLICY_INGRESS_RULE)),
    rep(3, "egress", Msg(NETWORK_POLICY_EGRESS_RULE)),
    rep(4, "policyTypes", Str),
];
const NETWORK_POLICY: &[F] = &[
    f(1, "metadata", Msg(OBJECT_META)),
    f(2, "spec", Msg(NETWORK_POLICY_SPEC)),
];

const POLICY_RULE: &[F] = &[
    rep(1, "verbs", Str),
    rep(2, "apiGroups", Str),
    rep(3, "resources", Str),
    rep(4, "resourceNames", Str),
    rep(5, "nonResourceURLs", Str),
];
const ROLE: &[F] = &[
    f(1, "metadata", Msg(OBJECT_META)),
    rep(2, "rules", Msg(POLICY_RULE)),
];
const SUBJECT: &[F] = &[
    f(1, "kind", Str),
    f(2, "apiGroup", Str),
    f(3, "name", Str),
    f(4, "namespace", Str),
];
const ROLE_REF: &[F] = &[f(1, "apiGroup", Str), f(2, "kind", Str), f(3, "name", Str)];
const ROLE_BINDING: &[F] = &[
    f(1, "metadata", Msg(OBJECT_META)),
    rep(2, "subjects", Msg(SUBJECT)),
    f(3, "roleRef", Msg(ROLE_REF)),
];

const RESOURCE_ATTRIBUTES: &[F] = &[
    f(1, "namespace", Str),
    f(2, "verb", Str),
    f(3, "group", Str),
    f(4, "version", Str),
    f(5, "resource", Str),
    f(6, "subresource", Str),
    f(7, "name", Str),
];
const NON_RESOURCE_ATTRIBUTES: &[F] = &[f(1, "path", Str), f(2, "verb", Str)];
const SELF_SUBJECT_ACCESS_REVIEW_SPEC: &[F] = &[
    opt(1, "resourceAttributes", Msg(RESOURCE_ATTRIBUTES)),
    opt(2, "nonResourceAttributes", Msg(NON_RESOURCE_ATTRIBUTES)),
];
/// A review's status, which client-go marshals (empty) with the request.
const SUBJECT_ACCESS_REVIEW_STATUS: &[F] = &[
    f(1, "allowed", Bool),
    f(4, "denied", Bool),
    f(2, "reason", Str),
    f(3, "evaluationError", Str),
];
const SELF_SUBJECT_ACCESS_REVIEW: &[F] = &[
    f(1, "metadata", Msg(OBJECT_META)),
    f(2, "spec", Msg(SELF_SUBJECT_ACCESS_REVIEW_SPEC)),
    f(3, "status", Msg(SUBJECT_ACCESS_REVIEW_STATUS)),
];
const SUBJECT_RULES_REVIEW_STATUS: &[F] = &[f(3, "incomplete", Bool), f(4, "evaluationError", Str)];
const SELF_SUBJECT_RULES_REVIEW_SPEC: &[F] = &[f(1, "namespace", Str)];
const SELF_SUBJECT_RULES_REVIEW: &[F] = &[
    f(1, "metadata", Msg(OBJECT_META)),
    f(2, "spec", Msg(SELF_SUBJECT_RULES_REVIEW_SPEC)),
    f(3, "status", Msg(SUBJECT_RULES_REVIEW_STATUS)),
];
const USER_INFO: &[F] = &[
    f(1, "username", Str),
    f(2, "uid", Str),
    rep(3, "groups", Str),
];
const SELF_SUBJECT_REVIEW: &[F] = &[
    f(1, "metadata", Msg(OBJECT_META)),
    f(2, "status", Msg(&[f(1, "userInfo", Msg(USER_INFO))])),
];
const BOUND_OBJECT_REFERENCE: &[F] = &[
    f(1, "kind", Str),
    f(2, "apiVersion", Str),
    f(3, "name", Str),
    f(4, "uid", Str),
];
const TOKEN_REQUEST_SPEC: &[F] = &[
    rep(1, "audiences", Str),
    opt(4, "expirationSeconds", Int),
    opt(3, "boundObjectRef", Msg(BOUND_OBJECT_REFERENCE)),
];
const TOKEN_REQUEST_STATUS: &[F] = &[f(1, "token", Str), f(2, "expirationTimestamp", Time)];
const TOKEN_REQUEST: &[F] = &[
    f(1, "metadata", Msg(OBJECT_META)),
    f(2, "spec", Msg(TOKEN_REQUEST_SPEC)),
    f(3, "status", Msg(TOKEN_REQUEST_STATUS)),
];

/// The kinds whose protobuf bodies are understood: (apiVersion, kind, message).
const KINDS: &[(&str, &str, &[F])] = &[
    ("v1", "Namespace", NAMESPACE),
    ("v1", "Service", SERVICE),
    ("v1", "Pod", POD),
    ("v1", "ConfigMap", CONFIG_MAP),
    ("v1", "ServiceAccount", SERVICE_ACCOUNT),
    ("apps/v1", "Deployment", DEPLOYMENT),
    ("networking.k8s.io/v1", "NetworkPolicy", NETWORK_POLICY),
    ("rbac.authorization.k8s.io/v1", "Role", ROLE),
    ("rbac.authorization.k8s.io/v1", "ClusterRole", ROLE),
    ("rbac.authorization.k8s.io/v1", "RoleBinding", ROLE_BINDING),
    (
        "rbac.authorization.k8s.io/v1",
        "ClusterRoleBinding",
        ROLE_BINDING,
    ),
    (
        "authorization.k8s.io/v1",
        "SelfSubjectAccessReview",
        SELF_SUBJECT_ACCESS_REVIEW,
    ),
    (
        "authorization.k8s.io/v1",
        "SelfSubjectRulesReview",
        SELF_SUBJECT_RULES_REVIEW,
    ),
    (
        "authentication.k8s.io/v1",
        "SelfSubjectReview",
        SELF_SUBJECT_REVIEW,
    ),
    ("authentication.k8s.io/v1", "TokenRequest", TOKEN_REQUEST),
];

/// Whether a Content-Type names Kubernetes protobuf.
pub fn is_protobuf(content_type: &str) -> bool {
    content_type
        .split(';')
        .next()
        .is_some_and(|m| m.trim() == "application/vnd.kubernetes.protobuf")
}

/// Decodes a protobuf request body into the JSON object it encodes.
pub fn decode(body: &[u8]) -> Result<Value, ProtoError> {
    let rest = body
        .strip_prefix(MAGIC)
        .ok_or_else(|| ProtoError("the protobuf body does not start with the k8s magic".into()))?;
    let mut api_version = String::new();
    let mut kind = String::new();
    let mut raw: &[u8] = &[];
    let mut r = Reader(rest);
    while let Some((num, wire)) = r.tag()? {
        match (num, wire) {
            (1, Wire::Len) => {
                let mut tm = Reader(r.bytes()?);
                while let Some((n, w)) = tm.tag()? {
                    match (n, w) {
                        (1, Wire::Len) => api_version = tm.string()?,
                        (2, Wire::Len) => kind = tm.string()?,
                        _ => {
                            tm.skip(w)?;
                        }
                    }
                }
            }
            (2, Wire::Len) => raw = r.bytes()?,
            (3 | 4, Wire::Len) => {
                let v = r.string()?;
                if !v.is_empty() {
                    return Err(ProtoError(format!(
                        "protobuf bodies with a content encoding or type ({v}) are not supported"
                    )));
                }
            }
            (_, w) => {
                r.skip(w)?;
            }
        }
    }
    let schema = KINDS
        .iter()
        .find(|(v, k, _)| *v == api_version && *k == kind)
        .map(|(_, _, s)| *s)
        .ok_or_else(|| {
            ProtoError(format!(
                "protobuf bodies of {kind} ({api_version}) are not supported by this server (only {}); send the object as JSON, e.g. `kubectl create ... --dry-run=client -o json | kubectl apply -f -`",
                KINDS.iter().map(|(_, k, _)| *k).collect::<Vec<_>>().join(", ")
            ))
        })?;
    let mut obj = message(raw, schema, &kind)?;
    obj.insert("apiVersion".into(), json!(api_version));
    obj.insert("kind".into(), json!(kind));
    // The server owns status; dropping what the client marshalled keeps defaulting exact.
    obj.remove("status");
    Ok(Value::Object(obj))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wire {
    Varint,
    I64,
    Len,
    I32,
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn varint(&mut self) -> Result<u64, ProtoError> {
        let mut v: u64 = 0;
        for i in 0..10 {
            let (&b, rest) = self
                .0
                .split_first()
                .ok_or_else(|| ProtoError("truncated protobuf varint".into()))?;
            self.0 = rest;
            v |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(ProtoError("protobuf varint longer than 10 bytes".into()))
    }

    fn tag(&mut self) -> Result<Option<(u64, Wire)>, ProtoError> {
        if self.0.is_empty() {
            return Ok(None);
        }
        let t = self.varint()?;
        let wire = match t & 7 {
            0 => Wire::Varint,
            1 => Wire::I64,
            2 => Wire::Len,
            5 => Wire::I32,
            w => return Err(ProtoError(format!("unsupported protobuf wire type {w}"))),
        };
        Ok(Some((t >> 3, wire)))
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], ProtoError> {
        if n > self.0.len() {
            return Err(ProtoError("truncated protobuf field".into()));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn bytes(&mut self) -> Result<&'a [u8], ProtoError> {
        let n = self.varint()?;
        self.take(usize::try_from(n).map_err(|_| ProtoError("oversized protobuf field".into()))?)
    }

    fn string(&mut self) -> Result<String, ProtoError> {
        let b = self.bytes()?;
        String::from_utf8(b.to_vec())
            .map_err(|_| ProtoError("a protobuf string is not valid UTF-8".into()))
    }

    /// Skips a field, returning whether it carried a non-zero value.
    fn skip(&mut self, wire: Wire) -> Result<bool, ProtoError> {
        Ok(match wire {
            Wire::Varint => self.varint()? != 0,
            Wire::I64 => self.take(8)?.iter().any(|b| *b != 0),
            Wire::I32 => self.take(4)?.iter().any(|b| *b != 0),
            Wire::Len => !self.bytes()?.is_empty(),
        })
    }
}

fn want(wire: Wire, expected: Wire, path: &str) -> Result<(), ProtoError> {
    if wire == expected {
        Ok(())
    } else {
        Err(ProtoError(format!(
            "protobuf field {path} has wire type {wire:?}, expected {expected:?}"
        )))
    }
}

/// A map entry {key = 1, value = 2}; `ty` says what the value is (a string, a quantity
/// message, or bytes, given back as base64).
fn map_entry(buf: &[u8], ty: Ty, path: &str) -> Result<(String, String), ProtoError> {
    let mut r = Reader(buf);
    let (mut k, mut v) = (String::new(), String::new());
    while let Some((n, w)) = r.tag()? {
        match (n, w) {
            (1, Wire::Len) => k = r.string()?,
            (2, Wire::Len) if matches!(ty, MapBytes) => {
                use base64::Engine;
                v = base64::engine::general_purpose::STANDARD.encode(r.bytes()?);
            }
            (2, Wire::Len) if matches!(ty, MapQuantity) => {
                // resource.Quantity {string = 1}
                let mut q = Reader(r.bytes()?);
                while let Some((qn, qw)) = q.tag()? {
                    match (qn, qw) {
                        (1, Wire::Len) => v = q.string()?,
                        _ => {
                            q.skip(qw)?;
                        }
                    }
                }
            }
            (2, Wire::Len) => v = r.string()?,
            _ => {
                return Err(ProtoError(format!("malformed map entry in {path}")));
            }
        }
    }
    Ok((k, v))
}

fn int_or_string(buf: &[u8]) -> Result<Value, ProtoError> {
    let mut r = Reader(buf);
    let (mut ty, mut i, mut s) = (0u64, 0i64, String::new());
    while let Some((n, w)) = r.tag()? {
        match (n, w) {
            (1, Wire::Varint) => ty = r.varint()?,
            // int32 is sign-extended to 64 bits on the wire.
            (2, Wire::Varint) => i = r.varint()? as i64,
            (3, Wire::Len) => s = r.string()?,
            _ => {
                r.skip(w)?;
            }
        }
    }
    Ok(if ty == 1 { json!(s) } else { json!(i) })
}

fn time(buf: &[u8]) -> Result<Option<Value>, ProtoError> {
    let mut r = Reader(buf);
    let mut secs = 0i64;
    while let Some((n, w)) = r.tag()? {
        match (n, w) {
            (1, Wire::Varint) => secs = r.varint()? as i64,
            _ => {
                r.skip(w)?;
            }
        }
    }
    if secs == 0 {
        return Ok(None);
    }
    let ts = jiff::Timestamp::from_second(secs)
        .map_err(|e| ProtoError(format!("invalid protobuf time {secs}: {e}")))?;
    Ok(Some(json!(ts.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())))
}

fn is_zero(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::String(s) => s.is_empty(),
        Value::Number(n) => n.as_i64() == Some(0),
        Value::Bool(b) => !b,
        Value::Object(m) => m.is_empty(),
        Value::Array(a) => a.is_empty(),
    }
}

fn message(buf: &[u8], schema: &[F], path: &str) -> Result<Map<String, Value>, ProtoError> {
    let mut out = Map::new();
    let mut r = Reader(buf);
    while let Some((num, wire)) = r.tag()? {
        let Some(field) = schema.iter().find(|x| x.num == num) else {
            if r.skip(wire)? {
                return Err(ProtoError(format!(
                    "protobuf field {num} of {path} is not supported by this server; send the object as JSON (kubectl apply -f)"
                )));
            }
            continue;
        };
        let fpath = format!("{path}.{}", field.name);
        let value = match field.ty {
            Str => {
                want(wire, Wire::Len, &fpath)?;
                json!(r.string()?)
            }
            Int => {
                want(wire, Wire::Varint, &fpath)?;
                json!(r.varint()? as i64)
            }
            Bool => {
                want(wire, Wire::Varint, &fpath)?;
                json!(r.varint()? != 0)
            }
            Msg(inner) => {
                want(wire, Wire::Len, &fpath)?;
                let idx = out
                    .get(field.name)
                    .and_then(Value::as_array)
                    .map_or(0, Vec::len);
                let p = if field.rep {
                    format!("{fpath}[{idx}]")
                } else {
                    fpath.clone()
                };
                Value::Object(message(r.bytes()?, inner, &p)?)
            }
            MapStr | MapQuantity | MapBytes => {
                want(wire, Wire::Len, &fpath)?;
                let (k, v) = map_entry(r.bytes()?, field.ty, &fpath)?;
                let entry = out.entry(field.name).or_insert_with(|| json!({}));
                if let Some(m) = entry.as_object_mut() {
                    m.insert(k, json!(v));
                }
                continue;
            }
            IntOrString => {
                want(wire, Wire::Len, &fpath)?;
                int_or_string(r.bytes()?)?
            }
            Time => {
                want(wire, Wire::Len, &fpath)?;
                match time(r.bytes()?)? {
                    Some(t) => t,
                    None => continue,
                }
            }
        };
        if field.rep {
            let entry = out.entry(field.name).or_insert_with(|| json!([]));
            if let Some(a) = entry.as_array_mut() {
                a.push(value);
            }
        } else if field.opt || !is_zero(&value) {
            out.insert(field.name.into(), value);
        }
    }
    Ok(out)
}

#[cfg(test)]
#[path = "protobuf_tests.rs"]
mod tests;
