//! Handlers of the verbs on resources: get, list, create, update, patch, delete.
//! (Watch lives in `watch.rs`.)

use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::{Value, json};
use svcnet_apimachinery::managed::Operation;
use svcnet_store::{Mutation, Outcome};

use crate::conversion;
use crate::deletion::{DeleteOptions, delete_one, delete_options};
use crate::machinery::{self, IncludeObject, Selectors};
use crate::objects::{self, finalizers, is_terminating, meta_str, name_of};
use crate::ownership::{self, Writer};
use crate::paging;
use crate::registry::{self, ResourceInfo};
use crate::request::{FieldValidation, ResourceRequest, Subresource, Verb};
use crate::state::SharedState;
use crate::status::ApiError;

/// How the client wants objects rendered (from the Accept header).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    Object,
    Table(IncludeObject),
    Metadata,
}

pub fn format(headers: &HeaderMap, include: Option<IncludeObject>) -> Format {
    let accept = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    // The first acceptable media type wins, as in upstream's negotiation.
    for part in accept.split(',') {
        if part.contains("as=Table") {
            return Format::Table(include.unwrap_or(IncludeObject::Metadata));
        }
        if part.contains("as=PartialObjectMetadata") {
            return Format::Metadata;
        }
        if part.trim_start().starts_with("application/json") || part.contains("*/*") {
            return Format::Object;
        }
    }
    Format::Object
}

/// A JSON response with optional `Warning` headers.
pub fn json_response(code: StatusCode, body: &Value, warnings: &[String]) -> Response {
    let mut resp = (code, body.to_string()).into_response();
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    for w in warnings {
        let text = format!("299 - {}", serde_json::Value::String(w.clone()));
        if let Ok(v) = HeaderValue::from_str(&text) {
            h.append(header::WARNING, v);
        }
    }
    resp
}

pub async fn handle(
    state: SharedState,
    req: ResourceRequest,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let mut body = body;
    if matches!(req.verb, Verb::Create | Verb::Update) {
        let ct = headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let media = ct
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        match media.as_str() {
            // A client that names no type sends JSON (kubectl, client-go and kube-rs name it).
            "" | "application/json" => {}
            "application/yaml" => {
                let obj = machinery::apply_configuration(&body)?;
                body = Bytes::from(obj.to_string());
            }
            _ if crate::protobuf::is_protobuf(ct) => {
                // kubectl's typed commands send protobuf; the rest of the server sees JSON.
                let obj = crate::protobuf::decode(&body)
                    .map_err(|e| ApiError::UnsupportedMediaType(e.to_string()))?;
                body = Bytes::from(obj.to_string());
            }
            _ => {
                return Err(ApiError::UnsupportedMediaType(format!(
                    "the body of the request was in an unknown format ({ct}) - accepted media types include: application/json, application/yaml, application/vnd.kubernetes.protobuf"
                )));
            }
        }
    }
    match req.verb {
        Verb::Get if req.subresource == Some(Subresource::Log) => {
            crate::logs::serve(state.clone(), req).await
        }
        Verb::Get => get(&state, &req, &headers).await,
        Verb::List => list(&state, &req, &headers).await,
        Verb::Watch => crate::watch::serve(state.clone(), req, &headers).await,
        Verb::Create => create(&state, &req, &headers, &body).await,
        Verb::Update => update(&state, &req, &headers, &body).await,
        Verb::Patch => patch(&state, &req, &headers, &body).await,
        Verb::Delete => delete(&state, &req, &body).await,
        Verb::DeleteCollection => delete_collection(&state, &req, &body).await,
        // Streams are served before bodies are read (see `exec`).
        Verb::Connect => Err(ApiError::MethodNotAllowed(
            "a stream cannot be served here".into(),
        )),
    }
}

fn name(req: &ResourceRequest) -> Result<&str, ApiError> {
    req.name
        .as_deref()
        .ok_or_else(|| ApiError::BadRequest("a resource name is required".into()))
}

fn key(req: &ResourceRequest, name: &str) -> String {
    req.resource.key(req.namespace.as_deref(), name)
}

/// Renders one stored object as the client asked (tables from the stored form, which their
/// columns read).
pub(crate) fn render_one(res: &ResourceInfo, obj: Value, fmt: Format) -> Value {
    match fmt {
        Format::Object => conversion::to_served(res, obj),
        Format::Metadata => objects::partial_metadata(&obj),
        Format::Table(include) => {
            let rv = meta_str(&obj, "resourceVersion").unwrap_or("").to_string();
            match machinery::to_table(res, std::slice::from_ref(&obj), include) {
                Some(mut t) => {
                    t["metadata"]["resourceVersion"] = json!(rv);
                    t
                }
                None => obj,
            }
        }
    }
}

async fn get(
    state: &SharedState,
    req: &ResourceRequest,
    headers: &HeaderMap,
) -> Result<Response, ApiError> {
    let res = req.resource;
    let name = name(req)?;
    let obj = state
        .store
        .get(&key(req, name))
        .await?
        .ok_or_else(|| ApiError::not_found(res, name))?;
    if req.subresource == Some(Subresource::Scale) {
        return Ok(json_response(StatusCode::OK, &objects::scale_of(&obj), &[]));
    }
    let fmt = format(headers, req.query.include_object);
    Ok(json_response(
        StatusCode::OK,
        &render_one(res, obj, fmt),
        &[],
    ))
}

pub(crate) fn selectors(req: &ResourceRequest) -> Result<Selectors, ApiError> {
    Selectors::parse(
        req.resource,
        req.query.label_selector.as_deref(),
        req.query.field_selector.as_deref(),
    )
}

async fn list(
    state: &SharedState,
    req: &ResourceRequest,
    headers: &HeaderMap,
) -> Result<Response, ApiError> {
    let res = req.resource;
    let sel = selectors(req)?;
    let q = &req.query;
    // What a continue token is bound to: the same resource, namespace and selectors.
    let scope = format!(
        "{}|{}|{}|{}",
        res.qualified(),
        req.namespace.as_deref().unwrap_or(""),
        q.label_selector.as_deref().unwrap_or(""),
        q.field_selector.as_deref().unwrap_or("")
    );
    let prefix = res.ns_prefix(req.namespace.as_deref());
    let filtered = q.label_selector.is_some() || q.field_selector.is_some();
    // Version "0" (any) without a token is answered whole, `limit` or not, as kube-apiserver's
    // watch cache answers it (client-go's informers list so).
    let any = q.resource_version.as_deref() == Some("0")
        && q.continue_token.is_none()
        && q.resource_version_match
            .as_deref()
            .is_none_or(|m| m.is_empty() || m == "NotOlderThan");
    let paged = !any && (q.continue_token.is_some() || q.limit.is_some_and(|l| l > 0));
    let mut page = if paged {
        read_page(state, res, q, &sel, &scope, &prefix, filtered).await?
    } else {
        let list = match (q.resource_version_match.as_deref(), list_version(q)?) {
            // The state exactly at that revision (410 once compacted).
            (Some("Exact"), Some(at)) => state.store.list_at(&prefix, at).await?,
            // Not older than: the current state, unless the store has not got there.
            (_, Some(at)) => {
                let list = state.store.list(&prefix).await?;
                not_older(list.revision, at)?;
                list
            }
            _ => state.store.list(&prefix).await?,
        };
        let items: Vec<Value> = list.items.into_iter().filter(|o| sel.matches(o)).collect();
        paging::page(&scope, list.revision, items, None, filtered, 0)
    };
    let (items, rv) = (
        std::mem::take(&mut page.items),
        page.resource_version.clone(),
    );
    let mut body = match format(headers, req.query.include_object) {
        Format::Table(include) => match machinery::to_table(res, &items, include) {
            Some(mut t) => {
                t["metadata"]["resourceVersion"] = json!(rv);
                t
            }
            None => plain_list(res, items, &rv),
        },
        Format::Metadata => json!({
            "kind": "PartialObjectMetadataList",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": {"resourceVersion": rv},
            "items": items.iter().map(objects::partial_metadata).collect::<Vec<_>>(),
        }),
        Format::Object => plain_list(
            res,
            items
                .into_iter()
                .map(|o| conversion::to_served(res, o))
                .collect(),
            &rv,
        ),
    };
    page.annotate(&mut body);
    Ok(json_response(StatusCode::OK, &body, &[]))
}

/// The list's `resourceVersion`, when it names one (not empty, not "0").
fn list_version(q: &crate::request::Query) -> Result<Option<u64>, ApiError> {
    match q.resource_version.as_deref() {
        Some(v) if !v.is_empty() && v != "0" => v.parse::<u64>().map(Some).map_err(|_| {
            ApiError::BadRequest(format!("invalid resourceVersion {v:?}: not a number"))
        }),
        _ => Ok(None),
    }
}

/// A list read at the latest revision (`current`) for a request "not older than" `at`: refused
/// while the store has not got there.
fn not_older(current: u64, at: u64) -> Result<(), ApiError> {
    if at > current {
        return Err(ApiError::TooLargeResourceVersion(format!(
            "Too large resource version: {at}, current: {current}"
        )));
    }
    Ok(())
}

/// The largest page read from the store while a selector filters a paged list (upstream's
/// etcd3 store grows its reads the same way, to 10,000).
const MAX_FILTERED_READ: usize = 10_000;

/// A list with `limit` or `continue`: pages read from the store at one revision, from the
/// token's key on, until `limit` objects match the selectors, so a page costs what it returns
/// rather than the whole list. A token's revision, once compacted, gets upstream's 410.
async fn read_page(
    state: &SharedState,
    res: &ResourceInfo,
    q: &crate::request::Query,
    sel: &Selectors,
    scope: &str,
    prefix: &str,
    filtered: bool,
) -> Result<paging::Page, ApiError> {
    let limit = q.limit.unwrap_or(0);
    let (mut revision, mut from, token, newer_than) = match &q.continue_token {
        Some(token) => {
            // As upstream: "0" (any version, which kube-rs watchers send on every page) may
            // come with a token; any other version may not.
            if q.resource_version
                .as_deref()
                .is_some_and(|v| !v.is_empty() && v != "0")
            {
                return Err(ApiError::BadRequest(
                    "specifying resource version is not allowed when using continue".into(),
                ));
            }
            let from = paging::decode(scope, token)?;
            let key = res.list_key(&from.start);
            (from.revision, key, Some(from), None)
        }
        None => match (q.resource_version_match.as_deref(), list_version(q)?) {
            (Some("Exact"), Some(at)) => (Some(at), prefix.to_string(), None, None),
            (_, at) => (None, prefix.to_string(), None, at),
        },
    };
    let mut items = Vec::new();
    let mut read = limit;
    loop {
        let chunk = match (
            state.store.list_page(prefix, &from, read, revision).await,
            &token,
        ) {
            (Err(svcnet_store::StoreError::Gone { .. }), Some(t)) => {
                return Err(paging::expired(scope, t));
            }
            (other, _) => other?,
        };
        if let Some(at) = newer_than.filter(|_| revision.is_none()) {
            not_older(chunk.revision, at)?;
        }
        revision = Some(chunk.revision);
        if let Some(last) = chunk.items.last() {
            from = format!("{}\u{0}", res.object_key(last));
        }
        items.extend(chunk.items.into_iter().filter(|o| sel.matches(o)));
        if limit == 0 || chunk.remaining == 0 || items.len() >= limit {
            return Ok(paging::page(
                scope,
                chunk.revision,
                items,
                Some(limit),
                filtered,
                chunk.remaining,
            ));
        }
        read = (read * 2).min(MAX_FILTERED_READ).max(limit);
    }
}

fn plain_list(res: &ResourceInfo, items: Vec<Value>, rv: &str) -> Value {
    json!({
        "kind": format!("{}List", res.kind),
        "apiVersion": res.api_version(),
        "metadata": {"resourceVersion": rv},
        "items": items,
    })
}

/// Unknown-field handling per `fieldValidation`: Strict refuses, Warn returns warnings.
pub(crate) fn check_fields(
    res: &ResourceInfo,
    obj: &Value,
    mode: FieldValidation,
) -> Result<Vec<String>, ApiError> {
    if mode == FieldValidation::Ignore {
        return Ok(Vec::new());
    }
    let unknown = machinery::unknown_fields(res, obj)?;
    if unknown.is_empty() {
        return Ok(Vec::new());
    }
    let list: Vec<String> = unknown
        .iter()
        .map(|f| format!("unknown field \"{f}\""))
        .collect();
    match mode {
        FieldValidation::Strict => Err(ApiError::BadRequest(format!(
            "{} in version \"{}\" cannot be handled as a {}: strict decoding error: {}",
            res.kind,
            res.version,
            res.kind,
            list.join(", ")
        ))),
        _ => Ok(list),
    }
}

async fn namespace_accepts(
    state: &SharedState,
    req: &ResourceRequest,
    name: &str,
) -> Result<(), ApiError> {
    let (true, Some(ns)) = (req.resource.namespaced, req.namespace.as_deref()) else {
        return Ok(());
    };
    let nsres = registry::lookup("", "v1", "namespaces")
        .ok_or_else(|| ApiError::Internal("namespaces are not registered".into()))?;
    // From the watch cache, as upstream's NamespaceLifecycle reads its informer's lister (a
    // namespace the cache does not hold yet is read from the store).
    match state.store.get_cached(&nsres.key(None, ns)).await? {
        None => Err(ApiError::not_found(nsres, ns)),
        Some(n) if is_terminating(&n) => Err(ApiError::Forbidden(format!(
            "{} \"{name}\" is forbidden: unable to create new content in namespace {ns} because it is being terminated",
            req.resource.qualified(),
        ))),
        Some(_) => Ok(()),
    }
}

async fn create(
    state: &SharedState,
    req: &ResourceRequest,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Response, ApiError> {
    let res = req.resource;
    let obj = objects::decode_body(res, body, res.kind)?;
    let warnings = check_fields(res, &obj, req.query.field_validation)?;
    let sent = ownership::sent_entries(res, &obj)?;
    let writer = Writer::new(req, headers, Operation::Update);
    let obj = objects::prepare_create(res, req.namespace.as_deref(), obj)?;
    let name = name_of(&obj).to_string();
    namespace_accepts(state, req, &name).await?;
    let st = state.clone();
    let n = name.clone();
    let outcome = state
        .write_new(res, &key(req, &name), req.query.dry_run, move |cur| {
            if cur.is_some() {
                return Err(ApiError::already_exists(res, &n));
            }
            let mut admitted = st.admission.admit_create(res, &n, obj.clone())?;
            writer.record_update(None, &mut admitted, sent.clone());
            Ok(Mutation::Put(admitted))
        })
        .await?;
    match outcome {
        Outcome::Written(o) => Ok(written(res, StatusCode::CREATED, &o, warnings)),
        other => Err(ApiError::Internal(format!(
            "create of {name}: unexpected {other:?}"
        ))),
    }
}

/// What a prepared update becomes: a delete once an object marked for immediate deletion
/// (grace 0) has no finalizers left, nothing when it changes nothing, otherwise a write. A pod
/// in its grace period stays until the node agent confirms (upstream's
/// `shouldDeleteDuringUpdate`).
fn finish(cur: &Value, next: Value) -> Mutation {
    let grace = next
        .pointer("/metadata/deletionGracePeriodSeconds")
        .and_then(Value::as_i64)
        .unwrap_or(0);
    if is_terminating(&next) && grace == 0 && finalizers(&next).is_empty() {
        return Mutation::Delete;
    }
    if objects::without_rv(&next) == objects::without_rv(cur) {
        return Mutation::Keep;
    }
    Mutation::Put(next)
}

fn outcome_object(outcome: Outcome, res: &ResourceInfo, name: &str) -> Result<Value, ApiError> {
    match outcome {
        Outcome::Written(o) | Outcome::Deleted(o) | Outcome::Unchanged(Some(o)) => Ok(o),
        Outcome::Unchanged(None) => Err(ApiError::not_found(res, name)),
    }
}

fn expect_kind(req: &ResourceRequest) -> &'static str {
    if req.subresource == Some(Subresource::Scale) {
        "Scale"
    } else {
        req.resource.kind
    }
}

async fn update(
    state: &SharedState,
    req: &ResourceRequest,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Response, ApiError> {
    let res = req.resource;
    let name = name(req)?.to_string();
    let incoming = objects::decode_body(res, body, expect_kind(req))?;
    let (warnings, sent) = if req.subresource.is_none() {
        (
            check_fields(res, &incoming, req.query.field_validation)?,
            ownership::sent_entries(res, &incoming)?,
        )
    } else {
        (Vec::new(), None)
    };
    let writer = Writer::new(req, headers, Operation::Update);
    let sub = req.subresource;
    let st = state.clone();
    let n = name.clone();
    let outcome = state
        .write(res, &key(req, &name), req.query.dry_run, move |cur| {
            let cur = cur.ok_or_else(|| ApiError::not_found(res, &n))?;
            let next = objects::prepare_update(res, sub, cur, incoming.clone())?;
            let status = sub == Some(Subresource::Status);
            let mut next = st.admission.admit_update(res, &n, cur, next, status)?;
            writer.record_update(Some(cur), &mut next, sent.clone());
            Ok(finish(cur, next))
        })
        .await?;
    let obj = outcome_object(outcome, res, &name)?;
    let obj = if sub == Some(Subresource::Scale) {
        objects::scale_of(&obj)
    } else {
        obj
    };
    Ok(written(res, StatusCode::OK, &obj, warnings))
}

/// The answer to a write: the object, the request's own warnings (unknown fields) and what
/// upstream's strategy warns about the written object (`svcnet_admission::warnings`).
fn written(
    res: &ResourceInfo,
    code: StatusCode,
    obj: &Value,
    mut warnings: Vec<String>,
) -> Response {
    warnings.extend(svcnet_admission::warnings(res.kind, obj));
    json_response(code, obj, &warnings)
}

/// A server-side apply of an object that does not exist creates it from the apply
/// configuration, as upstream does (`kubectl apply --server-side` of a new object).
fn create_by_apply(
    state: &SharedState,
    res: &'static ResourceInfo,
    namespace: Option<&str>,
    name: &str,
    applied: &Value,
    mode: FieldValidation,
    owner: (&Writer, bool),
) -> Result<(Value, Vec<String>), ApiError> {
    let (writer, force) = owner;
    let owned = writer.apply(res, None, applied, force)?;
    let bytes = serde_json::to_vec(applied)
        .map_err(|e| ApiError::Internal(format!("re-encoding an apply configuration: {e}")))?;
    let mut obj = objects::decode_body(res, &bytes, res.kind)?;
    match meta_str(&obj, "name") {
        None | Some("") => obj["metadata"]["name"] = json!(name),
        Some(n) if n == name => {}
        Some(n) => {
            return Err(ApiError::BadRequest(format!(
                "the name of the object ({n}) does not match the name on the URL ({name})"
            )));
        }
    }
    let warnings = check_fields(res, &obj, mode)?;
    let obj = objects::prepare_create(res, namespace, obj)?;
    let mut admitted = state.admission.admit_create(res, name, obj)?;
    ownership::carry(&owned, &mut admitted);
    Ok((admitted, warnings))
}

async fn patch(
    state: &SharedState,
    req: &ResourceRequest,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Response, ApiError> {
    let res = req.resource;
    let name = name(req)?.to_string();
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let body = body.to_vec();
    let sub = req.subresource;
    let mode = req.query.field_validation;
    let is_apply = machinery::is_apply(&content_type);
    if req.query.force && !is_apply {
        return Err(crate::request::options_invalid(
            "PatchOptions",
            "force",
            "Forbidden: may not be specified for non-apply patch".into(),
        ));
    }
    let mut config = None;
    if is_apply {
        // Server-side apply needs a manager and a configuration that names its version and
        // kind (upstream's apply patcher and field manager refuse it otherwise).
        if req.query.field_manager.as_deref().unwrap_or("").is_empty() {
            return Err(crate::request::options_invalid(
                "PatchOptions",
                "fieldManager",
                "Required value: is required for apply patch".into(),
            ));
        }
        let applied = machinery::apply_configuration(&body)?;
        let want = if sub == Some(Subresource::Scale) {
            "autoscaling/v1".to_string()
        } else {
            res.api_version()
        };
        let have = applied
            .get("apiVersion")
            .and_then(Value::as_str)
            .unwrap_or("");
        if have != want {
            return Err(ApiError::BadRequest(format!(
                "Incorrect version specified in apply patch. Specified patch version: {have}, expected: {want}"
            )));
        }
        if applied
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or("")
            .is_empty()
        {
            return Err(ApiError::BadRequest(
                "Object 'Kind' is missing in the apply configuration".into(),
            ));
        }
        ownership::check_apply_configuration(&applied)?;
        config = Some(applied);
    }
    let writer = Writer::new(
        req,
        headers,
        if is_apply {
            Operation::Apply
        } else {
            Operation::Update
        },
    );
    let force = req.query.force;
    let may_create = sub.is_none() && is_apply;
    if may_create && state.store.get(&key(req, &name)).await?.is_none() {
        namespace_accepts(state, req, &name).await?;
    }
    let warnings = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let warn_slot = warnings.clone();
    let created = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let created_slot = created.clone();
    let st = state.clone();
    let n = name.clone();
    let ns = req.namespace.clone();
    let outcome = state
        .write(res, &key(req, &name), req.query.dry_run, move |cur| {
            let cur = match cur {
                Some(c) => c,
                None if may_create => {
                    let applied = config.as_ref().ok_or_else(|| {
                        ApiError::Internal("an apply without its configuration".into())
                    })?;
                    let (obj, w) = create_by_apply(
                        &st,
                        res,
                        ns.as_deref(),
                        &n,
                        applied,
                        mode,
                        (&writer, force),
                    )?;
                    if let Ok(mut slot) = warn_slot.lock() {
                        *slot = w;
                    }
                    created_slot.store(true, std::sync::atomic::Ordering::SeqCst);
                    return Ok(Mutation::Put(obj));
                }
                None => return Err(ApiError::not_found(res, &n)),
            };
            created_slot.store(false, std::sync::atomic::Ordering::SeqCst);
            let view = if sub == Some(Subresource::Scale) {
                ownership::with_entries_of(cur, objects::scale_of(cur))
            } else {
                cur.clone()
            };
            let kind = if sub == Some(Subresource::Scale) {
                "Scale"
            } else {
                res.kind
            };
            let patched = match &config {
                Some(applied) => writer.apply(res, Some(&view), applied, force)?,
                None => machinery::apply_patch(res, kind, &view, &content_type, &body)?,
            };
            if !patched.is_object() {
                return Err(ApiError::BadRequest(
                    "the patch result is not an object".into(),
                ));
            }
            let mut sent = None;
            if sub.is_none() {
                let w = check_fields(res, &patched, mode)?;
                if let Ok(mut slot) = warn_slot.lock() {
                    *slot = w;
                }
                if config.is_none() {
                    sent = ownership::sent_entries(res, &patched)?;
                }
            }
            let next = objects::prepare_update(res, sub, cur, patched.clone())?;
            let status = sub == Some(Subresource::Status);
            let mut next = st.admission.admit_update(res, &n, cur, next, status)?;
            if config.is_some() {
                ownership::carry(&patched, &mut next);
            } else {
                writer.record_update(Some(cur), &mut next, sent);
            }
            Ok(finish(cur, next))
        })
        .await?;
    let obj = outcome_object(outcome, res, &name)?;
    let obj = if sub == Some(Subresource::Scale) {
        objects::scale_of(&obj)
    } else {
        obj
    };
    let warnings = warnings.lock().map(|w| w.clone()).unwrap_or_default();
    let code = if created.load(std::sync::atomic::Ordering::SeqCst) {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok(written(res, code, &obj, warnings))
}

async fn delete(
    state: &SharedState,
    req: &ResourceRequest,
    body: &[u8],
) -> Result<Response, ApiError> {
    let res = req.resource;
    let name = name(req)?.to_string();
    let opts = delete_options(req, body)?;
    let outcome = delete_one(state, res, req.namespace.as_deref(), &name, &opts).await?;
    if let (Outcome::Deleted(obj), Some("Orphan"), false) =
        (&outcome, opts.propagation.as_deref(), opts.dry_run)
    {
        crate::gc::orphan_dependents(state, obj).await;
    }
    let obj = outcome_object(outcome, res, &name)?;
    Ok(json_response(StatusCode::OK, &obj, &[]))
}

async fn delete_collection(
    state: &SharedState,
    req: &ResourceRequest,
    body: &[u8],
) -> Result<Response, ApiError> {
    let res = req.resource;
    let opts = delete_options(req, body)?;
    let sel = selectors(req)?;
    let list = state
        .store
        .list(&res.ns_prefix(req.namespace.as_deref()))
        .await?;
    let each = DeleteOptions {
        uid: None,
        resource_version: None,
        ..opts.clone()
    };
    let targets: Vec<&Value> = list.items.iter().filter(|o| sel.matches(o)).collect();
    // All or nothing: a collection delete that would refuse one object deletes none.
    for obj in &targets {
        crate::deletion::precheck(res, obj, &each)?;
    }
    let mut deleted = Vec::new();
    for obj in targets {
        let ns = meta_str(obj, "namespace").map(str::to_string);
        match delete_one(state, res, ns.as_deref(), name_of(obj), &each).await {
            Ok(o) => deleted.push(outcome_object(o, res, name_of(obj))?),
            Err(ApiError::NotFound { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    let rv = state.store.current_revision().await?.to_string();
    Ok(json_response(
        StatusCode::OK,
        &plain_list(res, deleted, &rv),
        &[],
    ))
}
