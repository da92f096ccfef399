//! End-to-end tests of the `quorumlock` binary against real `redis-server` nodes
//! (started by the test kit). Every wait is bounded.

use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Output};
use std::time::{Duration, Instant};

use quorumlock::Redlock;
use quorumlock_testkit::LocalCluster;
use tokio::process::{Child, Command};

#[cfg(feature = "tls-rustls")]
#[path = "../../tests/support/pki.rs"]
#[allow(
    dead_code,
    reason = "the CLI's tests use part of the test certificates"
)]
mod pki;

const BIN: &str = env!("CARGO_BIN_EXE_quorumlock");
const USAGE: i32 = 64;
const UNAVAILABLE: i32 = 69;
const LOST: i32 = 70;
const BUSY: i32 = 75;
const MISMATCH: i32 = 78;

/// The binary with no nodes configured and quiet logs.
fn bare() -> Command {
    let mut c = Command::new(BIN);
    c.env_remove("QUORUMLOCK_NODES")
        .env_remove("QUORUMLOCK_LOG")
        .env_remove("QUORUMLOCK_FENCING_TOKEN")
        .env_remove("QUORUMLOCK_TLS_CA")
        .env_remove("QUORUMLOCK_TLS_CERT")
        .env_remove("QUORUMLOCK_TLS_KEY")
        .kill_on_drop(true);
    c
}

/// The binary with the cluster's nodes in `QUORUMLOCK_NODES`.
fn ql(cluster: &LocalCluster) -> Command {
    let mut c = bare();
    c.env("QUORUMLOCK_NODES", cluster.urls().join(","));
    c
}

/// `quorumlock run` on `resource` with extra options, running `sh -c script`.
fn run_sh(cluster: &LocalCluster, resource: &str, opts: &[&str], script: &str) -> Command {
    let mut c = ql(cluster);
    c.args(["run", "--resource", resource])
        .args(opts)
        .args(["--", "sh", "-c", script]);
    c
}

async fn output(cmd: &mut Command, limit: Duration) -> Output {
    tokio::time::timeout(limit, cmd.output())
        .await
        .expect("quorumlock did not finish in time")
        .expect("cannot start quorumlock")
}

async fn wait_exit(child: &mut Child, limit: Duration) -> ExitStatus {
    tokio::time::timeout(limit, child.wait())
        .await
        .expect("quorumlock did not exit in time")
        .expect("wait failed")
}

async fn wait_for_file(path: &Path, limit: Duration) {
    let deadline = Instant::now() + limit;
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "{} did not appear within {limit:?}",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn cluster(n: usize) -> LocalCluster {
    LocalCluster::launch(n)
        .await
        .expect("launch redis-server nodes")
}

async fn client(cluster: &LocalCluster) -> Redlock {
    // A fixed per-node timeout: the one derived from a 1 s probe's TTL (20 ms) times out
    // on a loaded 2-core machine.
    Redlock::builder(cluster.urls())
        .node_timeout(Duration::from_millis(300))
        .build()
        .await
        .expect("build client")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn tmp() -> tempfile::TempDir {
    tempfile::tempdir().expect("tempdir")
}

fn file(dir: &tempfile::TempDir, name: &str) -> PathBuf {
    dir.path().join(name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_runs_never_overlap() {
    let cluster = cluster(3).await;
    let dir = tmp();
    let marks = file(&dir, "marks");
    let script = r#"echo "start $$ $(date +%s%N)" >> "$MARKS"; sleep 0.3; echo "end $$ $(date +%s%N)" >> "$MARKS""#;
    let mut children = Vec::new();
    for _ in 0..3 {
        let mut c = run_sh(
            &cluster,
            "overlap",
            &["--ttl", "2s", "--wait", "20s"],
            script,
        );
        c.env("MARKS", &marks);
        children.push(c.spawn().expect("spawn"));
    }
    for child in &mut children {
        let status = wait_exit(child, Duration::from_secs(30)).await;
        assert_eq!(status.code(), Some(0));
    }
    let text = std::fs::read_to_string(&marks).expect("marks");
    let lines: Vec<Vec<&str>> = text.lines().map(|l| l.split(' ').collect()).collect();
    assert_eq!(lines.len(), 6, "{text}");
    let mut last_end = 0u128;
    for pair in lines.chunks(2) {
        let (start, end) = (&pair[0], &pair[1]);
        assert_eq!((start[0], end[0]), ("start", "end"), "interleaved:\n{text}");
        assert_eq!(start[1], end[1], "interleaved:\n{text}");
        let (t0, t1): (u128, u128) = (start[2].parse().unwrap(), end[2].parse().unwrap());
        assert!(last_end <= t0 && t0 <= t1, "overlapping intervals:\n{text}");
        last_end = t1;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_lock_is_not_run() {
    let cluster = cluster(3).await;
    let locks = client(&cluster).await;
    let held = locks
        .try_lock("busy", Duration::from_secs(30))
        .await
        .expect("take the lock");
    let dir = tmp();
    let marker = file(&dir, "ran");

    let out = output(
        run_sh(&cluster, "busy", &["--no-wait"], r#"touch "$MARKER""#).env("MARKER", &marker),
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(out.status.code(), Some(BUSY), "{}", stderr(&out));
    assert!(!marker.exists(), "COMMAND ran although the lock was held");
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("busy is held by another owner"), "{err}");
    assert!(err.contains("(2 needed)"), "{err}");

    let started = Instant::now();
    let out = output(
        run_sh(&cluster, "busy", &["--wait", "300ms"], r#"touch "$MARKER""#).env("MARKER", &marker),
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(out.status.code(), Some(BUSY), "{}", stderr(&out));
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert!(!marker.exists(), "COMMAND ran although the lock was held");
    assert!(
        stderr(&out).contains("gave up waiting for busy"),
        "{}",
        stderr(&out)
    );

    held.release().await.expect("release");
    let out = output(
        run_sh(&cluster, "busy", &["--no-wait"], r#"touch "$MARKER""#).env("MARKER", &marker),
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(marker.exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_run_keeps_the_lock() {
    let cluster = cluster(3).await;
    let locks = client(&cluster).await;
    let dir = tmp();
    let started_file = file(&dir, "started");
    let started = Instant::now();
    let mut child = run_sh(
        &cluster,
        "long",
        &["--ttl", "500ms"],
        r#"touch "$STARTED"; sleep 2.5"#,
    )
    .env("STARTED", &started_file)
    .spawn()
    .expect("spawn");
    wait_for_file(&started_file, Duration::from_secs(10)).await;

    let mut probes = 0;
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "run never ended"
        );
        match locks.try_lock("long", Duration::from_secs(1)).await {
            Err(e) if e.is_held() => probes += 1,
            // A probe whose nodes did not all answer in time (a loaded machine) says
            // nothing either way; only the probes that saw the lock held are counted.
            Err(e) if e.is_retryable() => {}
            Err(e) => panic!("probe failed with {e}"),
            Ok(lock) => {
                // Only acceptable if the run has just finished and released.
                lock.release().await.expect("release");
                let status = wait_exit(&mut child, Duration::from_secs(5)).await;
                break status;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(status.code(), Some(0));
    assert!(started.elapsed() >= Duration::from_millis(2500));
    assert!(probes >= 10, "only {probes} probes saw the lock held");
    // Released on exit: free at once, not after the TTL.
    locks
        .try_lock("long", Duration::from_secs(1))
        .await
        .expect("the run released its lock")
        .release()
        .await
        .expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_a_majority_stops_command() {
    let cluster = cluster(5).await;
    let dir = tmp();
    let started_file = file(&dir, "started");
    let marker = file(&dir, "terminated");
    let script = r#"trap 'echo term > "$MARKER"; kill $p 2>/dev/null; exit 0' TERM
touch "$STARTED"; sleep 30 & p=$!; wait $p"#;
    let child = run_sh(&cluster, "lost", &["--ttl", "1s", "--grace", "5s"], script)
        .env("STARTED", &started_file)
        .env("MARKER", &marker)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut child = child;
    let deadline = Instant::now() + Duration::from_secs(20);
    while !started_file.exists() {
        if let Ok(Some(status)) = child.try_wait() {
            let out = child.wait_with_output().await.expect("output");
            panic!(
                "quorumlock exited ({status}) before COMMAND started: {}",
                stderr(&out)
            );
        }
        assert!(
            Instant::now() < deadline,
            "COMMAND did not start within 20s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for i in 0..3 {
        cluster.kill(i).await.expect("kill node");
    }
    let killed = Instant::now();
    let out = tokio::time::timeout(Duration::from_secs(15), child.wait_with_output())
        .await
        .expect("quorumlock did not stop in time")
        .expect("wait");
    assert_eq!(out.status.code(), Some(LOST), "{}", stderr(&out));
    assert!(marker.exists(), "COMMAND did not get SIGTERM");
    assert!(
        killed.elapsed() < Duration::from_secs(5),
        "lost too late: {:?}",
        killed.elapsed()
    );
    assert!(stderr(&out).contains("lost"), "{}", stderr(&out));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_is_forwarded() {
    let cluster = cluster(3).await;
    let locks = client(&cluster).await;
    let dir = tmp();
    let started_file = file(&dir, "started");
    let marker = file(&dir, "terminated");
    let script = r#"trap 'echo term > "$MARKER"; kill $p 2>/dev/null; exit 7' TERM
touch "$STARTED"; sleep 30 & p=$!; wait $p"#;
    let mut child = run_sh(&cluster, "signal", &["--ttl", "2s"], script)
        .env("STARTED", &started_file)
        .env("MARKER", &marker)
        .spawn()
        .expect("spawn");
    wait_for_file(&started_file, Duration::from_secs(10)).await;
    let pid = libc::pid_t::try_from(child.id().expect("pid")).expect("pid");
    // SAFETY: kill(2) has no memory-safety preconditions.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let status = wait_exit(&mut child, Duration::from_secs(10)).await;
    assert_eq!(status.code(), Some(7), "COMMAND's status is not ours");
    assert!(marker.exists(), "COMMAND did not get the SIGTERM");
    locks
        .try_lock("signal", Duration::from_secs(1))
        .await
        .expect("released after the signal")
        .release()
        .await
        .expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_status_is_commands() {
    let cluster = cluster(3).await;
    let limit = Duration::from_secs(10);
    let out = output(&mut run_sh(&cluster, "status", &[], "exit 3"), limit).await;
    assert_eq!(out.status.code(), Some(3));
    let out = output(&mut run_sh(&cluster, "status", &[], "kill -KILL $$"), limit).await;
    assert_eq!(out.status.code(), Some(128 + 9));
    let out = output(
        ql(&cluster).args(["run", "-r", "status", "--", "/nonexistent/command"]),
        limit,
    )
    .await;
    assert_eq!(out.status.code(), Some(127), "{}", stderr(&out));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_arguments_are_usage_errors() {
    // One case per line: the words of the command line, `NODE` for a node URL and `''`
    // for an empty argument.
    let cases = [
        "",
        "frobnicate",
        "run --resource r -- true",
        "run --nodes NODE --resource r",
        "run --nodes NODE --resource r --ttl soon -- true",
        "run --nodes NODE --resource r --ttl 10ms -- true",
        "run --nodes NODE --resource r --no-wait --wait 1s -- true",
        "run --nodes not-a-url --resource r -- true",
        "run --nodes NODE --resource '' --no-wait -- true",
        "inspect --nodes NODE",
        "run --nodes NODE -r r --shared --write -- true",
        "run --nodes NODE -r r --shared --permits 2 -- true",
        "run --nodes NODE -r r --write --permits 2 -- true",
        "run --nodes NODE -r r --shared --fencing -- true",
        "run --nodes NODE -r r --permits 2 --fencing -- true",
        "run --nodes NODE -r r --permits 0 -- true",
        "run --nodes NODE -r r --permits 1000001 -- true",
        "run --nodes NODE -r r --permits two -- true",
    ];
    for case in cases {
        let args: Vec<&str> = case
            .split_whitespace()
            .map(|w| match w {
                "NODE" => "redis://127.0.0.1:1",
                "''" => "",
                w => w,
            })
            .collect();
        let out = output(bare().args(&args), Duration::from_secs(10)).await;
        assert_eq!(out.status.code(), Some(USAGE), "{case}: {}", stderr(&out));
    }
    let out = output(bare().args(["run", "--help"]), Duration::from_secs(10)).await;
    assert_eq!(out.status.code(), Some(0));
    let help = stdout(&out);
    for needle in [
        "Exit codes",
        "64",
        "69",
        "70",
        "75",
        "QUORUMLOCK_NODES",
        "--no-wait",
        "--shared",
        "--write",
        "--permits",
        "78",
    ] {
        assert!(help.contains(needle), "--help lacks {needle}:\n{help}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_quorum_is_unavailable_and_passwords_stay_hidden() {
    let cluster = cluster(3).await;
    cluster.kill(0).await.expect("kill");
    cluster.kill(1).await.expect("kill");
    let dir = tmp();
    let marker = file(&dir, "ran");
    for opts in [&["--no-wait"][..], &["--wait", "500ms"][..]] {
        let out = output(
            run_sh(&cluster, "noquorum", opts, r#"touch "$MARKER""#).env("MARKER", &marker),
            Duration::from_secs(15),
        )
        .await;
        assert_eq!(out.status.code(), Some(UNAVAILABLE), "{}", stderr(&out));
        assert!(!marker.exists());
    }
    let secret = "hunter2";
    let url = cluster
        .url(0)
        .expect("url")
        .replace("redis://", &format!("redis://app:{secret}@"));
    let out = output(
        bare().args(["run", "--nodes", &url, "-r", "x", "--no-wait", "--", "true"]),
        Duration::from_secs(15),
    )
    .await;
    assert_eq!(out.status.code(), Some(UNAVAILABLE), "{}", stderr(&out));
    assert!(!stderr(&out).contains(secret), "{}", stderr(&out));
    // A live node that refuses the credentials (no user `app` there): an error at start
    // that names the node without the password; lenient (QUORUMLOCK_LENIENT reads as a
    // switch: 1, yes, on, true, as --lenient), a failed vote.
    let live = cluster
        .url(2)
        .expect("url")
        .replace("redis://", &format!("redis://app:{secret}@"));
    for (lenient, code) in [("0", USAGE), ("1", UNAVAILABLE)] {
        let out = output(
            bare()
                .args([
                    "run",
                    "--nodes",
                    &live,
                    "-r",
                    "x",
                    "--no-wait",
                    "--",
                    "true",
                ])
                .env("QUORUMLOCK_LENIENT", lenient),
            Duration::from_secs(15),
        )
        .await;
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(code), "{err}");
        assert!(!err.contains(secret), "{err}");
        if code == USAGE {
            assert!(
                err.contains("refused this client's credentials")
                    && err.contains("<redacted>@127.0.0.1:"),
                "{err}"
            );
        }
    }
    let out = output(
        bare().args(["inspect", "x", "--nodes", &url]),
        Duration::from_secs(15),
    )
    .await;
    assert!(!stdout(&out).contains(secret), "{}", stdout(&out));
    assert!(stdout(&out).contains("<redacted>"), "{}", stdout(&out));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_shows_the_holder_then_free() {
    let cluster = cluster(3).await;
    let dir = tmp();
    let started_file = file(&dir, "started");
    let go = file(&dir, "go");
    let script = r#"touch "$STARTED"; i=0; while [ ! -e "$GO" ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done"#;
    let mut child = run_sh(&cluster, "inspected", &["--ttl", "5s"], script)
        .env("STARTED", &started_file)
        .env("GO", &go)
        .spawn()
        .expect("spawn");
    wait_for_file(&started_file, Duration::from_secs(10)).await;
    let out = output(
        ql(&cluster).args(["inspect", "inspected"]),
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("verdict: held by ") && text.contains(" on 3/3 nodes (quorum 2), "),
        "{text}"
    );
    assert_eq!(text.matches("held by ").count(), 4, "{text}");
    assert!(text.contains('…'), "{text}");

    std::fs::write(&go, "").expect("touch go");
    assert_eq!(
        wait_exit(&mut child, Duration::from_secs(10)).await.code(),
        Some(0)
    );
    let out = output(
        ql(&cluster).args(["inspect", "inspected"]),
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stdout(&out).contains("verdict: free"), "{}", stdout(&out));

    // With a node down, it is shown as failed.
    cluster.kill(2).await.expect("kill");
    let out = output(
        ql(&cluster).args(["inspect", "inspected"]),
        Duration::from_secs(10),
    )
    .await;
    assert!(stdout(&out).contains("failed: "), "{}", stdout(&out));
    assert!(stdout(&out).contains("verdict: free"), "{}", stdout(&out));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_json_reports_every_node() {
    let cluster = cluster(3).await;
    let locks = client(&cluster).await;
    let lock = locks
        .try_lock("json:held", Duration::from_secs(30))
        .await
        .expect("lock");
    let out = output(
        ql(&cluster).args(["inspect", "--json", "json:held", "json:\"free\""]),
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    assert_eq!(text.lines().count(), 1, "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
    assert_eq!(v["nodes"], 3);
    assert_eq!(v["quorum"], 2);
    let held = &v["resources"][0];
    assert_eq!(held["resource"], "json:held");
    assert_eq!(held["verdict"], "held");
    let prefix = held["holder"].as_str().expect("holder");
    assert_eq!(prefix.len(), 8);
    assert!(lock.token().starts_with(prefix));
    assert!(!text.contains(lock.token()), "{text}");
    assert_eq!(held["holder_nodes"], 3);
    assert_eq!(held["free_nodes"], serde_json::Value::Null);
    let ttl = held["ttl_ms"].as_u64().expect("ttl_ms");
    assert!((20_000..=30_000).contains(&ttl), "{ttl}");
    assert_eq!(held["answered"], 3);
    assert_eq!(held["fence"], serde_json::Value::Null);
    assert_eq!(held["queued"], 0);
    let nodes = held["nodes"].as_array().expect("nodes");
    assert_eq!(nodes.len(), 3);
    assert_eq!(
        nodes.iter().filter(|n| n["herald"] == true).count(),
        2,
        "{text}"
    );
    for n in nodes {
        assert_eq!(n["state"], "answered");
        assert_eq!(n["error"], serde_json::Value::Null);
        assert_eq!(n["holder"], prefix);
        assert!(n["ttl_ms"].as_u64().is_some());
    }
    let free = &v["resources"][1];
    assert_eq!(free["resource"], "json:\"free\"");
    assert_eq!(free["verdict"], "free");
    assert_eq!(free["free_nodes"], 3);
    assert_eq!(free["holder"], serde_json::Value::Null);

    // Two of three nodes down: unknown, each down node failed, exit 69.
    cluster.kill(0).await.expect("kill");
    cluster.kill(1).await.expect("kill");
    let out = output(
        ql(&cluster).args(["inspect", "--json", "json:held"]),
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(out.status.code(), Some(UNAVAILABLE), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).expect("valid JSON");
    let r = &v["resources"][0];
    assert_eq!(r["verdict"], "unknown");
    assert_eq!(r["answered"], 1);
    assert_eq!(r["nodes"][0]["state"], "failed");
    assert!(
        r["nodes"][0]["error"]
            .as_str()
            .is_some_and(|e| !e.is_empty())
    );
    assert_eq!(r["nodes"][2]["state"], "answered");
    let out = output(
        ql(&cluster).args(["inspect", "json:held"]),
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(out.status.code(), Some(UNAVAILABLE));
    assert!(
        stdout(&out).contains("verdict: unknown: only 1/3 nodes answered (quorum 2)"),
        "{}",
        stdout(&out)
    );
    drop(lock);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_token_is_passed_to_command() {
    let cluster = cluster(3).await;
    let dir = tmp();
    let out_file = file(&dir, "tokens");
    let script = r#"echo "${QUORUMLOCK_FENCING_TOKEN-unset} $QUORUMLOCK_RESOURCE" >> "$OUT""#;
    for opts in [&["--fencing"][..], &["--fencing"][..], &[][..]] {
        let out = output(
            run_sh(&cluster, "fenced", opts, script).env("OUT", &out_file),
            Duration::from_secs(10),
        )
        .await;
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    }
    let text = std::fs::read_to_string(&out_file).expect("tokens");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    let tokens: Vec<u64> = lines[..2]
        .iter()
        .map(|l| {
            let (t, res) = l.split_once(' ').expect("two fields");
            assert_eq!(res, "fenced");
            t.parse().unwrap_or_else(|_| panic!("not a number: {l}"))
        })
        .collect();
    assert!(tokens[1] > tokens[0], "{tokens:?}");
    assert_eq!(
        lines[2], "unset fenced",
        "the token leaks without --fencing"
    );

    // Writers of the read-write lock get tokens too, from their own counter.
    let out_file = file(&dir, "writers");
    for _ in 0..2 {
        let out = output(
            run_sh(&cluster, "fenced", &["--write", "--fencing"], script).env("OUT", &out_file),
            Duration::from_secs(10),
        )
        .await;
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    }
    let text = std::fs::read_to_string(&out_file).expect("tokens");
    let tokens: Vec<u64> = text
        .lines()
        .map(|l| {
            let (t, _) = l.split_once(' ').expect("two fields");
            t.parse().unwrap_or_else(|_| panic!("not a number: {l}"))
        })
        .collect();
    assert_eq!(tokens.len(), 2, "{text}");
    assert!(tokens[1] > tokens[0], "{tokens:?}");
}

/// Marks a run's interval: `start KIND PID NS` once it holds the lock, `end KIND PID NS`
/// before it lets go. `$KIND` tells the kinds of run apart.
const MARK_START: &str = r#"echo "start $KIND $$ $(date +%s%N)" >> "$MARKS""#;
const MARK_END: &str = r#"echo "end $KIND $$ $(date +%s%N)" >> "$MARKS""#;

/// A script that marks its interval and, in between, waits until `$PEERS` runs have
/// started (bounded: exit 9 after 20 s). It only ends well if `$PEERS` runs held the lock
/// at the same time: the overlap is proven by the runs themselves, not by timing.
fn barrier_script() -> String {
    format!(
        r#"{MARK_START}; i=0; while [ "$(grep -c '^start' "$MARKS")" -lt "$PEERS" ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done; [ "$(grep -c '^start' "$MARKS")" -ge "$PEERS" ] || exit 9; {MARK_END}"#
    )
}

/// One run's interval, read back from the marks.
#[derive(Debug)]
struct Interval {
    kind: String,
    start: u128,
    end: u128,
}

/// The intervals in `marks`, one per run (matched by kind and pid), each well formed.
fn intervals(marks: &Path) -> Vec<Interval> {
    let text = std::fs::read_to_string(marks).expect("marks");
    let mut open: Vec<(String, String, u128)> = Vec::new();
    let mut done = Vec::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        assert_eq!(f.len(), 4, "bad mark {line:?} in:\n{text}");
        let t: u128 = f[3].parse().expect("a timestamp");
        match f[0] {
            "start" => open.push((f[1].to_string(), f[2].to_string(), t)),
            "end" => {
                let i = open
                    .iter()
                    .position(|(k, pid, _)| k == f[1] && pid == f[2])
                    .unwrap_or_else(|| panic!("end without start: {line:?} in:\n{text}"));
                let (kind, _, start) = open.swap_remove(i);
                assert!(start <= t, "ends before it starts:\n{text}");
                done.push(Interval {
                    kind,
                    start,
                    end: t,
                });
            }
            other => panic!("bad mark {other:?} in:\n{text}"),
        }
    }
    assert!(open.is_empty(), "runs that never ended:\n{text}");
    done
}

/// The most intervals that were open at one instant (an end and a start at the same
/// nanosecond do not overlap).
fn max_overlap(intervals: &[Interval]) -> usize {
    let mut events: Vec<(u128, i32)> = intervals
        .iter()
        .flat_map(|i| [(i.start, 1), (i.end, -1)])
        .collect();
    events.sort();
    let (mut open, mut max) = (0i32, 0i32);
    for (_, d) in events {
        open += d;
        max = max.max(open);
    }
    usize::try_from(max).unwrap_or(0)
}

/// Spawns `run` with `opts`, running `script` with `$MARKS`, `$KIND` and `$PEERS` set.
fn spawn_marked(
    cluster: &LocalCluster,
    resource: &str,
    opts: &[&str],
    script: &str,
    marks: &Path,
    kind: &str,
    peers: usize,
) -> Child {
    run_sh(cluster, resource, opts, script)
        .env("MARKS", marks)
        .env("KIND", kind)
        .env("PEERS", peers.to_string())
        .spawn()
        .expect("spawn")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_runs_overlap() {
    let cluster = cluster(3).await;
    let dir = tmp();
    let marks = file(&dir, "marks");
    let script = barrier_script();
    let opts = ["--shared", "--ttl", "2s", "--wait", "20s"];
    let mut children: Vec<Child> = (0..2)
        .map(|_| spawn_marked(&cluster, "shared", &opts, &script, &marks, "r", 2))
        .collect();
    for child in &mut children {
        let status = wait_exit(child, Duration::from_secs(30)).await;
        assert_eq!(
            status.code(),
            Some(0),
            "a reader did not see the other one in"
        );
    }
    let runs = intervals(&marks);
    assert_eq!(runs.len(), 2, "{runs:?}");
    assert_eq!(max_overlap(&runs), 2, "{runs:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_and_write_runs_never_overlap() {
    let cluster = cluster(3).await;
    let dir = tmp();
    let marks = file(&dir, "marks");
    let script = format!("{MARK_START}; sleep 0.2; {MARK_END}");
    let mut children = Vec::new();
    for kind in ["r", "w", "r", "w", "r"] {
        let side = if kind == "r" { "--shared" } else { "--write" };
        let opts = [side, "--ttl", "2s", "--wait", "30s"];
        children.push(spawn_marked(
            &cluster, "rw", &opts, &script, &marks, kind, 0,
        ));
    }
    for child in &mut children {
        let status = wait_exit(child, Duration::from_secs(45)).await;
        assert_eq!(status.code(), Some(0));
    }
    let runs = intervals(&marks);
    assert_eq!(runs.len(), 5, "{runs:?}");
    for (i, w) in runs.iter().enumerate().filter(|(_, r)| r.kind == "w") {
        for (j, other) in runs.iter().enumerate() {
            let apart = other.end <= w.start || w.end <= other.start;
            assert!(i == j || apart, "a writer overlapped a run: {runs:?}");
        }
    }

    // Busy sides fail at once with --no-wait, as the mutex does; COMMAND does not run.
    let locks = client(&cluster).await;
    let ran = file(&dir, "ran");
    let reader = locks
        .try_read_lock("rw", Duration::from_secs(30))
        .await
        .expect("read lock");
    let out = output(
        run_sh(&cluster, "rw", &["--write", "--no-wait"], r#"touch "$RAN""#).env("RAN", &ran),
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(out.status.code(), Some(BUSY), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("rw is held by readers or a writer"),
        "{}",
        stderr(&out)
    );
    assert!(!ran.exists(), "a writer ran beside a reader");
    reader.release().await.expect("release");
    let writer = locks
        .try_write_lock("rw", Duration::from_secs(30))
        .await
        .expect("write lock");
    let out = output(
        run_sh(
            &cluster,
            "rw",
            &["--shared", "--wait", "300ms"],
            r#"touch "$RAN""#,
        )
        .env("RAN", &ran),
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(out.status.code(), Some(BUSY), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("gave up waiting for a read lock on rw"),
        "{}",
        stderr(&out)
    );
    assert!(!ran.exists(), "a reader ran beside a writer");
    writer.release().await.expect("release");

    // The mutex of the same name is another lock: it does not hold back a reader.
    let mutex = locks
        .try_lock("rw", Duration::from_secs(30))
        .await
        .expect("mutex");
    let out = output(
        run_sh(
            &cluster,
            "rw",
            &["--shared", "--no-wait"],
            r#"touch "$RAN""#,
        )
        .env("RAN", &ran),
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(ran.exists());
    mutex.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_and_permit_runs_keep_their_lock_alive() {
    let cluster = cluster(3).await;
    let locks = client(&cluster).await;
    let one = locks.semaphore("kept", 1).expect("semaphore");
    let dir = tmp();
    for (i, side) in [&["--shared"][..], &["--permits", "1"][..]]
        .iter()
        .enumerate()
    {
        let started_file = file(&dir, &format!("started{i}"));
        let go = file(&dir, &format!("go{i}"));
        let script = r#"touch "$STARTED"; i=0; while [ ! -e "$GO" ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done"#;
        let mut opts = side.to_vec();
        opts.extend(["--ttl", "500ms"]);
        let mut child = run_sh(&cluster, "kept", &opts, script)
            .env("STARTED", &started_file)
            .env("GO", &go)
            .spawn()
            .expect("spawn");
        wait_for_file(&started_file, Duration::from_secs(10)).await;
        // Over three TTLs, the lock stays taken: extended, not expired.
        let probing = Instant::now();
        while probing.elapsed() < Duration::from_millis(1600) {
            let probe = if i == 0 {
                locks.try_write_lock("kept", Duration::from_secs(1)).await
            } else {
                one.try_acquire(Duration::from_secs(1)).await
            };
            match probe {
                Err(e) if e.is_held() => {}
                Err(e) => panic!("{side:?}: probe failed with {e}"),
                Ok(_) => panic!("{side:?}: the run's lock expired while COMMAND ran"),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        std::fs::write(&go, "").expect("touch go");
        assert_eq!(
            wait_exit(&mut child, Duration::from_secs(10)).await.code(),
            Some(0)
        );
        // Released on exit: free at once, not after the TTL.
        let lock = if i == 0 {
            locks.try_write_lock("kept", Duration::from_secs(1)).await
        } else {
            one.try_acquire(Duration::from_secs(1)).await
        };
        lock.unwrap_or_else(|e| panic!("{side:?}: not released: {e}"))
            .release()
            .await
            .expect("release");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_permits_admit_two_of_three_runs() {
    // One node: the per-node limit is P itself, so exactly P runs fit.
    let cluster = cluster(1).await;
    let locks = client(&cluster).await;
    let sem = locks.semaphore("pool", 2).expect("semaphore");
    assert_eq!(sem.capacity(), 2);
    let dir = tmp();
    let marks = file(&dir, "marks");
    let script = barrier_script();
    let opts = ["--permits", "2", "--ttl", "2s", "--wait", "30s"];
    let mut children: Vec<Child> = (0..3)
        .map(|_| spawn_marked(&cluster, "pool", &opts, &script, &marks, "p", 2))
        .collect();
    for child in &mut children {
        let status = wait_exit(child, Duration::from_secs(45)).await;
        assert_eq!(
            status.code(),
            Some(0),
            "a holder did not see a second one in"
        );
    }
    let mut runs = intervals(&marks);
    assert_eq!(runs.len(), 3, "{runs:?}");
    assert_eq!(max_overlap(&runs), 2, "{runs:?}");
    // The third one waited until one of the first two let go.
    runs.sort_by_key(|r| r.start);
    assert!(
        runs[2].start >= runs[0].end.min(runs[1].end),
        "three held a permit at once: {runs:?}"
    );

    // With both permits held the third fails at once with --no-wait, or after --wait.
    let held = [
        sem.try_acquire(Duration::from_secs(30)).await.expect("1st"),
        sem.try_acquire(Duration::from_secs(30)).await.expect("2nd"),
    ];
    let ran = file(&dir, "ran");
    let out = output(
        run_sh(
            &cluster,
            "pool",
            &["--permits", "2", "--no-wait"],
            r#"touch "$RAN""#,
        )
        .env("RAN", &ran),
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(out.status.code(), Some(BUSY), "{}", stderr(&out));
    assert!(!ran.exists(), "COMMAND ran without a permit");
    assert!(
        stderr(&out).contains("all permits of pool are taken"),
        "{}",
        stderr(&out)
    );
    for permit in held {
        permit.release().await.expect("release");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permits_on_three_nodes() {
    let cluster = cluster(3).await;
    let locks = client(&cluster).await;
    let dir = tmp();

    // Four permits: three runs hold one at once (each proves it saw the other two).
    let marks = file(&dir, "four");
    let script = barrier_script();
    let opts = ["--permits", "4", "--ttl", "2s", "--wait", "30s"];
    let mut children: Vec<Child> = (0..3)
        .map(|_| spawn_marked(&cluster, "four", &opts, &script, &marks, "p", 3))
        .collect();
    for child in &mut children {
        let status = wait_exit(child, Duration::from_secs(45)).await;
        assert_eq!(
            status.code(),
            Some(0),
            "three holders of four permits did not overlap"
        );
    }
    assert_eq!(max_overlap(&intervals(&marks)), 3);

    // Two permits on three nodes: the default quorum (all three) lets both in, never
    // more; the others wait their turn.
    let sem = locks.semaphore("two", 2).expect("semaphore");
    let capacity = usize::try_from(sem.capacity()).expect("small");
    assert_eq!((capacity, sem.quorum()), (2, 3), "{sem:?}");
    let marks = file(&dir, "two");
    let script = format!("{MARK_START}; sleep 0.2; {MARK_END}");
    let opts = ["--permits", "2", "--ttl", "2s", "--wait", "30s"];
    let mut children: Vec<Child> = (0..3)
        .map(|_| spawn_marked(&cluster, "two", &opts, &script, &marks, "p", 0))
        .collect();
    for child in &mut children {
        let status = wait_exit(child, Duration::from_secs(45)).await;
        assert_eq!(status.code(), Some(0));
    }
    let runs = intervals(&marks);
    assert_eq!(runs.len(), 3, "{runs:?}");
    assert!(max_overlap(&runs) <= capacity, "{runs:?}");

    // Full: a run waits up to --wait, then fails as the mutex does, and says why.
    let mut held = Vec::new();
    for _ in 0..capacity {
        held.push(
            sem.try_acquire(Duration::from_secs(30))
                .await
                .expect("permit"),
        );
    }
    let ran = file(&dir, "ran");
    let started = Instant::now();
    let out = output(
        run_sh(
            &cluster,
            "two",
            &["--permits", "2", "--wait", "300ms"],
            r#"touch "$RAN""#,
        )
        .env("RAN", &ran),
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(out.status.code(), Some(BUSY), "{}", stderr(&out));
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert!(!ran.exists(), "COMMAND ran without a permit");
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("gave up waiting for a permit of two"), "{err}");
    assert!(
        err.contains(&format!("at most {capacity} of the 2 permits")),
        "{err}"
    );
    for permit in held {
        permit.release().await.expect("release");
    }
    let out = output(
        run_sh(
            &cluster,
            "two",
            &["--permits", "2", "--no-wait"],
            r#"touch "$RAN""#,
        )
        .env("RAN", &ran),
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(ran.exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mismatched_permits_exit_78() {
    let cluster = cluster(3).await;
    let locks = client(&cluster).await;
    let three = locks.semaphore("mixed", 3).expect("semaphore");
    let permit = three
        .try_acquire(Duration::from_secs(30))
        .await
        .expect("permit");
    let dir = tmp();
    let ran = file(&dir, "ran");
    for opts in [
        &["--permits", "2", "--no-wait"][..],
        &["--permits", "2", "--wait", "20s"][..],
    ] {
        let started = Instant::now();
        let out = output(
            run_sh(&cluster, "mixed", opts, r#"touch "$RAN""#).env("RAN", &ran),
            Duration::from_secs(15),
        )
        .await;
        assert_eq!(out.status.code(), Some(MISMATCH), "{}", stderr(&out));
        // Not retried: waiting cannot fix it.
        assert!(started.elapsed() < Duration::from_secs(10), "{opts:?}");
        assert!(!ran.exists(), "COMMAND ran with a mismatched semaphore");
        let err = stderr(&out);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.contains("--permits 2 does not match: mixed is in use with 3 permits"),
            "{err}"
        );
    }
    // The same P is welcome; once the last holder is gone, so is another P.
    let out = output(
        &mut run_sh(&cluster, "mixed", &["--permits", "3", "--no-wait"], "true"),
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    permit.release().await.expect("release");
    // The release returns at its quorum; the next run needs all three nodes (quorum 3 for
    // 2 permits on 3 nodes), so the release must have landed on every one.
    assert!(locks.flush(Duration::from_secs(10)).await, "release landed");
    let out = output(
        run_sh(
            &cluster,
            "mixed",
            &["--permits", "2", "--no-wait"],
            r#"touch "$RAN""#,
        )
        .env("RAN", &ran),
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(ran.exists());
}

/// Lock groups in `QUORUMLOCK_NODES` (separated by `;`) with `QUORUMLOCK_GROUPS_VERSION`:
/// the binary routes a resource to the same group as the library, inspects that group's
/// nodes, and is refused (78) with another map.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn groups_in_quorumlock_nodes() {
    let (a, b) = (cluster(3).await, cluster(3).await);
    let locks = Redlock::builder(a.urls())
        .group(b.urls())
        .groups_version(1)
        .build()
        .await
        .expect("sharded client");
    let name = (0..1000)
        .map(|i| format!("report-{i}"))
        .find(|n| locks.group_of(n) == 1)
        .expect("a name in the second group");
    let held = locks
        .try_lock(&name, Duration::from_secs(30))
        .await
        .expect("take the lock");
    let nodes = format!("{};{}", a.urls().join(","), b.urls().join(","));
    let grouped = |version: &str| {
        let mut c = bare();
        c.env("QUORUMLOCK_NODES", &nodes)
            .env("QUORUMLOCK_GROUPS_VERSION", version);
        c
    };
    let dir = tmp();
    let ran = file(&dir, "ran");
    let out = output(
        grouped("1")
            .args(["run", "--resource", &name, "--no-wait", "--"])
            .args(["sh", "-c", r#"touch "$RAN""#])
            .env("RAN", &ran),
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(out.status.code(), Some(BUSY), "{}", stderr(&out));
    assert!(!ran.exists(), "COMMAND ran although the lock was held");

    // inspect shows the resource's group: B's three nodes, the holder on all of them.
    let out = output(
        grouped("1").args(["inspect", &name]),
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("verdict: held by ") && text.contains(" on 3/3 nodes (quorum 2), "),
        "{text}"
    );
    for i in 0..3 {
        let (pa, pb) = (a.port(i).expect("port"), b.port(i).expect("port"));
        assert!(text.contains(&format!(":{pb}")), "{text}");
        assert!(!text.contains(&format!(":{pa}")), "{text}");
    }
    held.release().await.expect("release");
    let out = output(
        grouped("1")
            .args(["run", "--resource", &name, "--no-wait", "--"])
            .args(["sh", "-c", r#"touch "$RAN""#])
            .env("RAN", &ran),
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(ran.exists());

    // Another version while the library client's map is recorded: refused, not run.
    std::fs::remove_file(&ran).expect("rm");
    let out = output(
        grouped("2")
            .args(["run", "--resource", &name, "--no-wait", "--"])
            .args(["sh", "-c", r#"touch "$RAN""#])
            .env("RAN", &ran),
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(out.status.code(), Some(MISMATCH), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("group map mismatch"),
        "{}",
        stderr(&out)
    );
    assert!(!ran.exists(), "COMMAND ran with another group map");

    // An empty group is a usage error that names the groups.
    let mut c = bare();
    c.env("QUORUMLOCK_NODES", format!("{nodes};"))
        .args(["run", "--resource", "x", "--", "true"]);
    let out = output(&mut c, Duration::from_secs(10)).await;
    assert_eq!(out.status.code(), Some(USAGE), "{}", stderr(&out));
    assert!(stderr(&out).contains("group #3"), "{}", stderr(&out));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_oversells_without_and_not_with_the_lock() {
    let out = output(
        bare().args(["demo", "--stock", "5", "--buyers", "40"]),
        Duration::from_secs(60),
    )
    .await;
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}\n{}", stderr(&out));
    assert!(text.contains("OVERSOLD by"), "{text}");
    assert!(text.contains("sold 5 of 5: exactly right"), "{text}");
    assert!(text.contains("was killed"), "{text}");
    // The third act, lock-free with one atomic operation, never oversells either.
    let third = text.split("3. lock-free").nth(1).expect("a third act");
    assert!(third.contains("sold 5 of 5: exactly right"), "{text}");
}

/// Voters that are Redis Clusters go in `QUORUMLOCK_NODES` like masters: each
/// `redis+cluster://` URL keeps its comma-separated seeds, and the command runs under the
/// lock on the three clusters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_runs_on_cluster_voters() {
    use quorumlock_testkit::{ClusterVoters, Faults};
    let voters = ClusterVoters::launch(3, 2, 0)
        .await
        .expect("three local Redis Clusters");
    let urls = voters.urls();
    assert!(
        urls.iter().all(|u| u.contains(',')),
        "several seeds each: {urls:?}"
    );
    let mut c = bare();
    c.env("QUORUMLOCK_NODES", urls.join(",")).args([
        "run",
        "--resource",
        "cli:cluster",
        "--",
        "sh",
        "-c",
        "echo ran",
    ]);
    let out = output(&mut c, Duration::from_secs(30)).await;
    assert!(
        out.status.success(),
        "{:?}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ran");
    // Held by the library on the same voters, the resource is busy for the CLI.
    let locks = Redlock::builder(urls.clone()).build().await.expect("build");
    let held = locks
        .try_lock("cli:cluster", Duration::from_secs(30))
        .await
        .expect("free after the run");
    let mut c = bare();
    c.env("QUORUMLOCK_NODES", urls.join(",")).args([
        "run",
        "--resource",
        "cli:cluster",
        "--no-wait",
        "--",
        "sh",
        "-c",
        "echo ran",
    ]);
    let out = output(&mut c, Duration::from_secs(30)).await;
    assert_eq!(
        out.status.code(),
        Some(BUSY),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    held.release().await.expect("release");
}

/// `run` and `inspect` against TLS nodes that require a client certificate.
#[cfg(feature = "tls-rustls")]
mod tls {
    use super::pki::Pki;
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn tls_client_certificate_from_flags_or_environment() {
        let pki = Pki::new("A");
        let me = pki.client_cert("cli");
        let (cert, key) = pki.write_client(&me, "client");
        let cluster = pki.cluster_requiring_client_certs(3).await;
        let dir = tmp();
        let marker = file(&dir, "ran");
        let ca = pki.path("ca.pem");

        // Flags.
        let mut cmd = ql(&cluster);
        cmd.args(["run", "--resource", "tls:cli", "--no-wait", "--tls-ca"])
            .arg(&ca)
            .arg("--tls-cert")
            .arg(&cert)
            .arg("--tls-key")
            .arg(&key)
            .args(["--", "sh", "-c", r#"touch "$MARKER""#])
            .env("MARKER", &marker);
        let out = output(&mut cmd, Duration::from_secs(30)).await;
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        assert!(marker.exists(), "COMMAND ran under the lock");

        // Environment variables, with inspect.
        let mut cmd = ql(&cluster);
        cmd.args(["inspect", "tls:cli", "--json", "--timeout", "5s"])
            .env("QUORUMLOCK_TLS_CA", &ca)
            .env("QUORUMLOCK_TLS_CERT", &cert)
            .env("QUORUMLOCK_TLS_KEY", &key);
        let out = output(&mut cmd, Duration::from_secs(30)).await;
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        let json: serde_json::Value = serde_json::from_str(&stdout(&out)).expect("JSON");
        let shown = json.to_string();
        assert_eq!(
            shown.matches("\"state\":\"answered\"").count(),
            3,
            "every node answered: {shown}"
        );

        // Without a client certificate: every node refuses, a clear message at start,
        // exit 64; with --lenient, every vote fails with it, exit 69.
        for (lenient, code) in [(false, USAGE), (true, UNAVAILABLE)] {
            let _ = std::fs::remove_file(&marker);
            let mut cmd = ql(&cluster);
            cmd.args(["run", "--resource", "tls:cli", "--no-wait", "--tls-ca"])
                .arg(&ca)
                .args(lenient.then_some("--lenient"))
                .args(["--", "sh", "-c", r#"touch "$MARKER""#])
                .env("MARKER", &marker)
                .env("QUORUMLOCK_LOG", "debug");
            let out = output(&mut cmd, Duration::from_secs(30)).await;
            assert_eq!(out.status.code(), Some(code), "{}", stderr(&out));
            let err = stderr(&out);
            assert!(
                err.contains("client certificate refused by the server"),
                "{err}"
            );
            assert!(!marker.exists(), "COMMAND did not run");
        }

        // With the certificate, debug logs never show the key.
        let mut cmd = ql(&cluster);
        cmd.args(["inspect", "tls:cli", "--tls-ca"])
            .arg(&ca)
            .arg("--tls-cert")
            .arg(&cert)
            .arg("--tls-key")
            .arg(&key)
            .env("QUORUMLOCK_LOG", "trace");
        let out = output(&mut cmd, Duration::from_secs(30)).await;
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        let all = format!("{}{}", stdout(&out), stderr(&out));
        assert!(!all.contains("PRIVATE KEY-----"), "{all}");
        for secret in me.secrets() {
            assert!(!all.contains(secret), "key material in the output: {all}");
        }
    }

    #[tokio::test]
    async fn tls_flags_that_do_not_fit_are_usage_errors() {
        let pki = Pki::new("A");
        let me = pki.client_cert("cli");
        let (cert, key) = pki.write_client(&me, "client");
        let missing = pki.path("missing.pem");
        let node = "rediss://127.0.0.1:1";
        let path = |p: &PathBuf| p.to_string_lossy().into_owned();
        let (cert, key, missing) = (path(&cert), path(&key), path(&missing));
        let cases: Vec<(&str, Vec<&str>, &str)> = vec![
            (
                "a certificate without a key",
                vec!["--tls-cert", &cert],
                "--tls-key",
            ),
            (
                "a key without a certificate",
                vec!["--tls-key", &key],
                "--tls-cert",
            ),
            (
                "an unreadable certificate",
                vec!["--tls-cert", &missing, "--tls-key", &key],
                "--tls-cert",
            ),
            (
                "the key in place of the certificate",
                vec!["--tls-cert", &key, "--tls-key", &key],
                "tls_client_auth",
            ),
            (
                "the certificate in place of the key",
                vec!["--tls-cert", &cert, "--tls-key", &cert],
                "tls_client_auth",
            ),
        ];
        for (what, flags, said) in cases {
            let mut cmd = bare();
            cmd.args(["run", "--nodes", node, "--resource", "r", "--no-wait"])
                .args(&flags)
                .args(["--", "true"]);
            let out = output(&mut cmd, Duration::from_secs(30)).await;
            let err = stderr(&out);
            assert_eq!(out.status.code(), Some(USAGE), "{what}: {err}");
            assert!(err.contains(said), "{what}: {err}");
            assert!(!err.contains("PRIVATE KEY-----"), "{what}: {err}");
            for secret in me.secrets() {
                assert!(!err.contains(secret), "{what}: key material: {err}");
            }
        }
    }
}

/// `--nodes` takes one comma list: the words after it are the command's own (a resource
/// name here), never more node URLs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_take_one_comma_list_and_leave_the_resource_alone() {
    let cluster = cluster(3).await;
    let list = cluster.urls().join(",");
    let out = output(
        bare().args(["inspect", "--nodes", &list, "after-nodes"]),
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("after-nodes on 3 nodes (quorum 2)"),
        "{}",
        stdout(&out)
    );
}

/// With a majority of the nodes down, `run` reports the outage after one attempt (within
/// the node timeout), not after its whole wait, and with every mode.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_majority_is_reported_without_waiting_out_the_wait() {
    let cluster = cluster(3).await;
    cluster.kill(0).await.expect("kill");
    cluster.kill(1).await.expect("kill");
    for mode in [
        &[][..],
        &["--shared"][..],
        &["--write"][..],
        &["--permits", "2"][..],
    ] {
        let started = Instant::now();
        let mut opts = vec!["--wait", "60s"];
        opts.extend_from_slice(mode);
        let out = output(
            &mut run_sh(&cluster, "dead-majority", &opts, "true"),
            Duration::from_secs(50),
        )
        .await;
        let took = started.elapsed();
        assert_eq!(
            out.status.code(),
            Some(UNAVAILABLE),
            "{mode:?}: {}",
            stderr(&out)
        );
        assert!(
            took < Duration::from_secs(30),
            "{mode:?}: reported after {took:?}, not at the first attempt"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_shows_a_shared_run_read_held() {
    let cluster = cluster(3).await;
    let dir = tmp();
    let started_file = file(&dir, "started");
    let go = file(&dir, "go");
    let script = r#"touch "$STARTED"; i=0; while [ ! -e "$GO" ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done"#;
    let mut child = run_sh(&cluster, "catalog", &["--shared", "--ttl", "5s"], script)
        .env("STARTED", &started_file)
        .env("GO", &go)
        .spawn()
        .expect("spawn");
    wait_for_file(&started_file, Duration::from_secs(10)).await;
    let out = output(
        ql(&cluster).args(["inspect", "catalog"]),
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("verdict: read-held by 1 reader on 3/3 nodes (quorum 2)"),
        "{text}"
    );
    assert!(!text.contains("verdict: free"), "{text}");
    assert_eq!(text.matches("read-write: readers 1 (").count(), 3, "{text}");

    let out = output(
        ql(&cluster).args(["inspect", "--json", "catalog"]),
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).expect("valid JSON");
    let r = &v["resources"][0];
    assert_eq!(r["verdict"], "free", "the mutex is a separate lock");
    assert_eq!(r["all_free"], false);
    assert_eq!(r["rw"]["verdict"], "read_held");
    assert_eq!(r["rw"]["readers"], 1);
    assert_eq!(r["rw"]["held_nodes"], 3);
    assert_eq!(r["rw"]["waiting_writers"], 0);
    assert!(r["rw"]["ttl_ms"].as_u64().is_some_and(|t| t <= 5_000));
    assert_eq!(r["semaphore"]["verdict"], "free");
    for n in r["nodes"].as_array().expect("nodes") {
        let readers = n["rw"]["readers"].as_array().expect("readers");
        assert_eq!(readers.len(), 1, "{n}");
        assert_eq!(readers[0]["id"].as_str().map(str::len), Some(8));
        assert_eq!(n["rw"]["writer"], serde_json::Value::Null);
        assert_eq!(n["semaphore"]["count"], 0);
    }

    std::fs::write(&go, "").expect("touch go");
    assert_eq!(
        wait_exit(&mut child, Duration::from_secs(10)).await.code(),
        Some(0)
    );
    let out = output(
        ql(&cluster).args(["inspect", "catalog"]),
        Duration::from_secs(10),
    )
    .await;
    let text = stdout(&out);
    assert_eq!(text.matches("verdict: ").count(), 1, "{text}");
    assert!(
        text.contains("verdict: free on 3/3 nodes (quorum 2)"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_shows_a_writer_and_held_permits() {
    let cluster = cluster(3).await;
    let locks = client(&cluster).await;
    let writer = locks
        .try_write_lock("kinds", Duration::from_secs(30))
        .await
        .expect("writer");
    let pool = locks.semaphore("kinds", 2).expect("semaphore");
    let permit = pool
        .try_acquire(Duration::from_secs(30))
        .await
        .expect("permit");
    assert!(locks.flush(Duration::from_secs(10)).await);
    let out = output(
        ql(&cluster).args(["inspect", "kinds"]),
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    let prefix = &writer.token()[..8];
    assert!(
        text.contains(&format!(
            "verdict: write-held by {prefix}… on 3/3 nodes (quorum 2)"
        )),
        "{text}"
    );
    let (q, c) = (pool.quorum(), pool.per_node_limit());
    assert!(
        text.contains(&format!(
            "verdict: semaphore: 1 of 2 permits held (quorum {q})"
        )),
        "{text}"
    );
    assert!(text.contains(&format!("stored 2:{c}:{q}:3")), "{text}");
    assert!(!text.contains(writer.token()) && !text.contains(permit.token()));

    let out = output(
        ql(&cluster).args(["inspect", "--json", "kinds"]),
        Duration::from_secs(10),
    )
    .await;
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).expect("valid JSON");
    let r = &v["resources"][0];
    assert_eq!(r["rw"]["verdict"], "write_held");
    assert_eq!(r["rw"]["writer"], prefix);
    let s = &r["semaphore"];
    assert_eq!(s["verdict"], "held");
    assert_eq!(s["holders"], 1);
    assert_eq!(s["permits"], 2);
    assert_eq!(s["quorum"], q);
    assert_eq!(s["config"], format!("2:{c}:{q}:3"));
    let counts: u64 = r["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .map(|n| n["semaphore"]["count"].as_u64().expect("count"))
        .sum();
    assert_eq!(counts, q as u64);

    // A node down: it is failed and its kinds are null; two of three still decide.
    cluster.kill(0).await.expect("kill");
    let out = output(
        ql(&cluster).args(["inspect", "--json", "kinds"]),
        Duration::from_secs(10),
    )
    .await;
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).expect("valid JSON");
    let r = &v["resources"][0];
    assert_eq!(r["nodes"][0]["state"], "failed");
    assert_eq!(r["nodes"][0]["rw"], serde_json::Value::Null);
    assert_eq!(r["nodes"][0]["semaphore"], serde_json::Value::Null);
    assert_eq!(r["rw"]["verdict"], "write_held");
    assert_eq!(r["rw"]["held_nodes"], 2);
    drop((writer, permit));
}
