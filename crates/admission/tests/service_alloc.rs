//! Allocation through admission: cluster IPs, node ports, health-check node
//! ports and load-balancer IPs across create, update, delete and rebuild.

#![allow(clippy::unwrap_used)] // tests may unwrap (RULES.md)

mod common;

use common::*;
use serde_json::{Value, json};
use svcnet_admission::{Allocators, Protocol, admit_create, admit_update};

fn create(a: &mut Allocators, obj: Value) -> Value {
    admit_create("Service", obj, a).unwrap_or_else(|e| panic!("refused: {:?}", messages(&e)))
}

fn create_err(a: &mut Allocators, obj: Value) -> Vec<String> {
    let before = a.clone();
    let errs = messages(&admit_create("Service", obj, a).expect_err("accepted"));
    assert_eq!(*a, before, "a refused create changed the allocators");
    errs
}

fn node_port(name: &str, port: u16, proto: &str, np: u16) -> Value {
    service("default", name, |s| {
        set(s, "spec.type", json!("NodePort"));
        set(
            s,
            "spec.ports",
            json!([{"port": port, "protocol": proto, "nodePort": np}]),
        );
    })
}

#[test]
fn a_small_cidr_runs_out_with_a_clear_error() {
    let mut a = small_allocs("10.0.0.0/29", 30000..=30010);
    let ips: Vec<String> = (0..5)
        .map(|i| {
            str_at(
                &create(&mut a, service("default", &format!("s{i}"), |_| {})),
                "/spec/clusterIP",
            )
            .to_string()
        })
        .collect();
    // .1 is only given on request; .0 and .7 are network and broadcast.
    assert_eq!(
        ips,
        ["10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5", "10.0.0.6"]
    );
    assert_eq!(
        create_err(&mut a, service("default", "s5", |_| {})),
        ["spec.clusterIPs: Forbidden: failed to allocate a serviceIP: range is full"]
    );
    // The first address is still there for whoever asks for it.
    create(
        &mut a,
        service("default", "kubernetes", |s| {
            set(s, "spec.clusterIP", json!("10.0.0.1"))
        }),
    );
    // Headless and ExternalName services need no address.
    create(
        &mut a,
        service("default", "headless", |s| {
            set(s, "spec.clusterIP", json!("None"))
        }),
    );
}

#[test]
fn reserved_ips_are_only_given_on_request() {
    let mut a = allocs();
    let dns = create(
        &mut a,
        service("kube-system", "kube-dns", |s| {
            set(s, "spec.clusterIP", json!("10.96.0.10"))
        }),
    );
    assert_eq!(str_at(&dns, "/spec/clusterIPs/0"), "10.96.0.10");
    assert_eq!(
        create_err(
            &mut a,
            service("default", "x", |s| set(
                s,
                "spec.clusterIP",
                json!("10.96.0.10")
            ))
        ),
        [
            r#"spec.clusterIPs: Invalid value: ["10.96.0.10"]: failed to allocate IP 10.96.0.10: provided IP is already allocated"#
        ]
    );
    assert_eq!(
        create_err(
            &mut a,
            service("default", "x", |s| set(
                s,
                "spec.clusterIP",
                json!("10.0.0.5")
            ))
        ),
        [
            r#"spec.clusterIPs: Invalid value: ["10.0.0.5"]: failed to allocate IP 10.0.0.5: the provided IP (10.0.0.5) is not in the valid range. The range of valid IPs is 10.96.0.0/12"#
        ]
    );
    // In a /28 the reserved address is inside the dynamic band: never handed out.
    let mut a = Allocators::new(svcnet_admission::AdmissionConfig {
        service_cidrs: vec!["10.96.0.0/28".parse().unwrap()],
        ..Default::default()
    })
    .unwrap();
    let got: Vec<String> = (0..12)
        .map(|i| {
            str_at(
                &create(&mut a, service("default", &format!("s{i}"), |_| {})),
                "/spec/clusterIP",
            )
            .to_string()
        })
        .collect();
    assert!(
        !got.contains(&"10.96.0.10".to_string()) && !got.contains(&"10.96.0.1".to_string()),
        "{got:?}"
    );
    assert_eq!(got.len(), 12);
    assert_eq!(
        create_err(&mut a, service("default", "full", |_| {})).len(),
        1
    );
}

#[test]
fn node_ports_are_unique_per_protocol_and_freed_on_delete() {
    let mut a = allocs();
    let tcp = create(&mut a, node_port("a", 80, "TCP", 30080));
    create(&mut a, node_port("b", 53, "UDP", 30080));
    assert_eq!(
        create_err(&mut a, node_port("c", 81, "TCP", 30080)),
        ["spec.ports[0].nodePort: Invalid value: 30080: provided port is already allocated"]
    );
    assert_eq!(
        create_err(&mut a, node_port("c", 81, "TCP", 8080)),
        [
            "spec.ports[0].nodePort: Invalid value: 8080: provided port is not in the valid range. The range of valid ports is 30000-32767"
        ]
    );
    a.release(&tcp);
    // The released cluster IP is free again, and so is the port.
    assert!(
        a.cluster_ip_owner(str_at(&tcp, "/spec/clusterIP").parse().unwrap())
            .is_none()
    );
    let c = create(&mut a, node_port("c", 81, "TCP", 30080));
    assert_eq!(int_at(&c, "/spec/ports/0/nodePort"), 30080);
    // Releasing a service that does not own an allocation frees nothing.
    let before = a.clone();
    a.release(&node_port("impostor", 80, "TCP", 30080));
    assert_eq!(a, before);
}

#[test]
fn one_service_may_reuse_a_node_port_only_across_protocols() {
    let mut a = allocs();
    let dns = create(
        &mut a,
        service("default", "dns", |s| {
            set(s, "spec.type", json!("NodePort"));
            set(
                s,
                "spec.ports",
                json!([{"name": "udp", "port": 53, "protocol": "UDP"}, {"name": "tcp", "port": 53}]),
            );
        }),
    );
    // Same port number, no nodePort asked: both share one automatic node port.
    assert_eq!(
        int_at(&dns, "/spec/ports/0/nodePort"),
        int_at(&dns, "/spec/ports/1/nodePort")
    );
    let np = int_at(&dns, "/spec/ports/0/nodePort") as u16;
    let held: Vec<(u16, Protocol)> = a
        .node_ports()
        .into_iter()
        .map(|(p, proto, _)| (p, proto))
        .collect();
    assert_eq!(held, [(np, Protocol::Tcp), (np, Protocol::Udp)]);
}

#[test]
fn update_keeps_allocated_values_the_user_omits() {
    let mut a = allocs();
    let manifest = service("default", "web", |s| {
        set(s, "spec.type", json!("LoadBalancer"));
        set(s, "spec.externalTrafficPolicy", json!("Local"));
        set(
            s,
            "spec.ports",
            json!([{"name": "http", "port": 80}, {"name": "https", "port": 443}]),
        );
    });
    let stored = create(&mut a, manifest.clone());
    let before = a.clone();
    // `kubectl apply` of the same manifest: no clusterIP, nodePorts or status.
    let updated = admit_update("Service", &stored, manifest, &mut a).unwrap();
    assert_eq!(updated, stored);
    assert_eq!(a, before);
}

#[test]
fn update_releases_what_is_no_longer_used() {
    let mut a = allocs();
    let stored = create(&mut a, node_port("np", 80, "TCP", 30080));
    let ip = str_at(&stored, "/spec/clusterIP").to_string();
    // NodePort -> ClusterIP (the user leaves the old nodePort in place, as
    // `kubectl edit` does): the node port is released, the IP kept.
    let mut as_cluster_ip = stored.clone();
    set(&mut as_cluster_ip, "spec.type", json!("ClusterIP"));
    as_cluster_ip["spec"]
        .as_object_mut()
        .unwrap()
        .remove("externalTrafficPolicy");
    let updated = admit_update("Service", &stored, as_cluster_ip, &mut a).unwrap();
    assert!(
        updated.pointer("/spec/ports/0/nodePort").is_none(),
        "{updated}"
    );
    assert!(a.node_ports().is_empty());
    assert_eq!(str_at(&updated, "/spec/clusterIP"), ip);
    // ClusterIP -> ExternalName: the cluster IP goes too.
    let mut ext = updated.clone();
    set(&mut ext, "spec.type", json!("ExternalName"));
    set(&mut ext, "spec.externalName", json!("db.example.com"));
    let updated = admit_update("Service", &updated, ext, &mut a).unwrap();
    assert!(
        updated.pointer("/spec/clusterIP").is_none()
            && updated.pointer("/spec/ipFamilies").is_none(),
        "{updated}"
    );
    assert!(a.cluster_ips().is_empty());
    // ExternalName -> ClusterIP: a new address.
    let mut back = updated.clone();
    set(&mut back, "spec.type", json!("ClusterIP"));
    back["spec"].as_object_mut().unwrap().remove("externalName");
    let updated = admit_update("Service", &updated, back, &mut a).unwrap();
    assert_eq!(a.cluster_ips().len(), 1);
    assert_eq!(
        a.cluster_ips()[0].0.to_string(),
        str_at(&updated, "/spec/clusterIP")
    );
}

#[test]
fn a_failed_update_leaves_the_allocators_unchanged() {
    let mut a = allocs();
    create(&mut a, node_port("other", 80, "TCP", 30090));
    let stored = create(&mut a, node_port("np", 80, "TCP", 30080));
    let before = a.clone();
    // Asks for a taken port *and* an extra new one: nothing may stick.
    let mut new = stored.clone();
    set(
        &mut new,
        "spec.ports",
        json!([{"name": "a", "port": 80, "nodePort": 30090}, {"name": "b", "port": 81}]),
    );
    let errs = admit_update("Service", &stored, new, &mut a).unwrap_err();
    assert_eq!(
        messages(&errs),
        ["spec.ports[0].nodePort: Invalid value: 30090: provided port is already allocated"]
    );
    assert_eq!(a, before);
    // Changing the cluster IP is refused with upstream's message.
    let mut new = stored.clone();
    set(&mut new, "spec.clusterIP", json!("10.96.0.99"));
    let errs = admit_update("Service", &stored, new, &mut a).unwrap_err();
    assert_eq!(
        messages(&errs),
        [r#"spec.clusterIPs[0]: Invalid value: ["10.96.0.99"]: may not change once set"#]
    );
    assert_eq!(a, before);
}

#[test]
fn load_balancers_get_pool_ips_until_the_pool_is_empty() {
    let mut a = small_allocs("10.96.0.0/24", 30000..=30100);
    let lb = |name: &str| {
        service("default", name, |s| {
            set(s, "spec.type", json!("LoadBalancer"))
        })
    };
    let one = create(&mut a, lb("one"));
    let two = create(&mut a, lb("two"));
    assert_eq!(
        str_at(&one, "/status/loadBalancer/ingress/0/ip"),
        "10.200.0.1"
    );
    assert_eq!(
        str_at(&two, "/status/loadBalancer/ingress/0/ip"),
        "10.200.0.2"
    );
    // The /30 pool is empty: the service is created and stays pending.
    let three = create(&mut a, lb("three"));
    assert_eq!(three["status"], json!({"loadBalancer": {}}));
    // Another controller's class: svcnet leaves the status alone.
    let other = create(
        &mut a,
        service("default", "other", |s| {
            set(s, "spec.type", json!("LoadBalancer"));
            set(s, "spec.loadBalancerClass", json!("example.com/lb"));
        }),
    );
    assert_eq!(other["status"], json!({"loadBalancer": {}}));
    // LoadBalancer -> NodePort: ingress and pool IP released, node port kept.
    let mut np = one.clone();
    set(&mut np, "spec.type", json!("NodePort"));
    let updated = admit_update("Service", &one, np, &mut a).unwrap();
    assert_eq!(updated["status"], json!({"loadBalancer": {}}));
    assert_eq!(
        updated.pointer("/spec/ports/0/nodePort"),
        one.pointer("/spec/ports/0/nodePort")
    );
    assert_eq!(a.lb_ips().len(), 1);
    a.release(&two);
    assert!(a.lb_ips().is_empty());
}

#[test]
fn health_check_node_port_follows_the_traffic_policy() {
    let mut a = allocs();
    let stored = create(
        &mut a,
        service("default", "lb", |s| {
            set(s, "spec.type", json!("LoadBalancer"));
            set(s, "spec.externalTrafficPolicy", json!("Local"));
            set(s, "spec.allocateLoadBalancerNodePorts", json!(false));
        }),
    );
    assert!(stored.pointer("/spec/ports/0/nodePort").is_none());
    let hc = int_at(&stored, "/spec/healthCheckNodePort") as u16;
    assert_eq!(
        a.node_ports()
            .into_iter()
            .map(|(p, _, _)| p)
            .collect::<Vec<_>>(),
        [hc]
    );
    assert_eq!(
        create_err(
            &mut a,
            service("default", "lb2", |s| {
                set(s, "spec.type", json!("LoadBalancer"));
                set(s, "spec.externalTrafficPolicy", json!("Local"));
                set(s, "spec.healthCheckNodePort", json!(hc));
            })
        ),
        [format!(
            "spec.healthCheckNodePort: Invalid value: {hc}: failed to allocate requested HealthCheck NodePort {hc}: provided port is already allocated"
        )]
    );
    let mut cluster = stored.clone();
    set(&mut cluster, "spec.externalTrafficPolicy", json!("Cluster"));
    let updated = admit_update("Service", &stored, cluster, &mut a).unwrap();
    assert!(
        updated.pointer("/spec/healthCheckNodePort").is_none(),
        "{updated}"
    );
    assert!(a.node_ports().is_empty());
}

/// Found by the property test: a service's own health-check port may not become one of its
/// TCP node ports (one allocator holds both).
#[test]
fn a_node_port_may_not_take_the_services_own_health_check_port() {
    let mut a = allocs();
    let stored = create(
        &mut a,
        service("default", "lb", |s| {
            set(s, "spec.type", json!("LoadBalancer"));
            set(s, "spec.externalTrafficPolicy", json!("Local"));
        }),
    );
    let hc = int_at(&stored, "/spec/healthCheckNodePort");
    let before = a.clone();
    let mut clash = stored.clone();
    set(&mut clash, "spec.ports.0.nodePort", json!(hc));
    let err = admit_update("Service", &stored, clash, &mut a).unwrap_err();
    assert_eq!(
        messages(&err),
        [format!(
            "spec.ports[0].nodePort: Invalid value: {hc}: provided port is already allocated (it is the service's healthCheckNodePort)"
        )]
    );
    assert!(
        a == before,
        "a refused update leaves the allocators as they were"
    );
}

#[test]
fn rebuild_restores_exactly_and_warns_about_conflicts() {
    let mut a = allocs();
    let mut stored = vec![
        create(
            &mut a,
            service("default", "kubernetes", |s| {
                set(s, "spec.clusterIP", json!("10.96.0.1"))
            }),
        ),
        create(&mut a, node_port("np", 80, "TCP", 30080)),
        create(
            &mut a,
            service("default", "lb", |s| {
                set(s, "spec.type", json!("LoadBalancer"));
                set(s, "spec.externalTrafficPolicy", json!("Local"));
            }),
        ),
        create(&mut a, service("default", "plain", |_| {})),
    ];
    let mut fresh = allocs();
    assert!(fresh.rebuild(&stored).is_empty());
    assert_eq!(fresh, a);
    // A duplicate (two stored services on one IP and port) keeps the first.
    let mut dup = stored[1].clone();
    set(&mut dup, "metadata.name", json!("np-copy"));
    stored.push(dup);
    let mut out_of_range = stored[3].clone();
    set(&mut out_of_range, "metadata.name", json!("old"));
    set(&mut out_of_range, "spec.clusterIP", json!("172.16.0.1"));
    set(&mut out_of_range, "spec.clusterIPs", json!(["172.16.0.1"]));
    stored.push(out_of_range);
    let warnings = fresh.rebuild(&stored);
    let ip = str_at(&stored[1], "/spec/clusterIP");
    assert_eq!(
        warnings,
        [
            format!("service default/np-copy: cluster IP {ip} is already allocated to default/np; not restored"),
            "service default/np-copy: node port 30080/TCP is already allocated to default/np; not restored".to_string(),
            "service default/old: cluster IP 172.16.0.1: the provided IP (172.16.0.1) is not in the valid range. The range of valid IPs is 10.96.0.0/12; not restored".to_string(),
        ]
    );
    assert_eq!(fresh, a);
}

#[test]
fn status_writes_keep_the_spec_and_never_allocate() {
    let mut a = allocs();
    let stored = create(
        &mut a,
        service("default", "lb", |s| {
            set(s, "spec.type", json!("LoadBalancer"));
            set(s, "spec.loadBalancerClass", json!("example.com/lb"));
        }),
    );
    let before = a.clone();
    let mut new = stored.clone();
    set(&mut new, "spec.clusterIP", json!("10.96.0.77"));
    set(
        &mut new,
        "status",
        json!({"loadBalancer": {"ingress": [{"ip": "192.0.2.10", "ipMode": "Proxy"}]}}),
    );
    let got = svcnet_admission::admit_status_update("Service", &stored, new).unwrap();
    assert_eq!(got["spec"], stored["spec"]);
    assert_eq!(
        str_at(&got, "/status/loadBalancer/ingress/0/ip"),
        "192.0.2.10"
    );
    assert_eq!(a, before);
    let mut bad = stored.clone();
    set(
        &mut bad,
        "status",
        json!({"loadBalancer": {"ingress": [{"ip": "not-an-ip"}]}}),
    );
    assert_eq!(
        messages(&svcnet_admission::admit_status_update("Service", &stored, bad).unwrap_err()),
        [
            "status.loadBalancer.ingress[0].ip: Invalid value: \"not-an-ip\": must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)"
        ]
    );
    // A main-resource update never takes the client's status.
    let mut spoof = stored.clone();
    set(
        &mut spoof,
        "status",
        json!({"loadBalancer": {"ingress": [{"ip": "192.0.2.99"}]}}),
    );
    let got = admit_update("Service", &stored, spoof, &mut a).unwrap();
    assert_eq!(got["status"], stored["status"]);
}
