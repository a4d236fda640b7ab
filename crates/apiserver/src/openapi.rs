//! The OpenAPI v3 documents (`/openapi/v3` and one per group-version), valid OpenAPI 3.0 for
//! schema-driven tools and client generators, laid out as kube-apiserver's: every path
//! parameter declared, list operations with their query parameters returning the `…List`
//! kind, writes with `dryRun`/`fieldManager`/`fieldValidation`, PATCH bodies in the patch
//! media types with upstream's `Patch` schema, DELETE bodies `DeleteOptions`, and the
//! `status`, `scale` and `log` subresources, the streams (`exec`, `attach`, `portforward`) as
//! `connect` operations, and the deprecated `/watch/` paths upstream still lists (served for old
//! clients). kubectl reads them to learn that the server validates fields itself
//! (`fieldValidation` on PATCH) and for `kubectl explain`.

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::sync::LazyLock;

use serde_json::{Map, Value, json};

use crate::discovery::GIT_VERSION;
use crate::openapi_schemas::{self, DELETE_OPTIONS, PATCH, SCALE, STATUS, schema_ref};
use crate::registry::{self, RESOURCES, ResourceInfo};
use crate::status::ApiError;

fn gv_path(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

/// Every group-version's document, built once, with a hash of its content (kubectl caches a
/// document by its URL, so the URL changes when the document does).
static DOCUMENTS: LazyLock<BTreeMap<String, (Value, String)>> = LazyLock::new(|| {
    registry::group_versions()
        .into_iter()
        .filter_map(|(g, v)| {
            let doc = build(g, v).ok()?;
            let mut h = std::collections::hash_map::DefaultHasher::new();
            doc.to_string().hash(&mut h);
            Some((gv_path(g, v), (doc, format!("{:016x}", h.finish()))))
        })
        .collect()
});

/// `/openapi/v3`: where each group-version's document is.
pub fn index() -> Value {
    let paths: Map<String, Value> = DOCUMENTS
        .iter()
        .map(|(p, (_, hash))| {
            (
                p.clone(),
                json!({"serverRelativeURL": format!("/openapi/v3/{p}?hash={hash}")}),
            )
        })
        .collect();
    json!({"paths": paths})
}

/// The OpenAPI v3 document of one group-version.
pub fn group_version(group: &str, version: &str) -> Result<Value, ApiError> {
    DOCUMENTS
        .get(&gv_path(group, version))
        .map(|(doc, _)| doc.clone())
        .ok_or(ApiError::NoRoute)
}

fn param(name: &str, location: &str, schema: Value, description: &str) -> Value {
    let mut p = json!({"name": name, "in": location, "description": description, "schema": schema});
    if location == "path" {
        p["required"] = json!(true);
    }
    p
}

fn string() -> Value {
    json!({"type": "string", "uniqueItems": true})
}
fn boolean() -> Value {
    json!({"type": "boolean", "uniqueItems": true})
}
fn integer() -> Value {
    json!({"type": "integer", "uniqueItems": true})
}

fn q(name: &str, schema: Value, description: &str) -> Value {
    param(name, "query", schema, description)
}

/// The query parameters of a list (and of a watch, with `watch=true`).
fn list_params() -> Vec<Value> {
    vec![
        q(
            "allowWatchBookmarks",
            boolean(),
            "Asks a watch for BOOKMARK events (the server may send them).",
        ),
        q(
            "continue",
            string(),
            "The token of the next page of a paged list.",
        ),
        q(
            "fieldSelector",
            string(),
            "Restricts the list by the objects' fields.",
        ),
        q(
            "labelSelector",
            string(),
            "Restricts the list by the objects' labels.",
        ),
        q(
            "limit",
            integer(),
            "The most items one page of the list returns.",
        ),
        q(
            "resourceVersion",
            string(),
            "Which state of the store the list or watch starts from.",
        ),
        q(
            "resourceVersionMatch",
            string(),
            "How resourceVersion applies to a list: Exact or NotOlderThan.",
        ),
        q(
            "sendInitialEvents",
            boolean(),
            "With watch: the current state as ADDED events first.",
        ),
        q(
            "timeoutSeconds",
            integer(),
            "How long a list or watch may take.",
        ),
        q("watch", boolean(), "Watch for changes instead of listing."),
    ]
}

/// The query parameters of a write (create, update, patch).
fn write_params() -> Vec<Value> {
    vec![
        q(
            "dryRun",
            string(),
            "All: validate and answer, persist nothing. No other value is accepted.",
        ),
        q(
            "fieldManager",
            string(),
            "The name of the actor making the change (at most 128 characters).",
        ),
        q(
            "fieldValidation",
            string(),
            "Ignore, Warn or Strict: how unknown or duplicate fields are treated.",
        ),
    ]
}

/// The query parameters of a delete.
fn delete_params() -> Vec<Value> {
    vec![
        q(
            "dryRun",
            string(),
            "All: validate and answer, persist nothing. No other value is accepted.",
        ),
        q(
            "gracePeriodSeconds",
            integer(),
            "Seconds the object has to terminate; 0 deletes at once.",
        ),
        q(
            "orphanDependents",
            boolean(),
            "Deprecated: use propagationPolicy.",
        ),
        q(
            "propagationPolicy",
            string(),
            "Orphan, Background or Foreground: what happens to dependents.",
        ),
    ]
}

fn json_content(schema: Value) -> Value {
    json!({"application/json": {"schema": schema}})
}

fn responses(codes: &[&str], schema: &Value) -> Value {
    let mut r: Map<String, Value> = codes
        .iter()
        .map(|c| {
            (
                c.to_string(),
                json!({"description": http_reason(c), "content": json_content(schema.clone())}),
            )
        })
        .collect();
    r.insert("401".into(), json!({"description": "Unauthorized"}));
    Value::Object(r)
}

fn http_reason(code: &str) -> &'static str {
    match code {
        "201" => "Created",
        "202" => "Accepted",
        _ => "OK",
    }
}

/// The name a kind's operations carry: `CoreV1`, `AppsV1`, `DiscoveryV1`.
fn gv_title(group: &str, version: &str) -> String {
    let group = group.split('.').next().unwrap_or("");
    let group = if group.is_empty() { "core" } else { group };
    capitalized(group) + &capitalized(version)
}

/// One operation.
struct Op {
    action: &'static str,
    id: String,
    params: Vec<Value>,
    body: Option<Value>,
    responses: Value,
    /// The group-version-kind the operation works on (`autoscaling/v1 Scale` for `scale`).
    gvk: Value,
}

impl Op {
    fn render(self) -> Value {
        let mut o = json!({
            "operationId": self.id,
            "x-kubernetes-action": self.action,
            "x-kubernetes-group-version-kind": self.gvk,
            "responses": self.responses,
        });
        if !self.params.is_empty() {
            o["parameters"] = Value::Array(self.params);
        }
        if let Some(b) = self.body {
            o["requestBody"] = b;
        }
        o
    }
}

fn body(schema: &Value, types: &[&str], required: bool) -> Value {
    let content: Map<String, Value> = types
        .iter()
        .map(|t| (t.to_string(), json!({"schema": schema})))
        .collect();
    json!({"content": content, "required": required})
}

/// The media types a write accepts. Protobuf bodies are read only for some kinds, so they are
/// not promised here.
const WRITE_TYPES: &[&str] = &["application/json", "application/yaml"];

/// Strategic merge patch is deliberately not listed: kubectl then computes its patches from
/// its compiled-in types (with their merge keys) instead of from these schemas, which carry
/// none.
const PATCH_TYPES: &[&str] = &[
    "application/apply-patch+yaml",
    "application/json-patch+json",
    "application/merge-patch+json",
];

/// Builds the document of one group-version.
fn build(group: &str, version: &str) -> Result<Value, ApiError> {
    let resources: Vec<&ResourceInfo> = RESOURCES
        .iter()
        .filter(|r| r.group == group && r.version == version)
        .collect();
    if resources.is_empty() {
        return Err(ApiError::NoRoute);
    }
    let comps = openapi_schemas::components(group, version);
    let title = gv_title(group, version);
    let mut paths = Map::new();
    for r in resources {
        let Some((kind_schema, list_schema)) = comps.kinds.get(r.kind) else {
            continue;
        };
        let (obj, list) = (schema_ref(kind_schema), schema_ref(list_schema));
        let gvk = json!({"group": r.group, "version": r.version, "kind": r.kind});
        let base = format!("/{}", gv_path(r.group, r.version));
        let scope = if r.namespaced { "Namespaced" } else { "" };
        let (collection, mut path_params) = if r.namespaced {
            (
                format!("{base}/namespaces/{{namespace}}/{}", r.plural),
                vec![param(
                    "namespace",
                    "path",
                    string(),
                    "The object's namespace.",
                )],
            )
        } else {
            (format!("{base}/{}", r.plural), Vec::new())
        };
        let op = |action, verb: &str, sub: &str, params, body, responses| Op {
            action,
            id: format!("{verb}{title}{scope}{}{sub}", r.kind),
            params,
            body,
            responses,
            gvk: gvk.clone(),
        };
        // GET, PUT and PATCH of one object as `schema`: the object itself, its status, its
        // scale (whose operations name another kind, `gvk`).
        let read_replace_patch = |sub: &str, schema: &Value, gvk: Option<Value>| {
            let kind = |mut o: Op| {
                if let Some(gvk) = &gvk {
                    o.gvk = gvk.clone();
                }
                o
            };
            let get = op(
                "get",
                "read",
                sub,
                Vec::new(),
                None,
                responses(&["200"], schema),
            );
            let put = op(
                "put",
                "replace",
                sub,
                write_params(),
                Some(body(schema, WRITE_TYPES, true)),
                responses(&["200", "201"], schema),
            );
            let patch = op(
                "patch",
                "patch",
                sub,
                Vec::new(),
                None,
                responses(&["200", "201"], schema),
            );
            let mut item = Map::new();
            item.insert("get".into(), kind(get).render());
            item.insert("put".into(), kind(put).render());
            item.insert("patch".into(), patch_op(kind(patch)));
            item
        };
        let mut item = Map::new();
        item.insert("parameters".into(), Value::Array(path_params.clone()));
        item.insert(
            "get".into(),
            op(
                "list",
                "list",
                "",
                list_params(),
                None,
                responses(&["200"], &list),
            )
            .render(),
        );
        if r.allows("create") {
            let create = op(
                "post",
                "create",
                "",
                write_params(),
                Some(body(&obj, WRITE_TYPES, true)),
                responses(&["200", "201", "202"], &obj),
            );
            item.insert("post".into(), create.render());
        }
        if r.allows("deletecollection") {
            let mut params = list_params();
            params.extend(delete_params());
            params.retain(|p| p["name"] != "watch" && p["name"] != "allowWatchBookmarks");
            let dc = op(
                "deletecollection",
                "deleteCollection",
                "",
                params,
                Some(body(
                    &schema_ref(DELETE_OPTIONS),
                    &["application/json"],
                    false,
                )),
                responses(&["200"], &list),
            );
            item.insert("delete".into(), dc.render());
        }
        paths.insert(collection.clone(), Value::Object(item));

        // Every namespace's objects at once.
        if r.namespaced {
            let all = Op {
                action: "list",
                id: format!("list{title}{}ForAllNamespaces", r.kind),
                params: list_params(),
                body: None,
                responses: responses(&["200"], &list),
                gvk: gvk.clone(),
            };
            paths.insert(format!("{base}/{}", r.plural), json!({"get": all.render()}));
        }

        path_params.insert(0, param("name", "path", string(), "The object's name."));
        let named = format!("{collection}/{{name}}");
        let mut item = read_replace_patch("", &obj, None);
        item.insert("parameters".into(), Value::Array(path_params.clone()));
        item.insert(
            "delete".into(),
            op(
                "delete",
                "delete",
                "",
                delete_params(),
                Some(body(
                    &schema_ref(DELETE_OPTIONS),
                    &["application/json"],
                    false,
                )),
                responses(&["200", "202"], &obj),
            )
            .render(),
        );
        paths.insert(named.clone(), Value::Object(item));

        // The deprecated `/watch/` paths (a watch of a collection, of every namespace's, and
        // of one object), which upstream still lists and old clients still use.
        let watch_base = format!("{base}/watch");
        let relative = |p: &str| p.trim_start_matches(&base).to_string();
        let mut watch_params = list_params();
        watch_params.retain(|p| p["name"] != "watch");
        let watches = [
            (
                format!("{watch_base}{}", relative(&collection)),
                "watchlist",
                format!("watch{title}{scope}{}List", r.kind),
                &path_params[1..],
            ),
            (
                format!("{watch_base}{}", relative(&named)),
                "watch",
                format!("watch{title}{scope}{}", r.kind),
                &path_params[..],
            ),
        ];
        let all_namespaces = r.namespaced.then(|| {
            (
                format!("{watch_base}/{}", r.plural),
                "watchlist",
                format!("watch{title}{}ListForAllNamespaces", r.kind),
                &path_params[..0],
            )
        });
        for (path, action, id, declared) in watches.into_iter().chain(all_namespaces) {
            let watch = Op {
                action,
                id,
                params: watch_params.clone(),
                body: None,
                responses: responses(&["200"], &schema_ref(WATCH_EVENT)),
                gvk: gvk.clone(),
            };
            paths.insert(path, json!({"parameters": declared, "get": watch.render()}));
        }

        for sub in r.subresources {
            let item = match *sub {
                "status" => read_replace_patch("Status", &obj, None),
                "scale" => read_replace_patch(
                    "Scale",
                    &schema_ref(SCALE),
                    Some(json!({"group": "autoscaling", "version": "v1", "kind": "Scale"})),
                ),
                "log" => {
                    let mut item = Map::new();
                    let log = Op {
                        action: "get",
                        id: format!("read{title}{scope}{}Log", r.kind),
                        params: log_params(),
                        body: None,
                        responses: json!({
                            "200": {"description": "OK", "content": {"text/plain": {"schema": {"type": "string"}}}},
                            "401": {"description": "Unauthorized"},
                        }),
                        gvk: gvk.clone(),
                    };
                    item.insert("get".into(), log.render());
                    item
                }
                // Streams upgraded to WebSocket or SPDY: upstream's `connect` operations, GET
                // and POST, answering a stream of bytes.
                "exec" | "attach" | "portforward" => {
                    let (options, params) = connect_params(sub);
                    let mut item = Map::new();
                    for (method, verb) in [("get", "Get"), ("post", "Post")] {
                        let connect = Op {
                            action: "connect",
                            id: format!(
                                "connect{title}{verb}{scope}{}{}",
                                r.kind,
                                capitalized(sub)
                            ),
                            params: params.clone(),
                            body: None,
                            responses: json!({
                                "200": {"description": "OK", "content": {"*/*": {"schema": {"type": "string"}}}},
                                "401": {"description": "Unauthorized"},
                            }),
                            gvk: json!({"group": "", "version": "v1", "kind": options}),
                        };
                        item.insert(method.into(), connect.render());
                    }
                    item
                }
                _ => continue,
            };
            let mut item = item;
            item.insert("parameters".into(), Value::Array(path_params.clone()));
            paths.insert(format!("{named}/{sub}"), Value::Object(item));
        }
    }
    let mut schemas = comps.schemas;
    // Every document names the error body its operations may return.
    schemas
        .entry(STATUS.to_string())
        .or_insert_with(|| json!({"type": "object"}));
    schemas.entry(WATCH_EVENT.to_string()).or_insert_with(|| {
        json!({
            "description": "Event represents a single event to a watched resource.",
            "type": "object",
            "required": ["type", "object"],
            "properties": {
                "type": {"type": "string", "default": ""},
                "object": {
                    "description": "The object: the changed object for ADDED, MODIFIED and DELETED, a Status for ERROR, an object carrying only a resourceVersion for BOOKMARK.",
                    "type": "object",
                },
            },
            "x-kubernetes-group-version-kind": [{"group": "", "kind": "WatchEvent", "version": "v1"}],
        })
    });
    Ok(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": GIT_VERSION},
        "paths": paths,
        "components": {"schemas": schemas},
    }))
}

/// A PATCH: its body is a patch in one of [`PATCH_TYPES`] (upstream's `Patch` schema), and it
/// lists `fieldValidation` (which tells kubectl that the server validates fields) and `force`.
fn patch_op(mut op: Op) -> Value {
    let mut params = write_params();
    params.push(q(
        "force",
        boolean(),
        "Apply only: take over fields other managers own.",
    ));
    op.params = params;
    op.body = Some(body(&schema_ref(PATCH), PATCH_TYPES, true));
    op.render()
}

/// The schema of a watch's events.
const WATCH_EVENT: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.WatchEvent";

/// `exec` → `Exec`, as upstream's operation ids spell a subresource.
fn capitalized(s: &str) -> String {
    let mut c = s.chars();
    c.next()
        .map(|f| f.to_uppercase().chain(c).collect())
        .unwrap_or_default()
}

/// The options kind and query parameters of a stream subresource of pods.
fn connect_params(sub: &str) -> (&'static str, Vec<Value>) {
    let streams = || {
        vec![
            q("container", string(), "The container to connect to."),
            q("stderr", boolean(), "Redirect the standard error stream."),
            q("stdin", boolean(), "Redirect the standard input stream."),
            q("stdout", boolean(), "Redirect the standard output stream."),
            q("tty", boolean(), "Allocate a terminal."),
        ]
    };
    match sub {
        "exec" => {
            let mut params = vec![q(
                "command",
                string(),
                "The command to run; repeated once per argument.",
            )];
            params.extend(streams());
            ("PodExecOptions", params)
        }
        "attach" => ("PodAttachOptions", streams()),
        _ => (
            "PodPortForwardOptions",
            vec![q("ports", integer(), "The pod's ports to forward.")],
        ),
    }
}

/// The query parameters of `pods/log`.
fn log_params() -> Vec<Value> {
    vec![
        q("container", string(), "The container whose output to read."),
        q("follow", boolean(), "Stream the output as it is written."),
        q("limitBytes", integer(), "The most bytes to return."),
        q(
            "previous",
            boolean(),
            "The previous instance of the container.",
        ),
        q("sinceSeconds", integer(), "Only output this recent."),
        q(
            "sinceTime",
            string(),
            "Only output since this time (RFC 3339).",
        ),
        q("tailLines", integer(), "Only the last lines."),
        q("timestamps", boolean(), "Prefix each line with its time."),
    ]
}
