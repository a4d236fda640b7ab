//! Parsing an HTTP request into a typed [`ApiRequest`] before anything is dispatched.

use axum::http::{Method, Uri};

use crate::registry::{self, ResourceInfo};
use crate::status::ApiError;

/// Every request the server understands.
#[derive(Debug)]
pub enum ApiRequest {
    /// `/healthz`, `/livez`, `/readyz` (and their sub-checks).
    Probe,
    /// `/version`
    Version,
    /// `/api`
    CoreVersions,
    /// `/apis`
    GroupList,
    /// `/apis/{group}`
    Group(String),
    /// `/api/v1`, `/apis/{group}/{version}`
    ResourceList { group: String, version: String },
    /// `/openapi/v3`
    OpenApiIndex,
    /// `/metrics` (Prometheus text format)
    Metrics,
    /// `/openapi/v3/api/v1`, `/openapi/v3/apis/{group}/{version}`
    OpenApiGroupVersion { group: String, version: String },
    /// `POST /apis/authorization.k8s.io/v1/selfsubject{access,rules}reviews` (`kubectl auth
    /// can-i`): `rules` for the list of rules (`--list`).
    SelfReview { rules: bool },
    /// `POST /apis/authentication.k8s.io/v1/selfsubjectreviews` (`kubectl auth whoami`).
    SelfSubjectReview,
    /// `POST /api/v1/namespaces/{ns}/serviceaccounts/{name}/token` (`kubectl create token`).
    TokenRequest { namespace: String, name: String },
    /// An operation on objects.
    Resource(Box<ResourceRequest>),
}

/// A verb on a resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    Get,
    List,
    Watch,
    Create,
    Update,
    Patch,
    Delete,
    DeleteCollection,
    /// A stream into an object (`pods/exec`): GET or POST, upgraded to a WebSocket.
    Connect,
}

/// A served subresource.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subresource {
    Status,
    Scale,
    /// `pods/log`: a container's output, read-only.
    Log,
    /// `pods/exec`: a process in a container, streamed.
    Exec,
    /// `pods/portforward`: connections to the pod's ports, streamed over SPDY.
    PortForward,
    /// `pods/attach`: a container's running process, streamed.
    Attach,
}

impl Subresource {
    /// A stream the client upgrades the request into (GET or POST, no body).
    pub fn is_stream(self) -> bool {
        matches!(
            self,
            Subresource::Exec | Subresource::PortForward | Subresource::Attach
        )
    }
}

/// The query of a `pods/exec` request (`PodExecOptions`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExecQuery {
    pub command: Vec<String>,
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
    pub tty: bool,
}

/// The query of a `pods/log` request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogQuery {
    pub container: Option<String>,
    pub previous: bool,
    pub follow: bool,
    pub tail_lines: Option<u64>,
    pub limit_bytes: Option<u64>,
    pub timestamps: bool,
    /// `sinceSeconds`, as given (validated by the log subresource).
    pub since_seconds: Option<i64>,
    /// `sinceTime`, as given (RFC 3339).
    pub since_time: Option<String>,
}

/// How strictly unknown fields are treated (`fieldValidation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FieldValidation {
    Ignore,
    #[default]
    Warn,
    Strict,
}

/// The query parameters the server acts on.
#[derive(Debug, Clone, Default)]
pub struct Query {
    pub label_selector: Option<String>,
    pub field_selector: Option<String>,
    pub resource_version: Option<String>,
    /// `resourceVersionMatch` of a list: `Exact` or `NotOlderThan` (validated in [`parse`]).
    pub resource_version_match: Option<String>,
    /// `limit` of a list (0: no limit).
    pub limit: Option<usize>,
    /// `continue` of a list: the token of its next page.
    pub continue_token: Option<String>,
    pub timeout_seconds: Option<u64>,
    pub allow_watch_bookmarks: bool,
    pub send_initial_events: bool,
    pub field_validation: FieldValidation,
    /// `dryRun=All`: validate and answer, persist nothing. Only ever true when every `dryRun`
    /// value given is `All` (the request is refused otherwise, see [`parse`]).
    pub dry_run: bool,
    /// Every `dryRun` value given, in order, for the refusal of values other than `All`.
    pub dry_run_values: Vec<String>,
    /// `fieldManager` of a write (required for server-side apply).
    pub field_manager: Option<String>,
    /// `force` of a server-side apply: take ownership of conflicting fields.
    pub force: bool,
    pub propagation_policy: Option<String>,
    /// `gracePeriodSeconds` of a DELETE.
    pub grace_period_seconds: Option<i64>,
    /// `includeObject` for Table output.
    pub include_object: Option<crate::machinery::IncludeObject>,
    /// `pods/log` parameters.
    pub log: LogQuery,
    /// `pods/exec` parameters (its `container` is `log.container`).
    pub exec: ExecQuery,
}

/// An operation on one resource collection or object.
#[derive(Debug, Clone)]
pub struct ResourceRequest {
    pub verb: Verb,
    pub resource: &'static ResourceInfo,
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub subresource: Option<Subresource>,
    pub query: Query,
}

fn not_found() -> ApiError {
    ApiError::NoRoute
}

fn parse_query(uri: &Uri) -> Result<Query, ApiError> {
    let pairs: Vec<(String, String)> = match uri.query() {
        None => Vec::new(),
        Some(q) => serde_urlencoded_pairs(q)?,
    };
    let mut query = Query::default();
    let truthy = |v: &str| v == "true" || v == "1";
    for (k, v) in pairs {
        match k.as_str() {
            "labelSelector" if !v.is_empty() => query.label_selector = Some(v),
            "fieldSelector" if !v.is_empty() => query.field_selector = Some(v),
            "resourceVersion" => query.resource_version = Some(v),
            "resourceVersionMatch" if !v.is_empty() => query.resource_version_match = Some(v),
            "limit" => {
                query.limit = Some(usize::try_from(non_negative(&k, &v)?).unwrap_or(usize::MAX))
            }
            "continue" if !v.is_empty() => query.continue_token = Some(v),
            "timeoutSeconds" => {
                query.timeout_seconds =
                    Some(v.parse().map_err(|_| {
                        ApiError::BadRequest(format!("invalid timeoutSeconds {v:?}"))
                    })?)
            }
            "allowWatchBookmarks" => query.allow_watch_bookmarks = truthy(&v),
            "sendInitialEvents" => query.send_initial_events = truthy(&v),
            "fieldValidation" => {
                query.field_validation = match v.as_str() {
                    "Strict" => FieldValidation::Strict,
                    "Warn" | "" => FieldValidation::Warn,
                    "Ignore" => FieldValidation::Ignore,
                    other => {
                        return Err(ApiError::BadRequest(format!(
                            "fieldValidation must be one of Ignore, Warn, Strict; got {other:?}"
                        )));
                    }
                }
            }
            "dryRun" => query.dry_run_values.push(v),
            "fieldManager" => query.field_manager = Some(v),
            "force" => query.force = truthy(&v),
            "propagationPolicy" => query.propagation_policy = Some(v),
            "gracePeriodSeconds" => {
                query.grace_period_seconds = Some(v.parse().map_err(|_| {
                    ApiError::BadRequest(format!("invalid gracePeriodSeconds {v:?}"))
                })?)
            }
            "includeObject" => {
                query.include_object = crate::machinery::IncludeObject::parse(&v);
            }
            "container" if !v.is_empty() => query.log.container = Some(v),
            "command" => query.exec.command.push(v),
            "stdin" => query.exec.stdin = truthy(&v),
            "stdout" => query.exec.stdout = truthy(&v),
            "stderr" => query.exec.stderr = truthy(&v),
            "tty" => query.exec.tty = truthy(&v),
            "previous" => query.log.previous = truthy(&v),
            "follow" => query.log.follow = truthy(&v),
            "timestamps" => query.log.timestamps = truthy(&v),
            "tailLines" => query.log.tail_lines = Some(non_negative(&k, &v)?),
            "limitBytes" => query.log.limit_bytes = Some(non_negative(&k, &v)?),
            "sinceSeconds" => {
                query.log.since_seconds = Some(v.parse().map_err(|_| {
                    ApiError::BadRequest(format!("invalid sinceSeconds {v:?}: not an integer"))
                })?)
            }
            "sinceTime" if !v.is_empty() => query.log.since_time = Some(v),
            "watch" if truthy(&v) => {} // handled by the caller
            _ => {}
        }
    }
    query.dry_run =
        !query.dry_run_values.is_empty() && query.dry_run_values.iter().all(|v| v == "All");
    Ok(query)
}

/// The options kind upstream validates a verb's query against (`CreateOptions`, ...).
fn options_kind(verb: Verb) -> Option<&'static str> {
    match verb {
        Verb::Create => Some("CreateOptions"),
        Verb::Update => Some("UpdateOptions"),
        Verb::Patch => Some("PatchOptions"),
        Verb::Delete | Verb::DeleteCollection => Some("DeleteOptions"),
        Verb::Get | Verb::List | Verb::Watch | Verb::Connect => None,
    }
}

/// upstream's `ValidateListOptions` for `resourceVersionMatch`.
fn validate_list_options(verb: Verb, q: &Query) -> Result<(), ApiError> {
    let Some(m) = q.resource_version_match.as_deref() else {
        return Ok(());
    };
    let rv = q.resource_version.as_deref().unwrap_or("");
    let message = if !matches!(m, "Exact" | "NotOlderThan") {
        format!("Unsupported value: {m:?}: supported values: \"Exact\", \"NotOlderThan\", \"\"")
    } else if verb == Verb::Watch && !(m == "NotOlderThan" && q.send_initial_events) {
        "Forbidden: resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided".into()
    } else if rv.is_empty() {
        "Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided".into()
    } else if q.continue_token.is_some() {
        "Forbidden: resourceVersionMatch is forbidden when continue is provided".into()
    } else if m == "Exact" && rv == "0" {
        "Forbidden: resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"".into()
    } else {
        return Ok(());
    };
    Err(options_invalid(
        "ListOptions",
        "resourceVersionMatch",
        message,
    ))
}

/// upstream's `ValidateFieldManager`: at most 128 bytes, printable characters only.
pub(crate) fn validate_field_manager(kind: &str, manager: &str) -> Result<(), ApiError> {
    const MAX: usize = 128;
    let message = if manager.len() > MAX {
        format!("Too long: may not be more than {MAX} bytes")
    } else if let Some((i, c)) = manager.chars().enumerate().find(|(_, c)| c.is_control()) {
        format!(
            "Invalid value: {manager:?}: invalid character {:?} (at position {i})",
            c
        )
    } else {
        return Ok(());
    };
    Err(options_invalid(kind, "fieldManager", message))
}

/// A 422 on a verb's options (`CreateOptions`, ...), as upstream's handlers give it. The
/// cause's reason follows from the message's error type, as upstream's `field.ErrorType`
/// names both (`Unsupported value` is `FieldValueNotSupported`, ...).
pub(crate) fn options_invalid(kind: &str, field: &str, message: String) -> ApiError {
    let reason = [
        ("Too long", "FieldValueTooLong"),
        ("Required value", "FieldValueRequired"),
        ("Unsupported value", "FieldValueNotSupported"),
        ("Forbidden", "FieldValueForbidden"),
    ]
    .iter()
    .find(|(text, _)| message.starts_with(text))
    .map_or("FieldValueInvalid", |(_, reason)| reason);
    ApiError::Invalid {
        kind: kind.into(),
        group: "meta.k8s.io".into(),
        name: String::new(),
        message: format!("{kind}.meta.k8s.io \"\" is invalid: {field}: {message}"),
        causes: vec![crate::status::Cause {
            reason: reason.into(),
            field: field.into(),
            message,
        }],
    }
}

/// upstream's `ValidateDryRun`: every value must be `All`; anything else (`true` is the common
/// mistake) is a 422 on the verb's options, and nothing is written.
pub(crate) fn validate_dry_run(kind: &str, values: &[String]) -> Result<(), ApiError> {
    if values.iter().all(|v| v == "All") {
        return Ok(());
    }
    let quoted: Vec<String> = values.iter().map(|v| format!("{v:?}")).collect();
    let message = format!(
        "Unsupported value: []string{{{}}}: supported values: \"All\"",
        quoted.join(", ")
    );
    Err(options_invalid(kind, "dryRun", message))
}

fn non_negative(key: &str, v: &str) -> Result<u64, ApiError> {
    v.parse().map_err(|_| {
        ApiError::BadRequest(format!("{key} must be a non-negative integer, got {v:?}"))
    })
}

fn serde_urlencoded_pairs(q: &str) -> Result<Vec<(String, String)>, ApiError> {
    let uri: Uri = format!("/?{q}")
        .parse()
        .map_err(|_| ApiError::BadRequest("malformed query string".into()))?;
    axum::extract::Query::<Vec<(String, String)>>::try_from_uri(&uri)
        .map(|q| q.0)
        .map_err(|e| ApiError::BadRequest(format!("malformed query string: {e}")))
}

fn is_watch_param(uri: &Uri) -> bool {
    uri.query()
        .and_then(|q| serde_urlencoded_pairs(q).ok())
        .is_some_and(|pairs| {
            pairs
                .iter()
                .any(|(k, v)| k == "watch" && (v == "true" || v == "1"))
        })
}

/// Parses a request line into an [`ApiRequest`].
pub fn parse(method: &Method, uri: &Uri) -> Result<ApiRequest, ApiError> {
    let path = uri.path();
    let inner = path.strip_prefix('/').unwrap_or(path);
    // A trailing slash after a collection is a named route with an empty name (a script's
    // unset variable): it must never reach a collection verb.
    let (inner, trailing_slash) = match inner.strip_suffix('/') {
        Some(rest) => (rest, true),
        None => (inner, false),
    };
    let segs: Vec<&str> = if inner.is_empty() {
        Vec::new()
    } else {
        inner.split('/').collect()
    };
    if segs.iter().any(|s| s.is_empty()) {
        return Err(not_found());
    }
    match segs.as_slice() {
        ["healthz" | "livez" | "readyz", ..] => return Ok(ApiRequest::Probe),
        ["version"] => return Ok(ApiRequest::Version),
        ["metrics"] => return Ok(ApiRequest::Metrics),
        ["openapi", "v3"] => return Ok(ApiRequest::OpenApiIndex),
        ["openapi", "v3", "api", "v1"] => {
            return Ok(ApiRequest::OpenApiGroupVersion {
                group: String::new(),
                version: "v1".into(),
            });
        }
        ["openapi", "v3", "apis", g, v] => {
            return Ok(ApiRequest::OpenApiGroupVersion {
                group: g.to_string(),
                version: v.to_string(),
            });
        }
        ["apis", "authorization.k8s.io", "v1", review]
            if method == Method::POST
                && matches!(
                    *review,
                    "selfsubjectaccessreviews" | "selfsubjectrulesreviews"
                ) =>
        {
            return Ok(ApiRequest::SelfReview {
                rules: *review == "selfsubjectrulesreviews",
            });
        }
        ["apis", "authentication.k8s.io", "v1", "selfsubjectreviews"] if method == Method::POST => {
            return Ok(ApiRequest::SelfSubjectReview);
        }
        [
            "api",
            "v1",
            "namespaces",
            ns,
            "serviceaccounts",
            name,
            "token",
        ] if method == Method::POST => {
            return Ok(ApiRequest::TokenRequest {
                namespace: ns.to_string(),
                name: name.to_string(),
            });
        }
        ["api"] => return Ok(ApiRequest::CoreVersions),
        ["apis"] => return Ok(ApiRequest::GroupList),
        ["api", "v1"] => {
            return Ok(ApiRequest::ResourceList {
                group: String::new(),
                version: "v1".into(),
            });
        }
        ["apis", g] => return Ok(ApiRequest::Group(g.to_string())),
        ["apis", g, v] => {
            return Ok(ApiRequest::ResourceList {
                group: g.to_string(),
                version: v.to_string(),
            });
        }
        _ => {}
    }
    let (group, version, rest) = match segs.as_slice() {
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return Err(not_found()),
    };
    let (legacy_watch, rest) = match rest {
        ["watch", rest @ ..] => (true, rest),
        _ => (false, rest),
    };
    // `namespaces/{ns}/{resource}...` unless `{resource}` is not a namespaced plural here (then
    // it is the `namespaces` resource itself, e.g. `namespaces/{name}/status`).
    let (namespace, rest) = match rest {
        ["namespaces", ns, plural, tail @ ..]
            if registry::lookup(group, version, plural).is_some_and(|r| r.namespaced) =>
        {
            (Some(ns.to_string()), {
                let mut v = vec![*plural];
                v.extend_from_slice(tail);
                v
            })
        }
        other => (None, other.to_vec()),
    };
    let (plural, name, sub) = match rest.as_slice() {
        [plural] => (*plural, None, None),
        [plural, name] => (*plural, Some(name.to_string()), None),
        [plural, name, sub] => (*plural, Some(name.to_string()), Some(*sub)),
        _ => return Err(not_found()),
    };
    let resource = registry::lookup(group, version, plural).ok_or_else(not_found)?;
    if namespace.is_some() && !resource.namespaced {
        return Err(not_found());
    }
    let subresource = match sub {
        None => None,
        Some(s) if resource.subresources.contains(&s) => Some(match s {
            "status" => Subresource::Status,
            "log" => Subresource::Log,
            "exec" => Subresource::Exec,
            "portforward" => Subresource::PortForward,
            "attach" => Subresource::Attach,
            _ => Subresource::Scale,
        }),
        Some(_) => return Err(not_found()),
    };
    let watch = legacy_watch || is_watch_param(uri);
    if trailing_slash && name.is_none() && matches!(method.as_str(), "DELETE" | "PUT" | "PATCH") {
        return Err(ApiError::BadRequest("name must be provided".into()));
    }
    let verb = match (method.as_str(), &name) {
        ("GET" | "POST", Some(_)) if subresource.is_some_and(Subresource::is_stream) => {
            Verb::Connect
        }
        ("GET", _) if watch => Verb::Watch,
        ("GET", Some(_)) => Verb::Get,
        ("GET", None) => Verb::List,
        ("POST", None) => Verb::Create,
        ("PUT", Some(_)) => Verb::Update,
        ("PATCH", Some(_)) => Verb::Patch,
        ("DELETE", Some(_)) => Verb::Delete,
        ("DELETE", None) if resource.allows("deletecollection") => Verb::DeleteCollection,
        (m, _) => {
            return Err(ApiError::MethodNotAllowed(format!(
                "the server does not allow this method on the requested resource ({m} {path})"
            )));
        }
    };
    let allowed = match subresource {
        None => true,
        Some(Subresource::Log) => verb == Verb::Get,
        Some(s) if s.is_stream() => verb == Verb::Connect,
        Some(_) => matches!(verb, Verb::Get | Verb::Update | Verb::Patch),
    };
    if !allowed {
        return Err(ApiError::MethodNotAllowed(format!(
            "the server does not allow this method on the requested resource ({method} {path})"
        )));
    }
    if resource.namespaced && namespace.is_none() && !matches!(verb, Verb::List | Verb::Watch) {
        return Err(not_found());
    }
    let mut query = parse_query(uri)?;
    if matches!(verb, Verb::List | Verb::Watch) {
        validate_list_options(verb, &query)?;
    }
    if let Some(kind) = options_kind(verb) {
        validate_dry_run(kind, &query.dry_run_values)?;
        if let Some(m) = &query.field_manager
            && verb != Verb::Delete
            && verb != Verb::DeleteCollection
        {
            validate_field_manager(kind, m)?;
        }
    }
    // A watch on a single object (`/watch/.../{name}`) is a watch with a name field selector.
    if verb == Verb::Watch
        && let Some(n) = &name
    {
        let sel = format!("metadata.name={n}");
        query.field_selector = Some(match query.field_selector.take() {
            Some(existing) => format!("{existing},{sel}"),
            None => sel,
        });
    }
    Ok(ApiRequest::Resource(Box::new(ResourceRequest {
        verb,
        resource,
        namespace,
        name: if verb == Verb::Watch { None } else { name },
        subresource,
        query,
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(method: &str, uri: &str) -> Result<ApiRequest, ApiError> {
        parse(&method.parse().unwrap(), &uri.parse().unwrap())
    }

    fn res(method: &str, uri: &str) -> ResourceRequest {
        match p(method, uri) {
            Ok(ApiRequest::Resource(r)) => *r,
            other => panic!("{uri}: {other:?}"),
        }
    }

    #[test]
    fn parses_resource_paths() {
        let r = res("GET", "/api/v1/namespaces/default/services/web");
        assert_eq!((r.verb, r.resource.plural), (Verb::Get, "services"));
        assert_eq!(
            (r.namespace.as_deref(), r.name.as_deref()),
            (Some("default"), Some("web"))
        );

        let r = res("GET", "/api/v1/namespaces/kube-system");
        assert_eq!(
            (r.verb, r.resource.plural, r.name.as_deref()),
            (Verb::Get, "namespaces", Some("kube-system"))
        );

        let r = res("PUT", "/api/v1/namespaces/kube-system/status");
        assert_eq!(
            (r.verb, r.subresource),
            (Verb::Update, Some(Subresource::Status))
        );

        let r = res(
            "GET",
            "/api/v1/pods?watch=true&resourceVersion=5&labelSelector=app%3Dweb",
        );
        assert_eq!((r.verb, r.namespace), (Verb::Watch, None));
        assert_eq!(r.query.label_selector.as_deref(), Some("app=web"));
        assert_eq!(r.query.resource_version.as_deref(), Some("5"));

        let r = res("GET", "/apis/apps/v1/watch/namespaces/ns/deployments/d");
        assert_eq!(r.verb, Verb::Watch);
        assert_eq!(r.query.field_selector.as_deref(), Some("metadata.name=d"));

        let r = res(
            "PATCH",
            "/apis/apps/v1/namespaces/ns/deployments/d/scale?fieldValidation=Strict",
        );
        assert_eq!(
            (r.verb, r.subresource),
            (Verb::Patch, Some(Subresource::Scale))
        );
        assert_eq!(r.query.field_validation, FieldValidation::Strict);

        let r = res(
            "GET",
            "/api/v1/namespaces/ns/pods/p/log?container=c&follow=true&tailLines=3&previous=1",
        );
        assert_eq!((r.verb, r.subresource), (Verb::Get, Some(Subresource::Log)));
        assert_eq!(
            r.query.log,
            LogQuery {
                container: Some("c".into()),
                previous: true,
                follow: true,
                tail_lines: Some(3),
                ..Default::default()
            }
        );

        let r = res(
            "DELETE",
            "/apis/discovery.k8s.io/v1/namespaces/ns/endpointslices",
        );
        assert_eq!(r.verb, Verb::DeleteCollection);
    }

    #[test]
    fn rejects_unknown_and_misplaced() {
        assert!(matches!(
            p("GET", "/api/v1/widgets"),
            Err(ApiError::NoRoute)
        ));
        assert!(matches!(
            p("GET", "/api/v1/namespaces/x/nodes/n"),
            Err(ApiError::NoRoute)
        ));
        assert!(matches!(
            p("GET", "/api/v1/namespaces/x/services/a/b/c"),
            Err(ApiError::NoRoute)
        ));
        assert!(matches!(
            p("GET", "/api/v1/namespaces/x/services/a/scale"),
            Err(ApiError::NoRoute)
        ));
        assert!(matches!(
            p("POST", "/api/v1/namespaces/x/services/a"),
            Err(ApiError::MethodNotAllowed(_))
        ));
        assert!(matches!(
            p("POST", "/api/v1/services"),
            Err(ApiError::NoRoute)
        ));
        assert!(matches!(
            p("GET", "/api/v1/pods?timeoutSeconds=x"),
            Err(ApiError::BadRequest(_))
        ));
        assert!(matches!(p("GET", "/nope"), Err(ApiError::NoRoute)));
        assert!(matches!(
            p("PUT", "/api/v1/namespaces/x/pods/a/log"),
            Err(ApiError::MethodNotAllowed(_))
        ));
        assert!(matches!(
            p("GET", "/api/v1/namespaces/x/pods/a/log?tailLines=-1"),
            Err(ApiError::BadRequest(_))
        ));
    }

    #[test]
    fn parses_discovery() {
        assert!(matches!(p("GET", "/api"), Ok(ApiRequest::CoreVersions)));
        assert!(matches!(p("GET", "/apis"), Ok(ApiRequest::GroupList)));
        assert!(matches!(
            p("GET", "/apis/apps/v1"),
            Ok(ApiRequest::ResourceList { .. })
        ));
        assert!(matches!(
            p("GET", "/openapi/v3/apis/apps/v1"),
            Ok(ApiRequest::OpenApiGroupVersion { .. })
        ));
        assert!(matches!(p("GET", "/readyz"), Ok(ApiRequest::Probe)));
    }
}
