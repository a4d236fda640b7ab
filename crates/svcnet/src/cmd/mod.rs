//! One module per subcommand.

pub mod addon;
pub mod apiserver;
pub mod cni;
pub mod controller_manager;
pub mod dns;
pub mod dns_options;
pub mod doctor;
pub mod down;
pub mod env;
pub mod etcd_flags;
pub mod exec;
pub mod kubeconfig;
pub mod node_local_dns;
pub mod pod_network;
pub mod proxy;
pub mod proxy_config;
pub mod trace;
mod trace_route;
mod trace_userspace;
pub mod up;

/// The help text of every `--data-dir`: where it is and how a relative one is read.
pub(crate) const DATA_DIR_HELP: &str = "Directory holding the store, certificates, the \
kubeconfig, IP allocations and pod logs. A relative path is taken from the directory svcnet is \
started in and made absolute once, at start-up (`scripts/up.sh` starts it from the repository \
root, so the default is `<repository>/svcnet-data`). Also read from SVCNET_DATA_DIR.";

/// A data dir made absolute against the current directory, once, at start-up: everything
/// below uses the absolute path, also after a pod's sandbox has changed into `/`.
pub(crate) fn absolute_data_dir(dir: &std::path::Path) -> anyhow::Result<std::path::PathBuf> {
    use anyhow::Context;
    std::path::absolute(dir)
        .with_context(|| format!("cannot resolve the data dir {}", dir.display()))
}

/// Listens for SIGINT and SIGTERM from now on and returns the future that resolves on either:
/// unlike [`shutdown_signal`], a signal that arrives before it is first polled (while the
/// process is still starting) is not lost, so start-up work can be cleaned up after it.
pub(crate) fn shutdown_listener() -> anyhow::Result<impl Future<Output = ()> + Send + 'static> {
    use anyhow::Context;
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("cannot listen for SIGTERM")?;
    let mut int = signal(SignalKind::interrupt()).context("cannot listen for SIGINT")?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    })
}

/// Resolves when the process is asked to stop: Ctrl-C (SIGINT) at a terminal, or SIGTERM as
/// a service manager or the kubelet sends it to a pod's process before killing it.
pub(crate) async fn shutdown_signal() -> anyhow::Result<()> {
    Shutdown::listen()?.requested().await;
    Ok(())
}

/// SIGINT and SIGTERM caught from the moment it is made: a signal that arrives before
/// [`Shutdown::requested`] is awaited (while `svcnet up` is still starting, say) is kept, where
/// the default action would kill the process and leave what it had set up so far. A second
/// signal exits at once, as a second Ctrl-C does in most tools.
pub(crate) struct Shutdown {
    rx: tokio::sync::watch::Receiver<bool>,
}

impl Shutdown {
    pub(crate) fn listen() -> anyhow::Result<Self> {
        use anyhow::Context;
        use tokio::signal::unix::{SignalKind, signal};
        let mut int = signal(SignalKind::interrupt()).context("cannot listen for SIGINT")?;
        let mut term = signal(SignalKind::terminate()).context("cannot listen for SIGTERM")?;
        let (tx, rx) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = int.recv() => {}
                    _ = term.recv() => {}
                }
                if *tx.borrow() {
                    eprintln!(
                        "asked to stop again: exiting at once (`svcnet down` removes what a \
                         `svcnet up` left)"
                    );
                    std::process::exit(130);
                }
                let _ = tx.send(true);
            }
        });
        Ok(Self { rx })
    }

    pub(crate) async fn requested(&mut self) {
        let _ = self.rx.wait_for(|asked| *asked).await;
    }
}
