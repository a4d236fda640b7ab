//! The SPDY exec session driven as kubectl 1.29 drives it, with host processes standing in
//! for a pod's: streams counted against the query, output on its streams, stdin to its end,
//! the v4 exit Status on the error stream, and a start failure reported there.
#![allow(clippy::unwrap_used)]

use std::os::unix::process::CommandExt;
use std::process::Stdio;

use super::*;
use crate::config::ExecProcess;
use crate::spdy::test_client::Client;

fn host_source() -> ExecSource {
    ExecSource::new(|t| {
        let (program, args) = t.command.split_first().ok_or("empty command")?;
        let mut cmd = std::process::Command::new(program);
        cmd.args(args)
            .process_group(0)
            .stdin(if t.stdin {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let child = cmd
            .spawn()
            .map_err(|e| format!("cannot start {program}: {e}"))?;
        Ok(ExecProcess {
            child,
            terminal: None,
            resize: None,
        })
    })
}

fn target(command: &[&str]) -> ExecTarget {
    ExecTarget {
        namespace: "default".into(),
        pod: "p".into(),
        uid: "u".into(),
        container: "c".into(),
        command: command.iter().map(|s| s.to_string()).collect(),
        stdin: true,
        tty: false,
        size: None,
    }
}

fn start(command: &[&str]) -> Client {
    let (to_server, input) = mpsc::channel(16);
    let (out, from_server) = mpsc::channel(16);
    let channels = Channels {
        stdin: true,
        stdout: true,
        stderr: true,
        tty: false,
    };
    let work = Work::Exec(host_source(), target(command));
    tokio::spawn(Session::new(out, channels).run(input, work));
    Client::new(to_server, from_server)
}

/// A terminal session (`tty`) of `command` with or without stdin, as kubectl ≤ 1.29 opens
/// one; the client has not opened its streams yet.
fn terminal(source: ExecSource, command: &[&str], stdin: bool) -> Client {
    let (to_server, input) = mpsc::channel(16);
    let (out, from_server) = mpsc::channel(16);
    let channels = Channels {
        stdin,
        stdout: true,
        stderr: false,
        tty: true,
    };
    let work = Work::Exec(
        source,
        ExecTarget {
            stdin,
            tty: true,
            ..target(command)
        },
    );
    tokio::spawn(Session::new(out, channels).run(input, work));
    Client::new(to_server, from_server)
}

async fn open_all(c: &mut Client) {
    for (id, kind) in [(1, "error"), (3, "stdin"), (5, "stdout"), (7, "stderr")] {
        c.open_with(id, &[("streamType", &[kind])]).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_runs_with_its_streams_and_its_exit_code_comes_back() {
    let mut c = start(&["sh", "-c", "cat; echo err >&2; exit 3"]);
    open_all(&mut c).await;
    c.data(3, b"over ", false).await;
    c.data(3, b"spdy\n", true).await;
    let (out, _) = c.read_stream(5).await;
    assert_eq!(out, b"over spdy\n");
    let (err, _) = c.read_stream(7).await;
    assert_eq!(err, b"err\n");
    let (status, _) = c.read_stream(1).await;
    let status: Value = serde_json::from_slice(&status).unwrap();
    assert_eq!(status["reason"], "NonZeroExitCode", "{status}");
    assert_eq!(status["details"]["causes"][0]["message"], "3", "{status}");
    assert!(matches!(c.frame().await, Frame::GoAway { .. }));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_starts_before_every_stream_is_there_and_failures_are_statuses() {
    let mut c = start(&["/no/such/program"]);
    // Three of the four streams: replies, but no process and no status yet.
    for (id, kind) in [(1, "error"), (3, "stdin"), (5, "stdout")] {
        c.open_with(id, &[("streamType", &[kind])]).await;
    }
    for _ in 0..3 {
        match c.frame().await {
            // Every header block is read: the client's zlib context must stay in step.
            Frame::SynReply { headers, .. } => assert!(c.codec.decode(&headers).is_ok()),
            other => panic!("expected a reply, got {other:?}"),
        }
    }
    let early = tokio::time::timeout(std::time::Duration::from_millis(300), c.frame()).await;
    assert!(
        early.is_err(),
        "something happened before the last stream: {early:?}"
    );
    c.open_with(7, &[("streamType", &["stderr"])]).await;
    let (status, _) = c.read_stream(1).await;
    let status: Value = serde_json::from_slice(&status).unwrap();
    assert_eq!(status["reason"], "InternalError", "{status}");
    assert!(
        status["message"]
            .as_str()
            .unwrap()
            .contains("/no/such/program"),
        "{status}"
    );
}

/// A terminal session (kubectl 1.27–1.29 over SPDY): the process starts on the size the
/// client sends first, not on a default it resizes from later, and input typed before it
/// started reaches it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminal_starts_on_the_clients_first_size() {
    let started_with = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = started_with.clone();
    let inner = host_source();
    let source = ExecSource::new(move |t| {
        seen.lock().unwrap().push(t.size);
        inner.start(t)
    });
    let mut c = terminal(source.clone(), &["cat"], true);
    for (id, kind) in [(1, "error"), (3, "stdin"), (5, "stdout"), (7, "resize")] {
        c.open_with(id, &[("streamType", &[kind])]).await;
    }
    c.data(3, b"typed early\n", true).await;
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert!(
        started_with.lock().unwrap().is_empty(),
        "started before the size came"
    );
    c.data(7, b"{\"Width\":101,\"Height\":33}\n", false).await;
    let (out, _) = c.read_stream(5).await;
    assert_eq!(out, b"typed early\n");
    assert_eq!(*started_with.lock().unwrap(), vec![Some((33, 101))]);

    // A client that sends no size: the process starts anyway, after the short wait.
    let mut c = terminal(source, &["cat"], true);
    for (id, kind) in [(1, "error"), (3, "stdin"), (5, "stdout"), (7, "resize")] {
        c.open_with(id, &[("streamType", &[kind])]).await;
    }
    c.data(3, b"no size\n", true).await;
    let (out, _) = c.read_stream(5).await;
    assert_eq!(out, b"no size\n");
    assert_eq!(started_with.lock().unwrap()[1], None);
}

/// A terminal session: the process starts on the size kubectl sends right after its
/// streams (not on a default size), or, when none comes, on the default after a short wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminal_without_stdin_starts_on_the_first_size_or_after_a_wait() {
    for send_size in [true, false] {
        let seen = std::sync::Arc::new(std::sync::Mutex::new(None));
        let slot = seen.clone();
        let source = ExecSource::new(move |t| {
            *slot.lock().unwrap() = Some(t.size);
            let child = std::process::Command::new("true")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .map_err(|e| e.to_string())?;
            Ok(ExecProcess {
                child,
                terminal: None,
                resize: None,
            })
        });
        let mut c = terminal(source, &["true"], false);
        for (id, kind) in [(1, "error"), (5, "stdout"), (9, "resize")] {
            c.open_with(id, &[("streamType", &[kind])]).await;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        assert_eq!(*seen.lock().unwrap(), None, "started before the size");
        if send_size {
            c.data(9, br#"{"Width":77,"Height":21}"#, false).await;
            c.data(9, b"\n", false).await;
        }
        let (status, _) = c.read_stream(1).await;
        let status: Value = serde_json::from_slice(&status).unwrap();
        assert_eq!(status["status"], "Success", "{status}");
        let want = send_size.then_some((21, 77));
        assert_eq!(*seen.lock().unwrap(), Some(want));
    }
}
