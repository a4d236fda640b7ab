//! What exists from the start: the `default`, `kube-system`, `kube-public` and
//! `kube-node-lease` namespaces, and the `default/kubernetes` service with Endpoints and an
//! EndpointSlice pointing at every live API server (`crate::masterleases`). Written through the normal admission path, so the
//! service's cluster IP is allocated like any other.

use serde_json::{Value, json};
use svcnet_store::Mutation;

use crate::objects;
use crate::ownership::Writer;
use crate::registry::{self, ResourceInfo};
use crate::state::SharedState;
use crate::status::ApiError;

/// The field manager of the server's own objects, as upstream's kube-apiserver names it.
const MANAGER: &str = "kube-apiserver";

fn res(group: &str, plural: &str) -> Result<&'static ResourceInfo, ApiError> {
    let version = "v1";
    registry::lookup(group, version, plural)
        .ok_or_else(|| ApiError::Internal(format!("{plural} are not registered")))
}

/// Creates `obj` if absent, or brings its `fields` to the wanted values if it exists.
/// The `kubernetes` Endpoints and EndpointSlice skip admission (`admit: false`): like
/// upstream's endpoint reconciler they are the server's own record of itself, and on a single
/// machine that address is loopback, which validation refuses for user-written endpoints.
pub(crate) async fn ensure(
    state: &SharedState,
    res: &'static ResourceInfo,
    obj: Value,
    fields: &'static [&'static str],
    admit: bool,
) -> Result<(), ApiError> {
    let ns = objects::meta_str(&obj, "namespace").map(str::to_string);
    let name = objects::name_of(&obj).to_string();
    let created = objects::prepare_create(res, ns.as_deref(), obj.clone())?;
    let st = state.clone();
    let writer = Writer::internal(res, MANAGER);
    state
        .write(res, &res.key(ns.as_deref(), &name), false, move |cur| {
            let mut next = match cur {
                None if !admit => created.clone(),
                None => {
                    st.admission
                        .admit_create(res, objects::name_of(&created), created.clone())?
                }
                Some(cur) => {
                    let mut next = cur.clone();
                    for f in fields {
                        if let Some(v) = obj.get(*f) {
                            next[*f] = v.clone();
                        }
                    }
                    if next == *cur {
                        return Ok(Mutation::Keep);
                    }
                    if admit {
                        st.admission
                            .admit_update(res, objects::name_of(cur), cur, next, false)?
                    } else {
                        next
                    }
                }
            };
            writer.record_update(cur, &mut next, None);
            Ok(Mutation::Put(next))
        })
        .await?;
    Ok(())
}

pub async fn run(state: &SharedState) -> Result<(), ApiError> {
    let namespaces = res("", "namespaces")?;
    for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        ensure(
            state,
            namespaces,
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
            &[],
            true,
        )
        .await?;
    }
    let port = state.addr.port();
    let cluster_ip = state
        .cfg
        .kubernetes_service_ip()
        .ok_or_else(|| ApiError::Internal("no service CIDR configured".into()))?
        .to_string();
    ensure(
        state,
        res("", "services")?,
        json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "kubernetes", "namespace": "default",
                         "labels": {"component": "apiserver", "provider": "kubernetes"}},
            "spec": {
                "type": "ClusterIP",
                "clusterIP": cluster_ip,
                "clusterIPs": [cluster_ip],
                "ports": [{"name": "https", "port": 443, "protocol": "TCP", "targetPort": port}],
                "sessionAffinity": "None",
            },
        }),
        &[],
        true,
    )
    .await?;
    // The service's target port follows the API port, which may change between starts.
    let services = res("", "services")?;
    state
        .write(
            services,
            &services.key(Some("default"), "kubernetes"),
            false,
            move |cur| {
                let Some(cur) = cur else {
                    return Ok(Mutation::Keep);
                };
                if cur.pointer("/spec/ports/0/targetPort") == Some(&json!(port)) {
                    return Ok(Mutation::Keep);
                }
                let mut next = cur.clone();
                next["spec"]["ports"][0]["targetPort"] = json!(port);
                Writer::internal(services, MANAGER).record_update(Some(cur), &mut next, None);
                Ok(Mutation::Put(next))
            },
        )
        .await?;
    // The `kubernetes` endpoints: this server's address among every live API server's.
    crate::masterleases::reconcile(state, false).await?;
    Ok(())
}
