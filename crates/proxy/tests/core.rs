//! Table-driven core tests: services + slices + node in, desired state out (as compact text).
#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns

use std::fmt::Write;

use expect_test::{Expect, expect};
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use svcnet_proxy::fixtures::*;
use svcnet_proxy::{CoreConfig, DesiredEndpoint, IpFamily, ProxyState};

fn eps(list: &[DesiredEndpoint]) -> String {
    let v: Vec<String> = list
        .iter()
        .map(|e| {
            format!(
                "{}:{}{}",
                e.ip,
                e.port,
                if e.terminating { "(t)" } else { "" }
            )
        })
        .collect();
    format!("[{}]", v.join(" "))
}

/// A capability that expresses every algorithm (the graph's routes do not depend on it).
struct AnyAlgorithm;

impl svcnet_proxy::Capability for AnyAlgorithm {
    fn resolve(
        &self,
        requested: Option<svcnet_proxy::Algorithm>,
        _pools: &[&[DesiredEndpoint]],
        _affinity: bool,
    ) -> svcnet_lb::Resolution {
        svcnet_lb::Resolution {
            algorithm: requested.unwrap_or(svcnet_proxy::Algorithm::Random),
            fallback: None,
        }
    }
}

/// A route as `short-circuit(pool eps) -> target`, the target a pool with its endpoints and
/// masquerade rule, or a refusal.
fn route(g: &svcnet_proxy::ServiceGraph<'_>, r: &svcnet_proxy::Route) -> String {
    use svcnet_proxy::Target;
    let pool = |p| format!("{p:?}{}", eps(g.pool(p).unwrap_or_default()));
    let target = match r.target {
        Target::Pool {
            pool: p,
            masquerade,
        } => format!("{} masq={masquerade:?}", pool(p)),
        Target::Refuse(v) => format!("{v:?}"),
    };
    match r.short_circuit {
        Some(p) => format!("pods+node->{} else {target}", pool(p)),
        None => target,
    }
}

fn render(state: &ProxyState) -> String {
    let mut out = String::new();
    for family in IpFamily::ALL {
        for (name, d) in state.desired(family).services {
            write!(out, "{name} {}:{}", d.cluster_ip, d.port).unwrap();
            if let Some(np) = d.node_port {
                write!(out, " np={np}").unwrap();
            }
            for ip in &d.external_ips {
                write!(out, " ext={ip}").unwrap();
            }
            for ip in &d.load_balancer_ips {
                write!(out, " lb={ip}").unwrap();
            }
            for r in &d.load_balancer_source_ranges {
                write!(out, " allow={r}").unwrap();
            }
            if let Some(t) = d.affinity_timeout {
                write!(out, " affinity={t}s").unwrap();
            }
            // The decided graph (as a dataplane that can express every algorithm sees it).
            let node = state.node_state(family);
            let g = svcnet_proxy::lower(&d, &node, &AnyAlgorithm);
            write!(out, "\n  internal={}", route(&g, &g.internal)).unwrap();
            if let Some(ext) = &g.external {
                write!(out, "\n  external={}", route(&g, ext)).unwrap();
            }
            if let Some(a) = g.affinity {
                let fronts: Vec<String> = g.frontends.iter().map(|f| format!("{f:?}")).collect();
                write!(
                    out,
                    "\n  affinity {}s keyed {} for {}",
                    a.timeout,
                    a.key,
                    fronts.join(", ")
                )
                .unwrap();
            }
            writeln!(out).unwrap();
        }
    }
    out
}

fn check(services: &[Service], slices: &[EndpointSlice], node: Option<Node>, expect: Expect) {
    let config = CoreConfig {
        node_name: "n1".into(),
        cluster_cidrs: vec!["10.244.0.0/16".parse().unwrap()],
        ..Default::default()
    };
    let mut state = ProxyState::new(config);
    if let Some(n) = node {
        state.update_node(&n);
    }
    for s in services {
        state.update_service(s).unwrap();
    }
    for s in slices {
        state.update_slice(s);
    }
    expect.assert_eq(&render(&state));
}

fn web(f: impl FnOnce(&mut ServiceBuilder)) -> Service {
    service("default", "web", |s| {
        s.cluster_ip(&["10.96.0.10"]).port("http", "TCP", 80);
        f(s);
    })
}

fn web_slice(f: impl FnOnce(&mut SliceBuilder)) -> EndpointSlice {
    slice("default", "web-abc", "web", |s| {
        s.port("http", "TCP", 8080);
        f(s);
    })
}

#[test]
fn ready_endpoints_only() {
    check(
        &[web(|_| {})],
        &[web_slice(|s| {
            s.endpoint("10.244.1.2", "n1", |_| {})
                .endpoint("10.244.2.2", "n2", not_ready)
                .endpoint("10.244.3.2", "n3", terminating);
        })],
        None,
        expect![[r#"
            default/web/tcp/http 10.96.0.10:80
              internal=Cluster[10.244.1.2:8080] masq=OffCluster
        "#]],
    );
}

#[test]
fn terminating_fallback_when_nothing_is_ready() {
    check(
        &[web(|_| {})],
        &[web_slice(|s| {
            s.endpoint("10.244.2.2", "n2", not_ready)
                .endpoint("10.244.3.2", "n3", terminating);
        })],
        None,
        expect![[r#"
            default/web/tcp/http 10.96.0.10:80
              internal=Cluster[10.244.3.2:8080(t)] masq=OffCluster
        "#]],
    );
}

#[test]
fn no_endpoints_rejects() {
    check(
        &[web(|s| {
            s.node_port("", "UDP", 53, 30053);
        })],
        &[],
        None,
        expect![[r#"
            default/web/udp/ 10.96.0.10:53 np=30053
              internal=Reject
              external=Reject
            default/web/tcp/http 10.96.0.10:80
              internal=Reject
        "#]],
    );
}

/// ClientIP affinity is decided once, per service port: every frontend (cluster IP, node
/// port, external IP) and both pools share one key, so a client pinned through one frontend
/// stays pinned through the others.
#[test]
fn affinity_is_one_pin_per_service_port() {
    let svc = web(|s| {
        s.type_("NodePort")
            .external_ips(&["198.51.100.9"])
            .external_local()
            .affinity(Some(600));
        s.0.spec.as_mut().unwrap().ports.as_mut().unwrap()[0].node_port = Some(30080);
    });
    check(
        &[svc],
        &[web_slice(|s| {
            s.endpoint("10.244.1.2", "n1", |_| {})
                .endpoint("10.244.2.2", "n2", |_| {});
        })],
        None,
        expect![[r#"
            default/web/tcp/http 10.96.0.10:80 np=30080 ext=198.51.100.9 affinity=600s
              internal=Cluster[10.244.1.2:8080 10.244.2.2:8080] masq=OffCluster
              external=pods+node->Cluster[10.244.1.2:8080 10.244.2.2:8080] else Local[10.244.1.2:8080] masq=Never
              affinity 600s keyed default/web/tcp/http for ClusterIp(10.96.0.10, 80), ExternalIp(198.51.100.9, 80), NodePort(30080)
        "#]],
    );
}

#[test]
fn external_local_uses_local_endpoints_and_drops_without_them() {
    let svc = web(|s| {
        s.type_("LoadBalancer")
            .external_local()
            .lb_ingress(&["203.0.113.7"])
            .source_ranges(&["192.168.0.0/16", "2001:db8::/32"]);
        s.0.spec.as_mut().unwrap().ports.as_mut().unwrap()[0].node_port = Some(30080);
    });
    check(
        std::slice::from_ref(&svc),
        &[web_slice(|s| {
            s.endpoint("10.244.1.2", "n1", |_| {})
                .endpoint("10.244.2.2", "n2", |_| {});
        })],
        None,
        expect![[r#"
            default/web/tcp/http 10.96.0.10:80 np=30080 lb=203.0.113.7 allow=192.168.0.0/16
              internal=Cluster[10.244.1.2:8080 10.244.2.2:8080] masq=OffCluster
              external=pods+node->Cluster[10.244.1.2:8080 10.244.2.2:8080] else Local[10.244.1.2:8080] masq=Never
        "#]],
    );
    check(
        &[svc],
        &[web_slice(|s| {
            s.endpoint("10.244.2.2", "n2", |_| {});
        })],
        None,
        expect![[r#"
            default/web/tcp/http 10.96.0.10:80 np=30080 lb=203.0.113.7 allow=192.168.0.0/16
              internal=Cluster[10.244.2.2:8080] masq=OffCluster
              external=pods+node->Cluster[10.244.2.2:8080] else Drop
        "#]],
    );
}

#[test]
fn internal_local_with_local_terminating_fallback() {
    check(
        &[web(|s| {
            s.internal_local();
        })],
        &[web_slice(|s| {
            s.endpoint("10.244.1.2", "n1", terminating)
                .endpoint("10.244.2.2", "n2", |_| {});
        })],
        None,
        expect![[r#"
            default/web/tcp/http 10.96.0.10:80
              internal=Local[10.244.1.2:8080(t)] masq=OffCluster
        "#]],
    );
    check(
        &[web(|s| {
            s.internal_local();
        })],
        &[web_slice(|s| {
            s.endpoint("10.244.2.2", "n2", |_| {});
        })],
        None,
        expect![[r#"
            default/web/tcp/http 10.96.0.10:80
              internal=Drop
        "#]],
    );
}

#[test]
fn zone_hints_apply_only_when_every_endpoint_has_them() {
    let hinted = web_slice(|s| {
        s.endpoint("10.244.1.2", "n1", |e| zone_hints(e, &["a"]))
            .endpoint("10.244.2.2", "n2", |e| zone_hints(e, &["b"]));
    });
    check(
        &[web(|_| {})],
        std::slice::from_ref(&hinted),
        Some(node("n1", Some("b"))),
        expect![[r#"
            default/web/tcp/http 10.96.0.10:80
              internal=Cluster[10.244.2.2:8080] masq=OffCluster
        "#]],
    );
    let partly = web_slice(|s| {
        s.endpoint("10.244.1.2", "n1", |e| zone_hints(e, &["a"]))
            .endpoint("10.244.2.2", "n2", |_| {});
    });
    check(
        &[web(|_| {})],
        &[partly],
        Some(node("n1", Some("b"))),
        expect![[r#"
            default/web/tcp/http 10.96.0.10:80
              internal=Cluster[10.244.1.2:8080 10.244.2.2:8080] masq=OffCluster
        "#]],
    );
    let by_node = web_slice(|s| {
        s.endpoint("10.244.1.2", "n1", |e| node_hints(e, &["n1"]))
            .endpoint("10.244.2.2", "n2", |e| node_hints(e, &["n2"]));
    });
    check(
        &[web(|_| {})],
        &[by_node],
        Some(node("n1", None)),
        expect![[r#"
            default/web/tcp/http 10.96.0.10:80
              internal=Cluster[10.244.1.2:8080] masq=OffCluster
        "#]],
    );
}

#[test]
fn skipped_services() {
    let headless = service("default", "h", |s| {
        s.cluster_ip(&["None"]).port("http", "TCP", 80);
    });
    let external_name = service("default", "x", |s| {
        s.type_("ExternalName").port("http", "TCP", 80);
    });
    let other_proxy = web(|s| {
        s.label("service.kubernetes.io/service-proxy-name", "other");
    });
    check(
        &[headless, external_name, other_proxy],
        &[],
        None,
        expect![""],
    );
}

#[test]
fn dual_stack_families_are_independent() {
    let svc = service("default", "ds", |s| {
        s.cluster_ip(&["10.96.0.20", "fd00:10:96::20"])
            .port("dns", "UDP", 53)
            .affinity(None)
            .external_ips(&["198.51.100.1", "2001:db8::1"]);
    });
    let v4 = slice("default", "ds-v4", "ds", |s| {
        s.port("dns", "UDP", 5353)
            .endpoint("10.244.1.3", "n1", |_| {});
    });
    let v6 = slice("default", "ds-v6", "ds", |s| {
        s.ipv6()
            .port("dns", "UDP", 5353)
            .endpoint("fd00:244:1::3", "n1", not_ready);
    });
    check(
        &[svc],
        &[v4, v6],
        None,
        expect![[r#"
            default/ds/udp/dns 10.96.0.20:53 ext=198.51.100.1 affinity=10800s
              internal=Cluster[10.244.1.3:5353] masq=OffCluster
              external=Cluster[10.244.1.3:5353] masq=Always
              affinity 10800s keyed default/ds/udp/dns for ClusterIp(10.96.0.20, 53), ExternalIp(198.51.100.1, 53)
            default/ds/udp/dns fd00:10:96::20:53 ext=2001:db8::1 affinity=10800s
              internal=Reject
              external=Reject
              affinity 10800s keyed default/ds/udp/dns for ClusterIp(fd00:10:96::20, 53), ExternalIp(2001:db8::1, 53)
        "#]],
    );
}

#[test]
fn bad_service_is_a_clear_error() {
    let mut state = ProxyState::new(CoreConfig::default());
    let svc = web(|s| {
        s.source_ranges(&["not-a-cidr"]);
    });
    let err = state.update_service(&svc).unwrap_err();
    assert_eq!(
        err.to_string(),
        r#"service default/web: field spec.loadBalancerSourceRanges[0]: "not-a-cidr" is not a CIDR"#
    );
    assert!(state.desired(IpFamily::V4).services.is_empty());
}

#[test]
fn change_sets_coalesce_and_drop_noops() {
    let mut state = ProxyState::new(CoreConfig::default());
    let svc = web(|_| {});
    state.update_service(&svc).unwrap();
    state.update_slice(&web_slice(|s| {
        s.endpoint("10.244.1.2", "n1", |_| {});
    }));
    let first = state.take_changes();
    assert_eq!(first.services.len(), 1);
    assert!(first.services.values().next().unwrap().previous.is_none());

    // An irrelevant change (a label) is no change at all.
    let mut relabelled = svc.clone();
    relabelled.metadata.labels = Some([("x".to_string(), "y".to_string())].into());
    state.update_service(&relabelled).unwrap();
    assert!(state.take_changes().is_empty());

    // Add then remove an endpoint between syncs: coalesced to nothing.
    state.update_slice(&web_slice(|s| {
        s.endpoint("10.244.1.2", "n1", |_| {})
            .endpoint("10.244.1.3", "n1", |_| {});
    }));
    state.update_slice(&web_slice(|s| {
        s.endpoint("10.244.1.2", "n1", |_| {});
    }));
    assert!(state.take_changes().is_empty());

    // Endpoints of a service the proxy does not program are no change either.
    state.update_slice(&slice("default", "ghost-1", "ghost", |s| {
        s.port("http", "TCP", 1)
            .endpoint("10.244.9.9", "n1", |_| {});
    }));
    assert!(state.take_changes().is_empty());
}

/// A service's endpoints are its slices' endpoints merged, whatever the order slices come,
/// go and move in: an address two slices list is held once, ready if either says so; a
/// slice relabelled to another service takes its endpoints with it; a deleted slice's go.
#[test]
fn slices_merge_and_move_between_services() {
    let mut state = ProxyState::new(CoreConfig {
        node_name: "n1".into(),
        ..Default::default()
    });
    let api = service("default", "api", |s| {
        s.cluster_ip(&["10.96.0.11"]).port("http", "TCP", 80);
    });
    state.update_service(&web(|_| {})).unwrap();
    state.update_service(&api).unwrap();
    let second = |svc: &str, f: &dyn Fn(&mut SliceBuilder)| {
        slice("default", "web-second", svc, |s| {
            s.port("http", "TCP", 8080);
            f(s);
        })
    };
    // The second slice comes first; the same address is ready in one, not in the other.
    state.update_slice(&second("web", &|s| {
        s.endpoint("10.244.1.5", "n1", not_ready)
            .endpoint("10.244.1.6", "n2", |_| {});
    }));
    state.update_slice(&web_slice(|s| {
        s.endpoint("10.244.1.5", "n1", |_| {});
    }));
    let summary = |state: &ProxyState| -> String {
        state
            .desired(IpFamily::V4)
            .services
            .iter()
            .map(|(n, d)| format!("{n}: {}\n", eps(&d.cluster_endpoints)))
            .collect()
    };
    expect![[r#"
        default/api/tcp/http: []
        default/web/tcp/http: [10.244.1.5:8080 10.244.1.6:8080]
    "#]]
    .assert_eq(&summary(&state));
    // The second slice now belongs to api.
    state.update_slice(&second("api", &|s| {
        s.endpoint("10.244.1.6", "n2", |_| {});
    }));
    expect![[r#"
        default/api/tcp/http: [10.244.1.6:8080]
        default/web/tcp/http: [10.244.1.5:8080]
    "#]]
    .assert_eq(&summary(&state));
    let changes = state.take_changes();
    assert_eq!(changes.services.len(), 2, "both services changed");
    state.delete_slice("default", "web-abc");
    expect![[r#"
        default/api/tcp/http: [10.244.1.6:8080]
        default/web/tcp/http: []
    "#]]
    .assert_eq(&summary(&state));
    let changes = state.take_changes();
    let keys: Vec<String> = changes.services.keys().map(|k| k.to_string()).collect();
    assert_eq!(keys, ["default/web"]);
}

#[test]
fn stale_udp_conntrack_for_removed_endpoints() {
    let mut state = ProxyState::new(CoreConfig::default());
    let svc = service("kube-system", "dns", |s| {
        s.cluster_ip(&["10.96.0.10"])
            .node_port("dns", "UDP", 53, 30053);
    });
    state.update_service(&svc).unwrap();
    state.update_slice(&slice("kube-system", "dns-1", "dns", |s| {
        s.port("dns", "UDP", 53)
            .endpoint("10.244.1.2", "n1", |_| {})
            .endpoint("10.244.1.3", "n1", |_| {});
    }));
    state.take_changes();
    state.update_slice(&slice("kube-system", "dns-1", "dns", |s| {
        s.port("dns", "UDP", 53)
            .endpoint("10.244.1.3", "n1", |_| {});
    }));
    let changes = state.take_changes();
    let stale: Vec<String> = state
        .stale_conntrack(&changes)
        .iter()
        .map(|s| {
            format!(
                "{:?}:{} -> {:?}",
                s.frontend_ip, s.frontend_port, s.endpoint
            )
        })
        .collect();
    assert_eq!(
        stale,
        [
            "None:30053 -> Some(10.244.1.2)",
            "Some(10.96.0.10):53 -> Some(10.244.1.2)"
        ]
    );
}
