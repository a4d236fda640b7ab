//! The `svcnet` binary: every component behind one command line.
//!
//! Each subcommand lives in its own module under `cmd/` with a clap `Args` struct and an async
//! `run` function; this file only parses the command line, sets up logging and dispatches.

mod cmd;

use clap::{Parser, Subcommand};

/// Kubernetes Service networking: API server, controllers, node proxy, cluster DNS and pod network.
#[derive(Debug, Parser)]
#[command(name = "svcnet", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the whole system on this machine: API server, controllers, proxy, DNS and node agent.
    Up(Box<cmd::up::Args>),
    /// Run only the Kubernetes API server (as kube-apiserver), e.g. one of several on an etcd
    /// cluster (`--etcd-servers`).
    Apiserver(Box<cmd::apiserver::Args>),
    /// Run the node proxy (kube-proxy's job) for one node against any API server.
    Proxy(cmd::proxy::Args),
    /// Run cluster DNS (CoreDNS's kubernetes plugin) against any API server.
    Dns(cmd::dns::Args),
    /// Run the controllers against any API server, acting only while holding a leader Lease
    /// (kube-controller-manager's job).
    ControllerManager(cmd::controller_manager::Args),
    /// Print the service environment variables a pod created now in a namespace would get.
    Env(cmd::env::Args),
    /// Remove every namespace, link, route and rule `svcnet up` created; the data dir survives.
    Down(cmd::down::Args),
    /// Run a command inside a pod's namespaces.
    Exec(cmd::exec::Args),
    /// Check Services for the mistakes people make, and say how to fix each.
    Doctor(cmd::doctor::Args),
    /// Which rules a packet hits on a node, and why (from the rules the kernel holds now).
    Trace(cmd::trace::Args),
    /// A node-local DNS cache (NodeLocal DNSCache) in a node's namespace; `svcnet up
    /// --node-local-dns` runs one per node.
    NodeLocalDns(cmd::node_local_dns::Args),
    /// The pod network as a CNI plugin binary (what a kubelet's runtime runs; also how the node
    /// agent attaches its pods).
    Cni(cmd::cni::Args),
}

fn main() -> std::process::ExitCode {
    // The node agent re-executes this binary to run the built-in test server inside pods; that
    // mode is chosen by the environment and never returns.
    svcnet_agent::testserver::run_if_requested();
    // A runtime runs a CNI plugin with `CNI_COMMAND` set and no arguments.
    if cmd::cni::started_as_plugin() {
        return cmd::cni::run();
    }
    let matches = <Cli as clap::CommandFactory>::command().get_matches();
    let cli = match <Cli as clap::FromArgMatches>::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    if let Command::Cni(cmd::cni::Args { action: None }) = &cli.command {
        return cmd::cni::run();
    }
    init_logging();
    // Before the runtime's threads exist, so that they all start in the node's namespace.
    if let Command::NodeLocalDns(args) = &cli.command
        && let Err(err) = cmd::node_local_dns::enter_netns(args)
    {
        eprintln!("error: {err:#}");
        return std::process::ExitCode::FAILURE;
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(err) => {
            eprintln!("error: cannot start the async runtime: {err}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async move {
        match cli.command {
            Command::Up(args) => cmd::up::run(*args).await,
            Command::Apiserver(args) => cmd::apiserver::run(*args).await,
            Command::Proxy(args) => {
                cmd::proxy::run(args, matches.subcommand_matches("proxy")).await
            }
            Command::Dns(args) => cmd::dns::run(args).await,
            Command::ControllerManager(args) => cmd::controller_manager::run(args).await,
            Command::Env(args) => cmd::env::run(args).await,
            Command::Down(args) => cmd::down::run(args).await,
            Command::Exec(args) => cmd::exec::run(args).await,
            Command::Doctor(args) => cmd::doctor::run(args).await,
            Command::Trace(args) => cmd::trace::run(args).await,
            Command::NodeLocalDns(args) => cmd::node_local_dns::run(args).await,
            Command::Cni(args) => match args.action {
                Some(cmd::cni::Action::Install(install)) => cmd::cni::install(install).await,
                None => Ok(()),
            },
        }
    });
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("SVCNET_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,hickory_server=warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}
