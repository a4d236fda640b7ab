//! ServiceAccount tokens: upstream's bound tokens (ES256 JWTs signed with `pki/sa.key`),
//! issued by the `TokenRequest` API (`serviceaccounts/token`, what `kubectl create token`
//! calls) and validated on every request that carries one: signature, issuer, audience,
//! expiry, and that the ServiceAccount (and the pod a token is bound to) still exists with the
//! uid the token names.

use std::path::Path;

use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::Digest;

use super::{AUTHENTICATED, UserInfo};
use crate::objects::{is_terminating, meta_str};
use crate::registry;
use crate::state::SharedState;
use crate::status::{ApiError, Cause};

/// The shortest and longest lifetimes a TokenRequest may ask for (upstream's validation).
pub const MIN_EXPIRATION_SECONDS: i64 = 600;
pub const MAX_EXPIRATION_SECONDS: i64 = 1 << 32;
/// The lifetime of a token whose request names none (the v1 default).
pub const DEFAULT_EXPIRATION_SECONDS: i64 = 3600;
/// Clock skew tolerated on `exp` and `nbf` (upstream's `jwt.DefaultLeeway`).
pub const LEEWAY_SECONDS: u64 = 60;

/// Why a bearer token does not authenticate (logged; the client sees only 401).
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("invalid token: {0}")]
    Invalid(#[from] jsonwebtoken::errors::Error),
    #[error("the token's {what} {name:?} does not exist (or has another uid)")]
    Revoked { what: &'static str, name: String },
    #[error("token subject {0:?} is not a service account")]
    Subject(String),
    #[error("store: {0}")]
    Store(String),
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ObjectRef {
    pub name: String,
    pub uid: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct KubernetesClaims {
    pub namespace: String,
    pub serviceaccount: ObjectRef,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<ObjectRef>,
}

/// The claims of a bound ServiceAccount token, as upstream writes them.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Claims {
    pub aud: Vec<String>,
    pub exp: i64,
    pub iat: i64,
    pub iss: String,
    pub jti: String,
    #[serde(rename = "kubernetes.io")]
    pub kubernetes: KubernetesClaims,
    pub nbf: i64,
    pub sub: String,
}

/// The signing key and what tokens are checked against.
pub struct Tokens {
    encoding: EncodingKey,
    decoding: DecodingKey,
    kid: String,
    /// `iss` of every token, and the API server's audience.
    pub issuer: String,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokens")
            .field("kid", &self.kid)
            .field("issuer", &self.issuer)
            .finish()
    }
}

/// `system:serviceaccount:<ns>:<name>`.
pub fn service_account_user(namespace: &str, name: &str) -> String {
    format!("system:serviceaccount:{namespace}:{name}")
}

/// The namespace and name of a ServiceAccount user name.
pub fn parse_service_account_user(user: &str) -> Option<(String, String)> {
    let rest = user.strip_prefix("system:serviceaccount:")?;
    let (ns, name) = rest.split_once(':')?;
    (!ns.is_empty() && !name.is_empty() && !name.contains(':')).then(|| (ns.into(), name.into()))
}

/// The groups of every ServiceAccount of `namespace` (without `system:authenticated`).
pub fn service_account_groups(namespace: &str) -> Vec<String> {
    vec![
        "system:serviceaccounts".into(),
        format!("system:serviceaccounts:{namespace}"),
    ]
}

fn key_err(path: &Path, e: impl std::fmt::Display) -> crate::ServerError {
    crate::ServerError::Pki(format!("{}: {e}", path.display()))
}

impl Tokens {
    /// Loads `pki/sa.key` from the data dir, creating it (ECDSA P-256, PKCS#8 PEM, mode 0600)
    /// on first start.
    pub fn load_or_create(
        data_dir: &Path,
        cluster_domain: &str,
    ) -> Result<Tokens, crate::ServerError> {
        let dir = data_dir.join("pki");
        std::fs::create_dir_all(&dir).map_err(|e| key_err(&dir, e))?;
        let path = dir.join("sa.key");
        let pair = match std::fs::read_to_string(&path) {
            Ok(pem) => rcgen::KeyPair::from_pem(&pem).map_err(|e| key_err(&path, e))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let pair = rcgen::KeyPair::generate().map_err(|e| key_err(&path, e))?;
                write_private(&path, &pair.serialize_pem()).map_err(|e| key_err(&path, e))?;
                pair
            }
            Err(e) => return Err(key_err(&path, e)),
        };
        if pair.algorithm() != &rcgen::PKCS_ECDSA_P256_SHA256 {
            return Err(key_err(
                &path,
                "the service account key must be an ECDSA P-256 key",
            ));
        }
        let public = pair.public_key_raw().to_vec();
        // upstream's key id: the unpadded base64url SHA-256 of the public key.
        let kid = base64::Engine::encode(
            &base64::engine::general_purpose::URL_SAFE_NO_PAD,
            sha2::Sha256::digest(rcgen::PublicKeyData::subject_public_key_info(&pair)),
        );
        Ok(Tokens {
            encoding: EncodingKey::from_ec_der(&pair.serialize_der()),
            decoding: DecodingKey::from_ec_der(&public),
            kid,
            issuer: format!("https://kubernetes.default.svc.{cluster_domain}"),
        })
    }

    /// Signs `claims`.
    pub fn sign(&self, claims: &Claims) -> Result<String, ApiError> {
        let mut header = Header::new(Algorithm::ES256);
        header.kid = Some(self.kid.clone());
        jsonwebtoken::encode(&header, claims, &self.encoding)
            .map_err(|e| ApiError::Internal(format!("signing a token: {e}")))
    }

    /// Checks signature, issuer, audience and time of a token; its claims.
    pub fn verify(&self, token: &str) -> Result<Claims, TokenError> {
        let mut v = Validation::new(Algorithm::ES256);
        v.set_issuer(&[&self.issuer]);
        v.set_audience(&[&self.issuer]);
        v.set_required_spec_claims(&["exp", "iss", "aud", "sub", "nbf"]);
        v.validate_nbf = true;
        v.leeway = LEEWAY_SECONDS;
        Ok(jsonwebtoken::decode::<Claims>(token, &self.decoding, &v)?.claims)
    }

    /// Authenticates a bearer token: a valid token of a ServiceAccount (and pod) that still
    /// exists.
    pub async fn authenticate(
        &self,
        state: &SharedState,
        token: &str,
    ) -> Result<UserInfo, TokenError> {
        let claims = self.verify(token)?;
        let k = &claims.kubernetes;
        let (ns, name) = parse_service_account_user(&claims.sub)
            .filter(|(ns, name)| *ns == k.namespace && *name == k.serviceaccount.name)
            .ok_or_else(|| TokenError::Subject(claims.sub.clone()))?;
        let live = |res: &'static str, name: &str, uid: &str| {
            let name = name.to_string();
            let uid = uid.to_string();
            let ns = ns.clone();
            async move {
                let info = registry::lookup("", "v1", res)
                    .ok_or_else(|| TokenError::Store(format!("{res} are not registered")))?;
                let obj = state
                    .store
                    .get(&info.key(Some(&ns), &name))
                    .await
                    .map_err(|e| TokenError::Store(e.to_string()))?;
                match obj {
                    Some(o)
                        if meta_str(&o, "uid") == Some(uid.as_str()) && !deleted_long_ago(&o) =>
                    {
                        Ok(())
                    }
                    _ => Err(TokenError::Revoked {
                        what: if res == "pods" {
                            "pod"
                        } else {
                            "service account"
                        },
                        name: format!("{ns}/{name}"),
                    }),
                }
            }
        };
        live("serviceaccounts", &name, &k.serviceaccount.uid).await?;
        let mut extra = std::collections::BTreeMap::new();
        if let Some(pod) = &k.pod {
            live("pods", &pod.name, &pod.uid).await?;
            extra.insert(
                "authentication.kubernetes.io/pod-name".into(),
                vec![pod.name.clone()],
            );
            extra.insert(
                "authentication.kubernetes.io/pod-uid".into(),
                vec![pod.uid.clone()],
            );
        }
        if !claims.jti.is_empty() {
            extra.insert(
                "authentication.kubernetes.io/credential-id".into(),
                vec![format!("JTI={}", claims.jti)],
            );
        }
        let mut groups = service_account_groups(&ns);
        groups.push(AUTHENTICATED.into());
        Ok(UserInfo {
            name: claims.sub.clone(),
            uid: k.serviceaccount.uid.clone(),
            groups,
            extra,
        })
    }
}

/// Whether `obj` was deleted more than the token leeway ago, upstream's test for a token's
/// ServiceAccount and pod: a pod's deletionTimestamp is the end of its grace period, so a
/// terminating pod keeps its credentials while it shuts down (and releases what it holds).
fn deleted_long_ago(obj: &serde_json::Value) -> bool {
    let Some(at) = obj
        .pointer("/metadata/deletionTimestamp")
        .and_then(|v| v.as_str())
    else {
        return false;
    };
    match at.parse::<jiff::Timestamp>() {
        Ok(at) => at.as_second() < jiff::Timestamp::now().as_second() - LEEWAY_SECONDS as i64,
        Err(_) => true,
    }
}

fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(text.as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

fn invalid(name: &str, field: &str, message: String) -> ApiError {
    ApiError::Invalid {
        kind: "TokenRequest".into(),
        group: "authentication.k8s.io".into(),
        name: name.into(),
        message: format!(
            "TokenRequest.authentication.k8s.io {name:?} is invalid: {field}: {message}"
        ),
        causes: vec![Cause {
            reason: "FieldValueInvalid".into(),
            field: field.into(),
            message,
        }],
    }
}

/// `POST .../serviceaccounts/<name>/token`: a signed token for the ServiceAccount, optionally
/// bound to a pod of its namespace; answers the TokenRequest with `status.token`.
pub async fn token_request(
    state: &SharedState,
    namespace: &str,
    name: &str,
    body: &[u8],
) -> Result<Value, ApiError> {
    let mut req = super::decode_body("TokenRequest", body)?;
    let spec = req.get("spec").cloned().unwrap_or_else(|| json!({}));
    let expiration = match spec.get("expirationSeconds") {
        None | Some(Value::Null) => DEFAULT_EXPIRATION_SECONDS,
        Some(v) => v.as_i64().ok_or_else(|| {
            ApiError::BadRequest(format!(
                "spec.expirationSeconds must be an integer, got {v}"
            ))
        })?,
    };
    if expiration < MIN_EXPIRATION_SECONDS {
        return Err(invalid(
            name,
            "spec.expirationSeconds",
            format!("Invalid value: {expiration}: may not specify a duration less than 10 minutes"),
        ));
    }
    if expiration > MAX_EXPIRATION_SECONDS {
        return Err(invalid(
            name,
            "spec.expirationSeconds",
            format!(
                "Invalid value: {expiration}: may not specify a duration larger than 2^32 seconds"
            ),
        ));
    }
    let mut audiences = super::string_list(&spec, "audiences");
    if audiences.is_empty() {
        audiences = vec![state.tokens.issuer.clone()];
    }
    let sa_res = registry::lookup("", "v1", "serviceaccounts")
        .ok_or_else(|| ApiError::Internal("serviceaccounts are not registered".into()))?;
    let sa = state
        .store
        .get(&sa_res.key(Some(namespace), name))
        .await?
        .filter(|sa| !is_terminating(sa))
        .ok_or_else(|| ApiError::not_found(sa_res, name))?;
    let sa_uid = meta_str(&sa, "uid").unwrap_or("").to_string();
    let bound = match spec.get("boundObjectRef").filter(|r| !r.is_null()) {
        None => None,
        Some(r) => Some(bound_pod(state, namespace, name, r).await?),
    };
    let now = jiff::Timestamp::now().as_second();
    let exp = now + expiration;
    let claims = Claims {
        aud: audiences.clone(),
        exp,
        iat: now,
        iss: state.tokens.issuer.clone(),
        jti: uuid::Uuid::new_v4().to_string(),
        kubernetes: KubernetesClaims {
            namespace: namespace.into(),
            serviceaccount: ObjectRef {
                name: name.into(),
                uid: sa_uid,
            },
            pod: bound.clone(),
        },
        nbf: now,
        sub: service_account_user(namespace, name),
    };
    let token = state.tokens.sign(&claims)?;
    let expires = jiff::Timestamp::from_second(exp)
        .map(|t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_default();
    req["apiVersion"] = json!("authentication.k8s.io/v1");
    req["kind"] = json!("TokenRequest");
    req["metadata"] = json!({"name": name, "namespace": namespace, "creationTimestamp": null});
    req["spec"] = json!({
        "audiences": audiences,
        "expirationSeconds": expiration,
        "boundObjectRef": spec.get("boundObjectRef").filter(|r| !r.is_null()).map(|r| {
            let mut r = r.clone();
            if let Some(p) = &bound {
                r["uid"] = json!(p.uid);
                if r.get("apiVersion").is_none_or(|v| v.as_str() == Some("")) {
                    r["apiVersion"] = json!("v1");
                }
            }
            r
        }),
    });
    req["status"] = json!({"token": token, "expirationTimestamp": expires});
    Ok(req)
}

/// The pod a token is bound to (upstream's checks in the TokenRequest storage).
async fn bound_pod(
    state: &SharedState,
    namespace: &str,
    sa: &str,
    r: &Value,
) -> Result<ObjectRef, ApiError> {
    let s = |f: &str| r.get(f).and_then(Value::as_str).unwrap_or("");
    let api_version = if s("apiVersion").is_empty() {
        "v1"
    } else {
        s("apiVersion")
    };
    if s("kind") != "Pod" || api_version != "v1" {
        let group = api_version.rsplit_once('/').map(|(g, _)| g).unwrap_or("");
        let version = api_version.rsplit_once('/').map_or(api_version, |(_, v)| v);
        return Err(ApiError::BadRequest(format!(
            "cannot bind token to object of type {}, Kind={}",
            if group.is_empty() {
                format!("/{version}")
            } else {
                format!("{group}/{version}")
            },
            s("kind")
        )));
    }
    let pods = registry::lookup("", "v1", "pods")
        .ok_or_else(|| ApiError::Internal("pods are not registered".into()))?;
    let pod = state
        .store
        .get(&pods.key(Some(namespace), s("name")))
        .await?
        .ok_or_else(|| ApiError::not_found(pods, s("name")))?;
    let pod_sa = pod
        .pointer("/spec/serviceAccountName")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .unwrap_or("default");
    if pod_sa != sa {
        return Err(ApiError::BadRequest(format!(
            "cannot bind token for serviceaccount {sa:?} to pod running with different serviceaccount name."
        )));
    }
    let uid = meta_str(&pod, "uid").unwrap_or("").to_string();
    if !s("uid").is_empty() && s("uid") != uid {
        return Err(ApiError::Conflict {
            resource: "Pod".into(),
            name: s("name").into(),
            detail: format!(
                "the UID in the bound object reference ({}) does not match the UID in record. The object might have been deleted and then recreated",
                s("uid")
            ),
        });
    }
    Ok(ObjectRef {
        name: s("name").into(),
        uid,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_account_user_names() {
        assert_eq!(
            parse_service_account_user("system:serviceaccount:kube-system:kube-proxy"),
            Some(("kube-system".into(), "kube-proxy".into()))
        );
        assert_eq!(parse_service_account_user("system:serviceaccount:ns"), None);
        assert_eq!(
            parse_service_account_user("system:serviceaccount:ns:a:b"),
            None
        );
        assert_eq!(parse_service_account_user("alice"), None);
    }

    #[test]
    fn tokens_verify_only_with_their_key_and_audience() {
        let dir = tempfile::tempdir().unwrap();
        let t = Tokens::load_or_create(dir.path(), "cluster.local").unwrap();
        // The key persists: a second load verifies what the first signed.
        let again = Tokens::load_or_create(dir.path(), "cluster.local").unwrap();
        let now = jiff::Timestamp::now().as_second();
        let claims = Claims {
            aud: vec![t.issuer.clone()],
            exp: now + 600,
            iat: now,
            iss: t.issuer.clone(),
            jti: "j".into(),
            kubernetes: KubernetesClaims {
                namespace: "ns".into(),
                serviceaccount: ObjectRef {
                    name: "sa".into(),
                    uid: "u".into(),
                },
                pod: None,
            },
            nbf: now,
            sub: service_account_user("ns", "sa"),
        };
        let token = t.sign(&claims).unwrap();
        assert_eq!(again.verify(&token).unwrap(), claims);
        let other = tempfile::tempdir().unwrap();
        let stranger = Tokens::load_or_create(other.path(), "cluster.local").unwrap();
        assert!(stranger.verify(&token).is_err());
        let wrong_aud = t
            .sign(&Claims {
                aud: vec!["vault".into()],
                ..claims.clone()
            })
            .unwrap();
        assert!(t.verify(&wrong_aud).is_err());
        let expired = t
            .sign(&Claims {
                exp: now - 2 * LEEWAY_SECONDS as i64,
                ..claims
            })
            .unwrap();
        assert!(t.verify(&expired).is_err());
    }
}
