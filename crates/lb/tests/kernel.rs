//! The real kernel evaluates the same slots as the balancer: for each kernel-expressible
//! algorithm, nftables rules rendered from [`kernel_plan`] DNAT a pod's connections (from
//! chosen source ports) in a node namespace, and every connection reaches exactly the
//! endpoint `Balancer::pick` predicts. This pins `jhash` (register layout, seed, scaling) and
//! the `numgen inc` order to what nftables does.
#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::process::Stdio;
use std::time::Duration;

use rand::SeedableRng;
use socket2::{Domain, Socket, Type};
use svcnet_lb::maglev::table_size_for;
use svcnet_lb::{Algorithm, Backend, Balancer, Dataplane, Flow, NoLoad, kernel_plan};
use svcnet_netns::test_support::Lab;

fn connect_from(src: SocketAddr, dst: SocketAddr) -> String {
    let s = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
    s.set_reuse_address(true).unwrap();
    s.bind(&src.into()).unwrap();
    s.connect_timeout(&dst.into(), Duration::from_secs(3))
        .unwrap();
    let mut stream: TcpStream = s.into();
    stream
        .set_read_timeout(Some(Duration::from_secs(3)))
        .unwrap();
    stream.write_all(b"?\n").unwrap();
    let mut line = String::new();
    BufReader::new(stream).read_line(&mut line).unwrap();
    line.split_whitespace().next().unwrap().to_string()
}

#[test]
fn nftables_picks_the_endpoint_the_balancer_predicts() {
    if !nix::unistd::geteuid().is_root() {
        return eprintln!("skipped: needs root");
    }
    let mut lab = Lab::new().unwrap();
    for _ in 0..4 {
        lab.add_pod().unwrap();
    }
    for i in 1..=3 {
        lab.serve_tcp(i, 8080, &format!("b{i}")).unwrap();
    }
    let backends: Vec<Backend> = (1..=3)
        .map(|i| Backend {
            addr: SocketAddr::new(IpAddr::V4(lab.pod(i).ipv4), 8080),
            weight: 1,
        })
        .collect();
    let identity = |addr: SocketAddr| {
        let i = (1..=3)
            .find(|i| IpAddr::V4(lab.pod(*i).ipv4) == addr.ip())
            .unwrap();
        format!("b{i}")
    };
    let cases = [
        (Algorithm::Maglev, "10.96.0.50"),
        (Algorithm::SourceHash, "10.96.0.51"),
        (Algorithm::DestinationHash, "10.96.0.52"),
        (Algorithm::RoundRobin, "10.96.0.53"),
        (Algorithm::WeightedRoundRobin, "10.96.0.54"),
    ];
    let mut script = String::from("table ip lbtest {\n");
    let mut rules = String::new();
    for (alg, vip) in cases {
        let plan = kernel_plan(Some(alg), Dataplane::Nftables, backends.clone(), false).unwrap();
        assert!(plan.fallback.is_none());
        let elems: Vec<String> = plan
            .slots
            .iter()
            .enumerate()
            .map(|(s, b)| format!("{s} : goto {alg}-ep{b}"))
            .collect();
        rules.push_str(&format!(
            "\t\tip daddr {vip} tcp dport 80 {} vmap {{ {} }}\n",
            plan.expression(false).unwrap(),
            elems.join(", ")
        ));
        for (i, b) in plan.backends().iter().enumerate() {
            script.push_str(&format!(
                "\tchain {alg}-ep{i} {{\n\t\tmeta l4proto tcp dnat to {}\n\t}}\n",
                b.addr
            ));
        }
    }
    script.push_str(&format!(
        "\tchain pre {{\n\t\ttype nat hook prerouting priority -100; policy accept;\n{rules}\t}}\n}}\n"
    ));
    let mut child = svcnet_netns::command(Some(lab.node.name()), "nft")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(script.as_bytes())
        .unwrap();
    assert!(child.wait().unwrap().success(), "{script}");

    let client = lab.pod(0).ipv4;
    for (alg, vip) in cases {
        let dst: SocketAddr = format!("{vip}:80").parse().unwrap();
        let balancer = Balancer::with_table_size(alg, backends.clone(), table_size_for(3)).unwrap();
        let mut rng = rand::rngs::StdRng::seed_from_u64(0);
        let mut reached = std::collections::BTreeSet::new();
        for (ticket, port) in (41_000u16..41_024).enumerate() {
            let src = SocketAddr::new(IpAddr::V4(client), port);
            let flow = Flow {
                client: src,
                destination: dst,
            };
            let want = balancer
                .pick(&flow, ticket as u64, &NoLoad, &mut rng)
                .map(|i| identity(balancer.backends()[i].addr))
                .unwrap();
            let got = lab.pod(0).ns.run(move || connect_from(src, dst)).unwrap();
            assert_eq!(got, want, "{alg}: flow from port {port}");
            reached.insert(got);
        }
        // Flow-keyed algorithms spread flows; address-keyed ones pin them.
        let spread = match alg {
            Algorithm::SourceHash | Algorithm::DestinationHash => 1,
            _ => 3,
        };
        assert_eq!(reached.len(), spread, "{alg}: {reached:?}");
    }
}
