//! The built-in test server as a standalone program (used by this crate's tests; `svcnet`
//! itself serves it through `svcnet_agent::testserver::run_if_requested`).

fn main() {
    svcnet_agent::testserver::run_if_requested();
    eprintln!(
        "usage: SVCNET_TESTSERVER=tcp:80,udp:53 SVCNET_TESTSERVER_POD=name SVCNET_TESTSERVER_IP=ip svcnet-testserver"
    );
    std::process::exit(2);
}
