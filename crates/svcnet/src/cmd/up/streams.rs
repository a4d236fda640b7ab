//! What `svcnet up` hands the API server so that kubectl's pod streams reach the pods the
//! node agents of this process run: log files (`kubectl logs`), processes started in a pod
//! (`exec`, `cp`), connections into a pod's network namespace (`port-forward`) and running
//! containers' stdio (`attach`). The API server knows none of the agent's internals.

/// `kubectl logs` reads the files the node agents capture in the data dir.
pub(super) fn log_source(data_dir: &std::path::Path) -> svcnet_apiserver::LogSource {
    let dir = data_dir.to_path_buf();
    svcnet_apiserver::LogSource::new(move |target| {
        svcnet_agent::logs::find_log(
            &dir,
            target.namespace,
            target.pod,
            Some(target.container),
            target.previous,
        )
        .map_err(|e| e.to_string())
    })
}

/// `kubectl port-forward` connects to the pod's port from inside its network namespace.
pub(super) fn port_forward_source(
    data_dir: &std::path::Path,
) -> svcnet_apiserver::PortForwardSource {
    let dir = data_dir.to_path_buf();
    svcnet_apiserver::PortForwardSource::new(move |t| {
        svcnet_agent::exec::dial_port(&dir, &t.namespace, &t.pod, t.port)
    })
}

/// `kubectl attach` reaches the containers the agents of this process run.
pub(super) fn attach_source() -> svcnet_apiserver::AttachSource {
    use svcnet_agent::runtime::output;
    svcnet_apiserver::AttachSource::new(|t| {
        let running = output::find(&t.uid, &t.container).ok_or_else(|| {
            format!(
                "container {} in pod {}/{} is not running (nothing to attach to)",
                t.container, t.namespace, t.pod
            )
        })?;
        let (out_tx, out_rx) = tokio::sync::mpsc::channel(64);
        let mut sub = running.subscribe();
        tokio::spawn(async move {
            use tokio::sync::broadcast::error::RecvError;
            loop {
                match sub.recv().await {
                    Ok((ch, data)) => {
                        if out_tx.send((ch, bytes::Bytes::from(data))).await.is_err() {
                            return;
                        }
                    }
                    // A client that fell behind misses output rather than holding the container.
                    Err(RecvError::Lagged(_)) => {}
                    Err(RecvError::Closed) => return,
                }
            }
        });
        let stdin = match (&running.stdin, t.stdin) {
            (Some(pipe), true) => {
                let (in_tx, mut in_rx) = tokio::sync::mpsc::channel::<Option<bytes::Bytes>>(16);
                let (pipe, once) = (pipe.clone(), running.stdin_once);
                tokio::spawn(async move {
                    use tokio::io::AsyncWriteExt;
                    while let Some(Some(data)) = in_rx.recv().await {
                        let mut guard = pipe.lock().await;
                        let Some(w) = guard.as_mut() else { return };
                        if w.write_all(&data).await.is_err() || w.flush().await.is_err() {
                            return;
                        }
                    }
                    // The client's end of input (or its going away) closes the container's
                    // stdin only when the spec says stdinOnce, as the kubelet does.
                    if once {
                        pipe.lock().await.take();
                    }
                });
                Some(in_tx)
            }
            _ => None,
        };
        let sized = running.clone();
        let resize: Option<Box<dyn Fn(u16, u16) + Send + Sync>> =
            running.resize.is_some().then(|| {
                Box::new(move |rows, cols| {
                    if let Some(resize) = &sized.resize {
                        resize(rows, cols);
                    }
                }) as Box<dyn Fn(u16, u16) + Send + Sync>
            });
        Ok(svcnet_apiserver::Attached {
            output: out_rx,
            stdin,
            resize,
        })
    })
}

/// `kubectl exec` and `kubectl cp` run their command the way `svcnet exec` does: in the
/// pod's namespaces with the container's environment, on a terminal when asked (`-t`).
pub(super) fn exec_source(data_dir: &std::path::Path) -> svcnet_apiserver::ExecSource {
    use std::process::Stdio;
    let dir = data_dir.to_path_buf();
    svcnet_apiserver::ExecSource::new(move |t| {
        let record =
            svcnet_agent::exec::find_pod(&dir, &t.namespace, &t.pod).map_err(|e| e.to_string())?;
        let mut cmd =
            svcnet_agent::exec::exec_command(&record, Some(&t.container), &t.command, t.tty)
                .map_err(|e| e.to_string())?;
        let cannot = |e: std::io::Error| format!("cannot start {:?}: {e}", t.command.join(" "));
        if t.tty {
            let (rows, cols) = t.size.unwrap_or((24, 80));
            let pty = svcnet_netns::pty::Pty::open(rows, cols).map_err(cannot)?;
            cmd.stdin(pty.slave.try_clone().map_err(cannot)?)
                .stdout(pty.slave.try_clone().map_err(cannot)?)
                .stderr(pty.slave);
            let child = cmd.spawn().map_err(cannot)?;
            // The command holds the slave's copies; only the child may keep it open, so
            // the master sees the end once the child is gone.
            drop(cmd);
            let sizer = pty.master.try_clone().map_err(cannot)?;
            return Ok(svcnet_apiserver::ExecProcess {
                child,
                terminal: Some(pty.master),
                resize: Some(Box::new(move |rows, cols| {
                    let _ = svcnet_netns::pty::resize(&sizer, rows, cols);
                })),
            });
        }
        let stdin = if t.stdin {
            Stdio::piped()
        } else {
            Stdio::null()
        };
        cmd.stdin(stdin)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let child = cmd.spawn().map_err(cannot)?;
        Ok(svcnet_apiserver::ExecProcess {
            child,
            terminal: None,
            resize: None,
        })
    })
}
