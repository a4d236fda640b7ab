//! Who is asking, and may they: authentication (client certificates, ServiceAccount bearer
//! tokens), impersonation, and RBAC authorization, run on every request before it is served.
//!
//! The HTTPS front ([`crate::server`]) verifies client certificates and attaches a [`Peer`]
//! to each request; [`check`] turns it (or the request's bearer token) into a [`UserInfo`],
//! applies `Impersonate-*` headers, derives the request's [`rbac::Attributes`] and asks the
//! authorizer. A request without a [`Peer`] comes from in-process code that was handed the
//! router ([`crate::router`]) and is trusted as `system:masters`.
//!
//! **Architecture Invariant:** members of `system:masters` bypass RBAC (upstream's
//! privileged-group authorizer); everyone else gets exactly what RBAC bindings grant.

pub(crate) mod bootstrap;
pub(crate) mod escalation;
pub(crate) mod rbac;
pub(crate) mod reviews;
pub(crate) mod serviceaccounts;
pub(crate) mod tokens;

use std::collections::BTreeMap;

use axum::http::HeaderMap;
use axum::http::request::Parts;
use tokio_util::sync::CancellationToken;

use crate::request::ApiRequest;
use crate::state::SharedState;
use crate::status::ApiError;

/// The group whose members may do everything.
pub const MASTERS: &str = "system:masters";
/// Every authenticated user's group.
pub const AUTHENTICATED: &str = "system:authenticated";

/// An authenticated user, as upstream's `user.Info`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct UserInfo {
    pub name: String,
    pub uid: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

impl UserInfo {
    /// In-process callers of the router: trusted as the cluster's administrator.
    fn in_process() -> UserInfo {
        UserInfo {
            name: "system:apiserver".into(),
            groups: vec![MASTERS.into(), AUTHENTICATED.into()],
            ..Default::default()
        }
    }

    pub fn is_master(&self) -> bool {
        self.groups.iter().any(|g| g == MASTERS)
    }

    /// The user as the `userInfo` of a `SelfSubjectReview`.
    pub fn to_json(&self) -> serde_json::Value {
        let mut v = serde_json::json!({"username": self.name, "groups": self.groups});
        if !self.uid.is_empty() {
            v["uid"] = self.uid.clone().into();
        }
        if !self.extra.is_empty() {
            v["extra"] = serde_json::json!(self.extra);
        }
        v
    }
}

/// What the TLS layer learned about a request's connection: the verified client
/// certificate's user (if any), and a token to cancel when a bearer token authenticated the
/// request (so the connection is no longer held to the limits of unauthenticated ones).
#[derive(Debug, Clone)]
pub struct Peer {
    pub cert_user: Option<UserInfo>,
    pub promote: CancellationToken,
}

/// The user a client certificate names: CN the user name, each O a group (upstream's x509
/// authenticator), plus `system:authenticated`.
pub fn user_from_cert(der: &[u8]) -> Option<UserInfo> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let subject = cert.subject();
    let name = subject
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())?
        .to_string();
    let mut groups: Vec<String> = subject
        .iter_organization()
        .filter_map(|o| o.as_str().ok().map(str::to_string))
        .collect();
    groups.push(AUTHENTICATED.into());
    Some(UserInfo {
        name,
        groups,
        ..Default::default()
    })
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    let v = headers
        .get(axum::http::header::AUTHORIZATION)?
        .to_str()
        .ok()?;
    let (scheme, token) = v.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

/// Whether a request carries a bearer token (the TLS front lets such requests through on a
/// connection without a client certificate).
pub fn has_bearer(headers: &HeaderMap) -> bool {
    bearer(headers).is_some()
}

/// Authenticates the request: its certificate's user, else its bearer token's; 401 when
/// neither holds.
pub(crate) async fn authenticate(state: &SharedState, parts: &Parts) -> Result<UserInfo, ApiError> {
    let Some(peer) = parts.extensions.get::<Peer>() else {
        return Ok(UserInfo::in_process());
    };
    if let Some(user) = &peer.cert_user {
        return Ok(user.clone());
    }
    let token = bearer(&parts.headers).ok_or(ApiError::Unauthorized)?;
    let user = state.tokens.authenticate(state, token).await.map_err(|e| {
        tracing::debug!("bearer token refused: {e}");
        ApiError::Unauthorized
    })?;
    peer.promote.cancel();
    Ok(user)
}

/// Authenticates, impersonates and authorizes one request; the user it runs as.
pub(crate) async fn check(
    state: &SharedState,
    parts: &Parts,
    parsed: &ApiRequest,
) -> Result<UserInfo, ApiError> {
    if matches!(parsed, ApiRequest::Probe) {
        // Health probes are public (upstream's `system:public-info-viewer`), also for
        // clients without any credential.
        return Ok(UserInfo::default());
    }
    let user = authenticate(state, parts).await?;
    let user = impersonate(state, user, &parts.headers).await?;
    let attrs = rbac::Attributes::of(&user, &parts.method, parts.uri.path(), parsed);
    rbac::authorize(state, &attrs).await?;
    Ok(user)
}

/// upstream's impersonation filter: `Impersonate-User` (with optional `Impersonate-Group`,
/// `Impersonate-Uid` and `Impersonate-Extra-*`) replaces the user, once the real user may
/// `impersonate` each of them.
async fn impersonate(
    state: &SharedState,
    user: UserInfo,
    headers: &HeaderMap,
) -> Result<UserInfo, ApiError> {
    // A value that is not text is refused, never skipped: skipping an `Impersonate-User`
    // would run the request as the real user.
    let values = |name: &str| -> Result<Vec<String>, ApiError> {
        headers
            .get_all(name)
            .iter()
            .map(|v| {
                v.to_str().map(str::to_string).map_err(|_| {
                    ApiError::BadRequest(format!("the {name} header is not valid text"))
                })
            })
            .collect()
    };
    let groups = values("impersonate-group")?;
    let uid = values("impersonate-uid")?;
    let mut extra: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (name, v) in headers {
        if let Some(key) = name.as_str().strip_prefix("impersonate-extra-") {
            let v = v.to_str().map_err(|_| {
                ApiError::BadRequest(format!("the {name} header is not valid text"))
            })?;
            extra
                .entry(percent_decode(key))
                .or_default()
                .push(v.to_string());
        }
    }
    let Some(name) = values("impersonate-user")?.into_iter().next() else {
        if !groups.is_empty() || !uid.is_empty() || !extra.is_empty() {
            return Err(ApiError::BadRequest(
                "requested impersonation of groups, uid or extra without impersonating a user"
                    .into(),
            ));
        }
        return Ok(user);
    };
    let mut wanted = vec![];
    let sa = tokens::parse_service_account_user(&name);
    wanted.push(match &sa {
        Some((ns, sa_name)) => {
            rbac::Attributes::impersonate(&user, "", "serviceaccounts", Some(ns), sa_name)
        }
        None => rbac::Attributes::impersonate(&user, "", "users", None, &name),
    });
    for g in &groups {
        wanted.push(rbac::Attributes::impersonate(&user, "", "groups", None, g));
    }
    for u in &uid {
        wanted.push(rbac::Attributes::impersonate(
            &user,
            "authentication.k8s.io",
            "uids",
            None,
            u,
        ));
    }
    for (key, vals) in &extra {
        for v in vals {
            wanted.push(rbac::Attributes::impersonate(
                &user,
                "authentication.k8s.io",
                &format!("userextras/{key}"),
                None,
                v,
            ));
        }
    }
    for attrs in &wanted {
        rbac::authorize(state, attrs).await?;
    }
    let mut new_groups = groups.clone();
    if groups.is_empty()
        && let Some((ns, _)) = &sa
    {
        new_groups.extend(tokens::service_account_groups(ns));
    }
    if name != "system:anonymous" && !new_groups.iter().any(|g| g == AUTHENTICATED) {
        new_groups.push(AUTHENTICATED.into());
    }
    Ok(UserInfo {
        name,
        uid: uid.into_iter().next().unwrap_or_default(),
        groups: new_groups,
        extra,
    })
}

/// The body of a request on one of the authentication kinds (`TokenRequest`, the reviews):
/// protobuf as kubectl sends it, or JSON; an empty body is an empty object.
pub(crate) fn decode_body(kind: &str, body: &[u8]) -> Result<serde_json::Value, ApiError> {
    let cannot = |why: String| {
        ApiError::BadRequest(format!(
            "{kind} in version \"v1\" cannot be handled as a {kind}: {why}"
        ))
    };
    let v: serde_json::Value = if body.starts_with(crate::protobuf::MAGIC) {
        crate::protobuf::decode(body).map_err(|e| ApiError::UnsupportedMediaType(e.to_string()))?
    } else if body.is_empty() {
        serde_json::json!({})
    } else {
        serde_json::from_slice(body).map_err(|e| cannot(e.to_string()))?
    };
    if !v.is_object() {
        return Err(cannot("not an object".into()));
    }
    Ok(v)
}

/// A list of strings at `field` of a JSON object (empty when absent).
pub(crate) fn string_list(v: &serde_json::Value, field: &str) -> Vec<String> {
    v.get(field)
        .and_then(serde_json::Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(serde_json::Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// `%XX` escapes of an `Impersonate-Extra-` header name's key.
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let Ok(b) = u8::from_str_radix(&s[i + 1..i + 3], 16)
        {
            out.push(b);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}
