//! The workload controllers' syncs: Deployments plan ReplicaSets, ReplicaSets and
//! StatefulSets plan pods (and StatefulSets their ControllerRevisions); the apply step writes
//! the plan, records the expectations and the Events. Split from `reconcile.rs` by concern;
//! the workers there call these.

use super::*;

impl Controllers {
    fn pod_present(inf: &Informers, ns: &str) -> impl Fn(&str) -> bool {
        move |name| {
            get(&inf.pods, &Key::new(ns, name)).is_some_and(|p| !podutil::is_terminating(&p))
        }
    }

    pub(super) async fn sync_deployment(
        &self,
        key: &Key,
        inf: &Informers,
    ) -> Result<Option<Duration>, ControllerError> {
        let exp = &self.expectations[&Kind::Deployments];
        let ns = key.namespace.clone();
        if !exp.satisfied(key, |name| {
            get(&inf.replicasets, &Key::new(&ns, name)).is_some()
        }) {
            return Ok(Some(SHORT_RETRY));
        }
        let Some(d) = get(&inf.deployments, key) else {
            exp.forget(key);
            return Ok(None);
        };
        if d.metadata.deletion_timestamp.is_some() {
            return Ok(None);
        }
        let sets: Vec<Arc<ReplicaSet>> = inf
            .replicasets
            .state()
            .into_iter()
            .filter(|r| r.metadata.namespace.as_deref() == Some(key.namespace.as_str()))
            .collect();
        let sets: Vec<&ReplicaSet> = sets.iter().map(AsRef::as_ref).collect();
        let pods = Self::pods_in(inf, &key.namespace);
        let pods: Vec<&Pod> = pods.iter().map(AsRef::as_ref).collect();
        let plan = workloads::deployment::plan(&d, &sets, &pods, now())?;
        let recheck = plan
            .recheck_after
            .and_then(|s| u64::try_from(s).ok())
            .map(Duration::from_secs);
        if plan.is_empty() {
            return Ok(recheck);
        }
        debug!(%key, ?plan, "applying deployment plan");
        let api: Api<ReplicaSet> = Api::namespaced(self.client.clone(), &key.namespace);
        if let Some(rs) = &plan.create {
            match api.create(&post_params(CONTROLLER_MANAGER), rs).await {
                Ok(o) => {
                    exp.expect(key, vec![o.name_any()], Vec::new());
                    let to = rs.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
                    if to > 0 {
                        let message = events::scaled_message(&o.name_any(), 0, to);
                        self.events
                            .normal(
                                events::DEPLOYMENT_CONTROLLER,
                                &Regarding::of(d.as_ref()),
                                "ScalingReplicaSet",
                                message,
                            )
                            .await;
                    }
                }
                // Taken by a ReplicaSet the cache has not seen yet: look again shortly.
                Err(kube::Error::Api(s)) if s.code == 409 => return Ok(Some(SHORT_RETRY)),
                Err(e) => {
                    return Err(ControllerError::api(
                        format!("create ReplicaSet for Deployment {key}"),
                        e,
                    ));
                }
            }
        }
        for rs in &plan.update {
            let name = rs.name_any();
            api.replace(&name, &post_params(CONTROLLER_MANAGER), rs)
                .await
                .map_err(|e| {
                    ControllerError::api(format!("update ReplicaSet {}/{name}", key.namespace), e)
                })?;
            let replicas = |r: &ReplicaSet| r.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
            let from = sets
                .iter()
                .find(|s| s.name_any() == name)
                .map(|s| replicas(s));
            if let Some(from) = from.filter(|f| *f != replicas(rs)) {
                let message = events::scaled_message(&name, from, replicas(rs));
                self.events
                    .normal(
                        events::DEPLOYMENT_CONTROLLER,
                        &Regarding::of(d.as_ref()),
                        "ScalingReplicaSet",
                        message,
                    )
                    .await;
            }
        }
        for name in &plan.delete {
            delete_ignoring_missing(&api, name).await.map_err(|e| {
                ControllerError::api(format!("delete ReplicaSet {}/{name}", key.namespace), e)
            })?;
        }
        if !plan.legacy_pods.is_empty() {
            let pods: Api<Pod> = Api::namespaced(self.client.clone(), &key.namespace);
            for name in &plan.legacy_pods {
                delete_ignoring_missing(&pods, name).await.map_err(|e| {
                    ControllerError::api(format!("delete pod {}/{name}", key.namespace), e)
                })?;
            }
        }
        let deploys: Api<Deployment> = Api::namespaced(self.client.clone(), &key.namespace);
        if let Some(status) = plan.status {
            let mut obj = (*d).clone();
            obj.status = Some(status);
            write_status(&deploys, &obj, key).await?;
        }
        if let Some(rev) = &plan.revision {
            let patch = serde_json::json!({"metadata": {"annotations": {
                workloads::deployment::ANNOTATION_REVISION: rev
            }}});
            deploys
                .patch(
                    &key.name,
                    &patch_params(CONTROLLER_MANAGER),
                    &Patch::Merge(&patch),
                )
                .await
                .map_err(|e| ControllerError::api(format!("annotate Deployment {key}"), e))?;
        }
        Ok(recheck)
    }

    pub(super) async fn sync_replicaset(
        &self,
        key: &Key,
        inf: &Informers,
    ) -> Result<Option<Duration>, ControllerError> {
        let exp = &self.expectations[&Kind::ReplicaSets];
        if !exp.satisfied(key, Self::pod_present(inf, &key.namespace)) {
            return Ok(Some(SHORT_RETRY));
        }
        let Some(rs) = get(&inf.replicasets, key) else {
            exp.forget(key);
            return Ok(None);
        };
        let pods = Self::pods_in(inf, &key.namespace);
        let pods: Vec<&Pod> = pods.iter().map(AsRef::as_ref).collect();
        let plan = workloads::replicaset::plan(&rs, &pods, now())?;
        self.apply_pods(Kind::ReplicaSets, key, &Regarding::of(rs.as_ref()), &plan)
            .await?;
        if let Some(status) = plan.status {
            let mut obj = (*rs).clone();
            obj.status = Some(status);
            write_status(
                &Api::<ReplicaSet>::namespaced(self.client.clone(), &key.namespace),
                &obj,
                key,
            )
            .await?;
        }
        Ok(None)
    }

    /// The ControllerRevisions of namespace `ns` the informer holds.
    fn revisions_in(inf: &Informers, ns: &str) -> Vec<Arc<ControllerRevision>> {
        inf.revisions
            .state()
            .into_iter()
            .filter(|r| r.metadata.namespace.as_deref() == Some(ns))
            .collect()
    }

    pub(super) async fn sync_statefulset(
        &self,
        key: &Key,
        inf: &Informers,
    ) -> Result<Option<Duration>, ControllerError> {
        let exp = &self.expectations[&Kind::StatefulSets];
        if !exp.satisfied(key, Self::pod_present(inf, &key.namespace)) {
            return Ok(Some(SHORT_RETRY));
        }
        let Some(s) = get(&inf.statefulsets, key) else {
            exp.forget(key);
            return Ok(None);
        };
        let pods = Self::pods_in(inf, &key.namespace);
        let pods: Vec<&Pod> = pods.iter().map(AsRef::as_ref).collect();
        let revisions = Self::revisions_in(inf, &key.namespace);
        let revisions: Vec<&ControllerRevision> = revisions.iter().map(AsRef::as_ref).collect();
        let history = workloads::history::plan(
            &workloads::history::Owner::statefulset(&s),
            &revisions,
            &pods,
        );
        self.apply_history(key, &history).await?;
        let current = history.current.as_ref().map(|(n, t)| (n.as_str(), t));
        let plan = workloads::statefulset::plan_at(&s, &pods, &history.update_revision, current)?;
        self.apply_pods(Kind::StatefulSets, key, &Regarding::of(s.as_ref()), &plan)
            .await?;
        if let Some(status) = plan.status {
            let mut obj = (*s).clone();
            obj.status = Some(status);
            write_status(
                &Api::<StatefulSet>::namespaced(self.client.clone(), &key.namespace),
                &obj,
                key,
            )
            .await?;
        }
        Ok(None)
    }

    pub(super) async fn sync_daemonset(
        &self,
        key: &Key,
        inf: &Informers,
    ) -> Result<Option<Duration>, ControllerError> {
        let exp = &self.expectations[&Kind::DaemonSets];
        if !exp.satisfied(key, Self::pod_present(inf, &key.namespace)) {
            return Ok(Some(SHORT_RETRY));
        }
        let Some(d) = get(&inf.daemonsets, key) else {
            exp.forget(key);
            return Ok(None);
        };
        if d.metadata.deletion_timestamp.is_some() {
            return Ok(None);
        }
        let nodes = inf.nodes.state();
        let nodes: Vec<&Node> = nodes.iter().map(AsRef::as_ref).collect();
        let pods = Self::pods_in(inf, &key.namespace);
        let pods: Vec<&Pod> = pods.iter().map(AsRef::as_ref).collect();
        let revisions = Self::revisions_in(inf, &key.namespace);
        let revisions: Vec<&ControllerRevision> = revisions.iter().map(AsRef::as_ref).collect();
        let history =
            workloads::history::plan(&workloads::history::Owner::daemonset(&d), &revisions, &pods);
        self.apply_history(key, &history).await?;
        let plan = workloads::daemonset::plan(&d, &nodes, &pods, now())?;
        if plan.is_empty() {
            return Ok(None);
        }
        debug!(%key, ?plan, "applying daemonset plan");
        self.apply_pods(Kind::DaemonSets, key, &Regarding::of(d.as_ref()), &plan)
            .await?;
        if let Some(status) = plan.status {
            let mut obj = (*d).clone();
            obj.status = Some(status);
            write_status(
                &Api::<DaemonSet>::namespaced(self.client.clone(), &key.namespace),
                &obj,
                key,
            )
            .await?;
        }
        Ok(None)
    }

    async fn apply_history(
        &self,
        key: &Key,
        plan: &workloads::history::RevisionPlan,
    ) -> Result<(), ControllerError> {
        let api: Api<ControllerRevision> = Api::namespaced(self.client.clone(), &key.namespace);
        let what = |verb: &str, name: &str| {
            format!(
                "{verb} ControllerRevision {}/{name} of {key}",
                key.namespace
            )
        };
        if let Some(r) = &plan.create {
            match api.create(&post_params(CONTROLLER_MANAGER), r).await {
                Ok(_) => {}
                // Already there (the cache is behind): the next pass sees it.
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                Err(e) => return Err(ControllerError::api(what("create", &r.name_any()), e)),
            }
        }
        if let Some(r) = &plan.update {
            api.replace(&r.name_any(), &post_params(CONTROLLER_MANAGER), r)
                .await
                .map_err(|e| ControllerError::api(what("update", &r.name_any()), e))?;
        }
        for name in &plan.delete {
            delete_ignoring_missing(&api, name)
                .await
                .map_err(|e| ControllerError::api(what("delete", name), e))?;
        }
        Ok(())
    }

    async fn apply_pods<S>(
        &self,
        kind: Kind,
        key: &Key,
        owner: &Regarding,
        plan: &PodPlan<S>,
    ) -> Result<(), ControllerError> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &key.namespace);
        let mut created = Vec::new();
        let mut deleted = Vec::new();
        for p in &plan.adopt {
            let name = p.name_any();
            api.replace(&name, &post_params(CONTROLLER_MANAGER), p)
                .await
                .map_err(|e| {
                    ControllerError::api(
                        format!("update the owners of pod {}/{name}", key.namespace),
                        e,
                    )
                })?;
        }
        let mut result = Ok(());
        for p in &plan.create {
            match api.create(&post_params(CONTROLLER_MANAGER), p).await {
                Ok(o) => created.push(o.name_any()),
                Err(e) => {
                    result = Err(ControllerError::api(
                        format!("create pod for {kind:?} {key}"),
                        e,
                    ));
                    break;
                }
            }
        }
        if result.is_ok() {
            for name in &plan.delete {
                match delete_ignoring_missing(&api, name).await {
                    Ok(()) => deleted.push(name.clone()),
                    Err(e) => {
                        result = Err(ControllerError::api(
                            format!("delete pod {}/{name}", key.namespace),
                            e,
                        ));
                        break;
                    }
                }
            }
        }
        // Upstream's SuccessfulCreate / SuccessfulDelete, on the owner.
        let done = created
            .iter()
            .map(|n| (true, n))
            .chain(deleted.iter().map(|n| (false, n)));
        for (create, pod) in done {
            let reason = if create {
                "SuccessfulCreate"
            } else {
                "SuccessfulDelete"
            };
            let (component, message) = match kind {
                Kind::StatefulSets => (
                    events::STATEFULSET_CONTROLLER,
                    events::statefulset_pod_message(create, pod, &key.name),
                ),
                // Upstream's DaemonSet controller words them as the ReplicaSet one does.
                Kind::DaemonSets => (
                    events::DAEMONSET_CONTROLLER,
                    events::replicaset_pod_message(create, pod),
                ),
                _ => (
                    events::REPLICASET_CONTROLLER,
                    events::replicaset_pod_message(create, pod),
                ),
            };
            self.events.normal(component, owner, reason, message).await;
        }
        self.expectations[&kind].expect(key, created, deleted);
        result
    }
}
