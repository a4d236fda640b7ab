//! The pod status the agent reports, computed purely from what it knows about the sandbox and
//! each container: phase, IPs, container statuses and the four conditions, with transition
//! times kept across updates.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting,
    ContainerStatus, HostIP, PodCondition, PodIP, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

/// A container's state as the agent tracks it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CState {
    Waiting {
        reason: String,
        message: Option<String>,
    },
    Running {
        started: Timestamp,
    },
    Terminated {
        exit_code: i32,
        signal: Option<i32>,
        reason: String,
        started: Option<Timestamp>,
        finished: Timestamp,
    },
}

/// One container as the agent sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerView {
    pub name: String,
    pub state: CState,
    pub last_state: Option<CState>,
    pub restart_count: i32,
    pub ready: bool,
    /// False once it terminated and the restart policy will not restart it.
    pub will_restart: bool,
}

/// The pod as the agent sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodView {
    pub pod_ip: Option<Ipv4Addr>,
    pub host_ip: Ipv4Addr,
    pub started: Timestamp,
    pub containers: Vec<ContainerView>,
    /// Why the sandbox could not be set up, while it cannot.
    pub sandbox_error: Option<String>,
}

/// Condition transition times, kept by the caller between computations.
#[derive(Debug, Clone, Default)]
pub struct Conditions(BTreeMap<&'static str, (bool, Timestamp)>);

impl Conditions {
    fn set(&mut self, kind: &'static str, value: bool, now: Timestamp) -> PodCondition {
        let entry = self.0.entry(kind).or_insert((value, now));
        if entry.0 != value {
            *entry = (value, now);
        }
        PodCondition {
            type_: kind.to_string(),
            status: if value { "True" } else { "False" }.to_string(),
            last_transition_time: Some(Time(entry.1)),
            ..Default::default()
        }
    }
}

fn state(s: &CState) -> ContainerState {
    match s {
        CState::Waiting { reason, message } => ContainerState {
            waiting: Some(ContainerStateWaiting {
                reason: Some(reason.clone()),
                message: message.clone(),
            }),
            ..Default::default()
        },
        CState::Running { started } => ContainerState {
            running: Some(ContainerStateRunning {
                started_at: Some(Time(*started)),
            }),
            ..Default::default()
        },
        CState::Terminated {
            exit_code,
            signal,
            reason,
            started,
            finished,
        } => ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code: *exit_code,
                signal: *signal,
                reason: Some(reason.clone()),
                started_at: started.map(Time),
                finished_at: Some(Time(*finished)),
                ..Default::default()
            }),
            ..Default::default()
        },
    }
}

/// The phase, as the kubelet's `getPhase`: Pending until every container has started once (or
/// the sandbox is missing), Running while any runs or will restart, Succeeded/Failed when all
/// terminated for good.
pub fn phase(view: &PodView) -> &'static str {
    if view.pod_ip.is_none() || view.sandbox_error.is_some() {
        return "Pending";
    }
    let cs = &view.containers;
    if cs.is_empty() {
        return "Running";
    }
    let done: Vec<&ContainerView> = cs
        .iter()
        .filter(|c| matches!(c.state, CState::Terminated { .. }) && !c.will_restart)
        .collect();
    if done.len() == cs.len() {
        let failed = done
            .iter()
            .any(|c| matches!(c.state, CState::Terminated { exit_code, .. } if exit_code != 0));
        return if failed { "Failed" } else { "Succeeded" };
    }
    let never_started = cs.iter().any(|c| {
        matches!(c.state, CState::Waiting { .. }) && c.restart_count == 0 && c.last_state.is_none()
    });
    if never_started { "Pending" } else { "Running" }
}

/// The full status object (to be sent as a merge patch of `status`).
pub fn pod_status(view: &PodView, conditions: &mut Conditions, now: Timestamp) -> PodStatus {
    let all_ready = !view.containers.is_empty() && view.containers.iter().all(|c| c.ready);
    let phase = phase(view);
    PodStatus {
        phase: Some(phase.to_string()),
        host_ip: Some(view.host_ip.to_string()),
        host_ips: Some(vec![HostIP {
            ip: view.host_ip.to_string(),
        }]),
        pod_ip: view.pod_ip.map(|ip| ip.to_string()),
        pod_ips: view.pod_ip.map(|ip| vec![PodIP { ip: ip.to_string() }]),
        start_time: Some(Time(view.started)),
        message: view.sandbox_error.clone(),
        reason: None,
        conditions: Some(vec![
            conditions.set("PodScheduled", true, now),
            conditions.set("Initialized", true, now),
            conditions.set("ContainersReady", all_ready, now),
            conditions.set("Ready", all_ready, now),
        ]),
        container_statuses: Some(
            view.containers
                .iter()
                .map(|c| ContainerStatus {
                    name: c.name.clone(),
                    ready: c.ready,
                    restart_count: c.restart_count,
                    started: Some(matches!(c.state, CState::Running { .. })),
                    state: Some(state(&c.state)),
                    last_state: Some(c.last_state.as_ref().map(state).unwrap_or_default()),
                    image: "svcnet/process".into(),
                    image_id: String::new(),
                    container_id: None,
                    ..Default::default()
                })
                .collect(),
        ),
        qos_class: Some("BestEffort".into()),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + s).unwrap()
    }

    fn view(states: Vec<(CState, bool, bool)>) -> PodView {
        PodView {
            pod_ip: Some("10.244.1.2".parse().unwrap()),
            host_ip: "172.30.0.2".parse().unwrap(),
            started: ts(0),
            sandbox_error: None,
            containers: states
                .into_iter()
                .enumerate()
                .map(|(i, (state, ready, will_restart))| ContainerView {
                    name: format!("c{i}"),
                    state,
                    last_state: None,
                    restart_count: 0,
                    ready,
                    will_restart,
                })
                .collect(),
        }
    }

    fn term(code: i32) -> CState {
        CState::Terminated {
            exit_code: code,
            signal: None,
            reason: "Completed".into(),
            started: Some(ts(1)),
            finished: ts(2),
        }
    }

    #[test]
    fn phases() {
        let waiting = CState::Waiting {
            reason: "ContainerCreating".into(),
            message: None,
        };
        let running = CState::Running { started: ts(1) };
        assert_eq!(
            phase(&view(vec![(waiting.clone(), false, true)])),
            "Pending"
        );
        assert_eq!(
            phase(&view(vec![
                (running.clone(), true, true),
                (waiting, false, true)
            ])),
            "Pending"
        );
        assert_eq!(
            phase(&view(vec![(running, true, true), (term(1), false, true)])),
            "Running"
        );
        assert_eq!(
            phase(&view(vec![
                (term(0), false, false),
                (term(0), false, false)
            ])),
            "Succeeded"
        );
        assert_eq!(
            phase(&view(vec![
                (term(0), false, false),
                (term(2), false, false)
            ])),
            "Failed"
        );
        let mut no_ip = view(vec![]);
        no_ip.pod_ip = None;
        assert_eq!(phase(&no_ip), "Pending");
    }

    #[test]
    fn ready_condition_keeps_its_transition_time() {
        let mut conds = Conditions::default();
        let running = CState::Running { started: ts(1) };
        let s1 = pod_status(
            &view(vec![(running.clone(), false, true)]),
            &mut conds,
            ts(5),
        );
        let s2 = pod_status(
            &view(vec![(running.clone(), false, true)]),
            &mut conds,
            ts(6),
        );
        let s3 = pod_status(&view(vec![(running, true, true)]), &mut conds, ts(7));
        let ready = |s: &PodStatus| {
            s.conditions
                .as_ref()
                .unwrap()
                .iter()
                .find(|c| c.type_ == "Ready")
                .cloned()
                .unwrap()
        };
        assert_eq!(ready(&s1).status, "False");
        assert_eq!(ready(&s2).last_transition_time, Some(Time(ts(5))));
        assert_eq!(
            (ready(&s3).status.as_str(), ready(&s3).last_transition_time),
            ("True", Some(Time(ts(7))))
        );
        assert_eq!(s3.pod_ips.unwrap()[0].ip, "10.244.1.2");
        assert_eq!(s3.container_statuses.unwrap()[0].started, Some(true));
    }
}
