//! Acknowledged writes survive `kill -9`: a child process (this test binary, re-executed) writes
#![allow(clippy::unwrap_used)]
//! and prints each acknowledged revision; the parent SIGKILLs it mid-stream, reopens the store
//! and checks that every acknowledged write is there.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

use serde_json::json;
use svcnet_store::{RedbStore, Store, StoreOptions};

const CHILD_ENV: &str = "SVCNET_STORE_KILL9_CHILD_DIR";

#[test]
#[ignore = "helper: runs only as the child process of kill9_loses_no_acknowledged_write"]
fn kill9_child_writer() {
    let Ok(dir) = std::env::var(CHILD_ENV) else {
        return;
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let s = RedbStore::open(format!("{dir}/store.redb"), StoreOptions::default()).unwrap();
        let mut out = std::io::stdout().lock();
        for i in 0u64.. {
            let v = s
                .create(
                    &format!("/k/{i}"),
                    json!({"metadata": {"name": i.to_string()}, "i": i}),
                )
                .await
                .unwrap();
            writeln!(
                out,
                "ACK {i} {}",
                v["metadata"]["resourceVersion"].as_str().unwrap()
            )
            .unwrap();
            out.flush().unwrap();
        }
    });
}

#[test]
fn kill9_loses_no_acknowledged_write() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "kill9_child_writer",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    let mut acked = Vec::new();
    while acked.len() < 150 {
        let line = lines.next().expect("child ended early").unwrap();
        if let Some(rest) = line.strip_prefix("ACK ") {
            let mut parts = rest.split(' ');
            let i: u64 = parts.next().unwrap().parse().unwrap();
            let rev: u64 = parts.next().unwrap().parse().unwrap();
            acked.push((i, rev));
        }
    }
    child.kill().unwrap(); // SIGKILL
    // Acknowledgements printed before the kill are still in the pipe.
    for line in lines {
        let Ok(line) = line else { break };
        if let Some(rest) = line.strip_prefix("ACK ") {
            let mut parts = rest.split(' ');
            let i: u64 = parts.next().unwrap().parse().unwrap();
            let rev: u64 = parts.next().unwrap().parse().unwrap();
            acked.push((i, rev));
        }
    }
    child.wait().unwrap();

    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let s = RedbStore::open(dir.path().join("store.redb"), StoreOptions::default()).unwrap();
        for (i, rev) in &acked {
            let v = s
                .get(&format!("/k/{i}"))
                .await
                .unwrap()
                .unwrap_or_else(|| panic!("acknowledged write {i} (rev {rev}) lost"));
            assert_eq!(v["metadata"]["resourceVersion"], rev.to_string());
        }
        let head = s.current_revision().await.unwrap();
        let last_acked = acked.iter().map(|(_, r)| *r).max().unwrap();
        assert!(
            head >= last_acked && head <= last_acked + 1,
            "head {head}, last acked {last_acked}"
        );
        // The store is still writable and continues the revision sequence.
        let v = s.create("/k/after", json!({"metadata": {}})).await.unwrap();
        assert_eq!(v["metadata"]["resourceVersion"], (head + 1).to_string());
    });
    eprintln!(
        "kill -9 after {} acknowledged writes: none lost",
        acked.len()
    );
}
