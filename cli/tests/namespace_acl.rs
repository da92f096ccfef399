//! A namespace that ACLs can confine, against real redis-server nodes: an ACL user given
//! exactly the rules `docs/operations.md` documents (read from that file), with the
//! namespace `ns`, uses every feature (locks, waiting with hand-off, multi-resource locks,
//! fencing, read-write locks, semaphores, the watchdog, inspection, two lock groups, Redis
//! Cluster voters, the CLI), writes no key and no channel outside `ns:`, and is refused
//! nothing but the optional `CONFIG GET`; the same user with another namespace is refused
//! with each node's `NOPERM`, never a panic; and two namespaces hold the same resource at
//! once on the same nodes. (With the CLI's tests, as it runs the `quorumlock` binary.)

#[path = "../../tests/support/mod.rs"]
mod support;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use quorumlock::{Error, ErrorKind, Redlock, Retry, Watchdog};
use quorumlock_testkit::LocalCluster;
use quorumlock_testkit::redis_cluster::RedisCluster;
use support::{eventually, raw};

const NS: &str = "ns";
const USER: &str = "locks";
const PASSWORD: &str = "pw";
const TTL: Duration = Duration::from_secs(10);
const BIN: &str = env!("CARGO_BIN_EXE_quorumlock");

/// The rules of the documented `ACL SETUSER` line (the one in a `text` block of the
/// operations guide), for namespace `ns` and password `pw`.
fn documented_rules(ns: &str) -> Vec<String> {
    let guide = include_str!("../../docs/operations.md");
    let line = guide
        .lines()
        .find(|l| l.starts_with("ACL SETUSER app-locks on"))
        .expect("the operations guide gives the ACL SETUSER line");
    line.split_whitespace()
        .skip(3)
        .map(|rule| match rule {
            ">CHANGE-ME" => format!(">{PASSWORD}"),
            r => r.replace("app:locks", ns),
        })
        .collect()
}

/// Creates (or replaces) the ACL user `user` with `rules` on every server of `cluster`.
async fn set_user(cluster: &LocalCluster, user: &str, rules: &[String]) {
    for i in 0..cluster.len() {
        let _: () = redis::cmd("ACL")
            .arg("SETUSER")
            .arg(user)
            .arg("reset")
            .arg(rules)
            .query_async(&mut raw(cluster, i).await)
            .await
            .expect("ACL SETUSER");
        let _: () = redis::cmd("ACL")
            .arg("LOG")
            .arg("RESET")
            .query_async(&mut raw(cluster, i).await)
            .await
            .expect("ACL LOG RESET");
    }
}

/// The cluster's URLs with the ACL user `user`.
fn urls_as(cluster: &LocalCluster, user: &str) -> Vec<String> {
    cluster
        .urls()
        .iter()
        .map(|u| u.replacen("redis://", &format!("redis://{user}:{PASSWORD}@"), 1))
        .collect()
}

fn builder(urls: Vec<String>, ns: &str) -> quorumlock::RedlockBuilder {
    Redlock::builder(urls)
        .namespace(ns)
        .node_timeout(Duration::from_millis(500))
}

async fn nodes(n: usize) -> LocalCluster {
    LocalCluster::launch(n)
        .await
        .expect("start redis-server nodes (is redis-server installed? run scripts/install-deps.sh)")
}

/// The commands each server of `cluster` refused `user` (its ACL log), as
/// `"<reason> <object>"` (`command config|get`, `key ns:x`, …).
async fn refused(cluster: &LocalCluster, user: &str) -> Vec<String> {
    let mut out = Vec::new();
    for i in 0..cluster.len() {
        let entries: Vec<HashMap<String, redis::Value>> = redis::cmd("ACL")
            .arg("LOG")
            .query_async(&mut raw(cluster, i).await)
            .await
            .expect("ACL LOG");
        let text = |v: Option<&redis::Value>| match v {
            Some(redis::Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
            other => format!("{other:?}"),
        };
        for e in entries {
            if text(e.get("username")) == user {
                out.push(format!(
                    "{} {}",
                    text(e.get("reason")),
                    text(e.get("object"))
                ));
            }
        }
    }
    out
}

/// Every key on every server of `cluster` (`KEYS *`, as the default user).
async fn every_key(cluster: &LocalCluster) -> Vec<Vec<u8>> {
    let mut all = Vec::new();
    for i in 0..cluster.len() {
        let keys: Vec<Vec<u8>> = redis::cmd("KEYS")
            .arg("*")
            .query_async(&mut raw(cluster, i).await)
            .await
            .expect("KEYS");
        all.extend(keys);
    }
    all
}

/// Asserts that the user was refused nothing but `CONFIG GET` (the start-up checks'
/// optional reading), and that every key on the servers is in the namespace `ns`.
async fn confined(cluster: &LocalCluster, ns: &str) {
    let denied = refused(cluster, USER).await;
    assert!(
        denied.iter().all(|d| d == "command config|get"),
        "the documented ACL lacks: {denied:?}"
    );
    let prefix = format!("{ns}:");
    let keys = every_key(cluster).await;
    assert!(!keys.is_empty());
    for k in keys {
        assert!(
            k.starts_with(prefix.as_bytes()),
            "a key outside the namespace: {}",
            String::from_utf8_lossy(&k)
        );
    }
}

/// A waiter on `resource` (a client of its own, whose retry delay is far longer than the
/// test waits, so only a hand-off can give it the lock in time) while `holder_of` holds
/// it: it queues, the holder releases, and it is handed the lock within 5 s.
async fn handed_over(holder_of: &Redlock, waiter_of: Redlock, resource: &str) {
    let held = holder_of
        .try_lock(resource, TTL)
        .await
        .expect("the holder's lock");
    let name = resource.to_owned();
    let waiter = tokio::spawn(async move {
        let started = Instant::now();
        let got = waiter_of.lock(&name, TTL).await;
        (got, started.elapsed(), waiter_of)
    });
    // The waiter has tried once, found the lock held and is waiting for its release.
    let queued = eventually(Duration::from_secs(5), || async {
        holder_of
            .inspect(resource)
            .await
            .ok()
            .and_then(|i| i.queued())
            .is_some_and(|q| q > 0)
    })
    .await;
    assert!(queued, "the waiter never queued");
    held.release().await.expect("release");
    let (got, waited, _client) = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter finished")
        .expect("task");
    let lock = got.expect("the waiter was handed the lock");
    assert!(
        waited < Duration::from_secs(8),
        "the waiter took {waited:?}: polled, not handed over"
    );
    lock.release().await.expect("release the handed lock");
}

/// Retry settings under which only a hand-off gets a waiter the lock within seconds.
fn slow_retry() -> Retry {
    Retry::new()
        .delay(Duration::from_secs(20), Duration::from_secs(20))
        .max_wait(Duration::from_secs(30))
}

/// Every feature, on three plain masters, for a user given exactly the documented ACL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_confined_to_its_namespace_uses_every_feature() {
    let cluster = nodes(3).await;
    set_user(&cluster, USER, &documented_rules(NS)).await;
    let urls = urls_as(&cluster, USER);
    let locks = builder(urls.clone(), NS)
        .fencing(true)
        .build()
        .await
        .expect("build as the confined user");

    // try_lock, fencing and inspection.
    let lock = locks.try_lock("job", TTL).await.expect("try_lock");
    let fence = lock.fencing_token().expect("a fencing token");
    assert!(fence > 0);
    let seen = locks.inspect("job").await.expect("inspect");
    assert!(seen.is_held(), "{seen}");
    assert!(seen.holder().is_some_and(|h| h.is_prefix_of(lock.token())));
    assert!(seen.fence().is_some_and(|f| f > 0), "{seen}");
    let key = format!("{NS}:lock:job");
    assert_eq!(
        support::count_key(&cluster, 0..3, &key).await,
        3,
        "{key} on every node"
    );
    assert!(matches!(
        locks
            .try_lock("job", TTL)
            .await
            .map(drop)
            .map_err(|e| e.kind()),
        Err(ErrorKind::Held)
    ));
    lock.release().await.expect("release");

    // Waiting with hand-off (pub/sub inbox and release channel).
    hand_over_to_a_waiter(&locks, urls.clone()).await;

    // Multi-resource locks.
    let many = locks
        .try_lock_many(["a", "b"], TTL)
        .await
        .expect("try_lock_many");
    assert!(matches!(
        locks
            .try_lock("b", TTL)
            .await
            .map(drop)
            .map_err(|e| e.kind()),
        Err(ErrorKind::Held)
    ));
    many.release().await.expect("release many");

    // Read-write locks.
    let r1 = locks.try_read_lock("doc", TTL).await.expect("read 1");
    let r2 = locks.try_read_lock("doc", TTL).await.expect("read 2");
    assert!(locks.try_write_lock("doc", TTL).await.is_err());
    r1.release().await.expect("release read 1");
    r2.release().await.expect("release read 2");
    let w = locks.try_write_lock("doc", TTL).await.expect("write");
    assert!(w.fencing_token().is_some());
    w.release().await.expect("release write");

    // Semaphores.
    let pool = locks.semaphore("pool", 2).expect("semaphore");
    let mut permits = Vec::new();
    while permits.len() <= pool.permits() as usize {
        match pool.try_acquire(TTL).await {
            Ok(p) => permits.push(p),
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::Held, "{e}");
                break;
            }
        }
    }
    assert!(permits.len() >= pool.capacity() as usize && !permits.is_empty());
    assert!(
        permits.len() <= pool.permits() as usize,
        "more permits than the pool has"
    );
    for p in permits {
        p.release().await.expect("release a permit");
    }

    // The watchdog keeps a short lock alive well past its TTL.
    let short = Duration::from_millis(600);
    let kept = locks
        .try_lock("kept", short)
        .await
        .expect("lock to keep")
        .keep_alive(Watchdog::new())
        .expect("a watchdog policy that fits the TTL");
    let started = Instant::now();
    let lost = eventually(Duration::from_millis(2000), || async { kept.is_lost() }).await;
    assert!(!lost, "the kept lock was lost");
    assert!(started.elapsed() >= short * 3);
    let kept_key = format!("{NS}:lock:kept");
    assert_eq!(support::count_key(&cluster, 0..3, &kept_key).await, 3);
    kept.release().await.expect("release kept");

    confined(&cluster, NS).await;
}

/// Two lock groups in one namespace: the group-map record is `ns:groupmap` on all six
/// nodes, and each group locks its own resources.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_groups_in_a_namespace() {
    let (a, b) = (nodes(3).await, nodes(3).await);
    let rules = documented_rules(NS);
    set_user(&a, USER, &rules).await;
    set_user(&b, USER, &rules).await;
    let locks = builder(urls_as(&a, USER), NS)
        .group(urls_as(&b, USER))
        .groups_version(1)
        .build()
        .await
        .expect("build two groups as the confined user");
    assert_eq!(locks.groups(), 2);
    let names: Vec<String> = [0, 1]
        .iter()
        .map(|g| {
            (0..1000)
                .map(|i| format!("report-{i}"))
                .find(|n| locks.group_of(n) == *g)
                .expect("a name in the group")
        })
        .collect();
    for (group, name) in [&a, &b].into_iter().zip(&names) {
        let lock = locks.try_lock(name, TTL).await.expect("lock in its group");
        let key = format!("{NS}:lock:{name}");
        assert_eq!(support::count_key(group, 0..3, &key).await, 3);
        lock.release().await.expect("release");
    }
    let record = format!("{NS}:groupmap");
    for group in [&a, &b] {
        assert_eq!(support::count_key(group, 0..3, &record).await, 3);
        confined(group, NS).await;
    }
}

/// Two namespaces (and the default one) on the same nodes hold the same resource at once,
/// each with its own key, fence counter and holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_namespaces_hold_the_same_resource_at_once() {
    let cluster = nodes(3).await;
    let other = "other:app";
    set_user(&cluster, USER, &documented_rules(NS)).await;
    set_user(&cluster, "others", &documented_rules(other)).await;
    let ours = builder(urls_as(&cluster, USER), NS)
        .fencing(true)
        .build()
        .await
        .expect("ns client");
    let theirs = builder(urls_as(&cluster, "others"), other)
        .fencing(true)
        .build()
        .await
        .expect("other client");
    let plain = Redlock::builder(cluster.urls())
        .fencing(true)
        .node_timeout(Duration::from_millis(500))
        .build()
        .await
        .expect("default-namespace client");
    let a = ours.try_lock("shared", TTL).await.expect("ns lock");
    let b = theirs.try_lock("shared", TTL).await.expect("other lock");
    let c = plain.try_lock("shared", TTL).await.expect("default lock");
    for (client, lock, key) in [
        (&ours, &a, "ns:lock:shared"),
        (&theirs, &b, "other:app:lock:shared"),
        (&plain, &c, "quorumlock:lock:shared"),
    ] {
        let seen = client.inspect("shared").await.expect("inspect");
        assert!(
            seen.holder().is_some_and(|h| h.is_prefix_of(lock.token())),
            "{key}: {seen}"
        );
        for i in 0..3 {
            assert_eq!(
                support::get(&cluster, i, key).await.as_deref(),
                Some(lock.token())
            );
        }
    }
    for (k, f) in [
        ("ns:fence:shared", a.fencing_token()),
        ("other:app:fence:shared", b.fencing_token()),
        ("quorumlock:fence:shared", c.fencing_token()),
    ] {
        let on_node = support::get(&cluster, 0, k).await;
        assert!(on_node.is_some() && f.is_some(), "{k}");
    }
    // Each namespace's waiters and releases are its own: a release in one wakes no one
    // in another, and a lock in one is not held in another.
    a.release().await.expect("release ns");
    assert!(matches!(
        theirs
            .try_lock("shared", TTL)
            .await
            .map(drop)
            .map_err(|e| e.kind()),
        Err(ErrorKind::Held)
    ));
    assert!(
        plain.inspect("shared").await.expect("inspect").is_held(),
        "the default namespace's lock outlived the release in ns"
    );
    let again = ours.try_lock("shared", TTL).await.expect("ns lock again");
    again.release().await.expect("release");
    b.release().await.expect("release other");
    c.release().await.expect("release default");
    assert!(
        refused(&cluster, "others")
            .await
            .iter()
            .all(|d| d == "command config|get")
    );
}

/// Whether `text` reports an ACL refusal (`NOPERM`, as redis-rs spells it: `NoPerm`).
fn is_noperm(text: &str) -> bool {
    text.to_ascii_uppercase().contains("NOPERM")
}

/// Whether `e`'s votes show every one of the `n` nodes it waited for refusing with
/// `NOPERM`, enough of them to make a quorum impossible (the call stops waiting for the
/// rest then), and no grant.
fn noperm_on_every_node(e: &Error, n: usize) -> bool {
    use quorumlock::NodeOutcome;
    e.votes().is_some_and(|v| {
        v.len() == n
            && v.failed() > n - v.quorum()
            && v.iter().all(|vote| match &vote.outcome {
                NodeOutcome::Failed(t) => is_noperm(t),
                NodeOutcome::NotAwaited => true,
                _ => false,
            })
    })
}

/// The same user with a namespace outside its grant: the build names a node and its
/// `NOPERM`; a user allowed that namespace's group-map record, and nothing else of it,
/// gets from every call an error whose votes carry every node's `NOPERM`, and no panic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_namespace_is_refused_by_every_node() {
    let cluster = nodes(3).await;
    set_user(&cluster, USER, &documented_rules(NS)).await;
    let e = builder(urls_as(&cluster, USER), "other")
        .build()
        .await
        .expect_err("a namespace outside the grant");
    let text = e.to_string();
    assert!(is_noperm(&text), "{text}");
    assert!(text.contains("127.0.0.1:"), "names the node: {text}");

    let mut rules = documented_rules(NS);
    rules.push("~other:groupmap".to_owned());
    set_user(&cluster, "recorder", &rules).await;
    let urls = urls_as(&cluster, "recorder");
    let locks = builder(urls, "other")
        .fencing(true)
        .retry(Retry::new().max_wait(Duration::from_millis(300)))
        .build()
        .await
        .expect("build with the record granted");
    let checks: Vec<(&str, Result<quorumlock::Lock, Error>)> = vec![
        ("try_lock", locks.try_lock("x", TTL).await),
        ("lock", locks.lock("x", TTL).await),
        ("try_lock_many", locks.try_lock_many(["x", "y"], TTL).await),
        ("try_read_lock", locks.try_read_lock("x", TTL).await),
        ("try_write_lock", locks.try_write_lock("x", TTL).await),
        (
            "semaphore",
            match locks.semaphore("x", 2) {
                Ok(s) => s.try_acquire(TTL).await,
                Err(e) => Err(e),
            },
        ),
    ];
    for (what, got) in checks {
        let e = got.map(drop).expect_err(what);
        assert!(
            noperm_on_every_node(&e, 3),
            "{what}: {e:#} ({:?})",
            e.votes().map(|v| format!("{v:#}"))
        );
    }
    let seen = locks.inspect("x").await.expect("an inspection");
    for node in seen.nodes() {
        assert!(
            matches!(node.state(), quorumlock::inspect::NodeState::Failed(t) if is_noperm(t)),
            "{node}"
        );
    }
    // Nothing of `other` was written but the record.
    for k in every_key(&cluster).await {
        assert_eq!(k, b"other:groupmap", "{}", String::from_utf8_lossy(&k));
    }
}

/// Cluster voters in a namespace: three Redis Clusters of two masters, every process
/// with the documented ACL; every feature, hand-off on shard channels included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_voters_in_a_namespace() {
    let (x, y, z) = tokio::join!(
        RedisCluster::launch(2, 0),
        RedisCluster::launch(2, 0),
        RedisCluster::launch(2, 0)
    );
    let hint = "start a local Redis Cluster (is redis-server installed?)";
    let voters = [x.expect(hint), y.expect(hint), z.expect(hint)];
    let rules = documented_rules(NS);
    for v in &voters {
        set_user(v.processes(), USER, &rules).await;
    }
    let urls: Vec<String> = voters
        .iter()
        .map(|v| {
            v.voter_url().replacen(
                "redis+cluster://",
                &format!("redis+cluster://{USER}:{PASSWORD}@"),
                1,
            )
        })
        .collect();
    let locks = builder(urls.clone(), NS)
        .fencing(true)
        .build()
        .await
        .expect("build cluster voters as the confined user");
    let lock = locks.try_lock("job", TTL).await.expect("try_lock");
    assert!(lock.fencing_token().is_some());
    let seen = locks.inspect("job").await.expect("inspect");
    assert!(seen.is_held(), "{seen}");
    lock.release().await.expect("release");

    hand_over_to_a_waiter(&locks, urls).await;

    let many = locks
        .try_lock_many(["{o}:a", "{o}:b"], TTL)
        .await
        .expect("lock_many in one slot");
    many.release().await.expect("release many");
    let r = locks.try_read_lock("doc", TTL).await.expect("read");
    assert!(locks.try_write_lock("doc", TTL).await.is_err());
    r.release().await.expect("release read");
    let pool = locks.semaphore("pool", 1).expect("semaphore");
    let p = pool.try_acquire(TTL).await.expect("permit");
    assert!(pool.try_acquire(TTL).await.is_err());
    p.release().await.expect("release permit");
    for v in &voters {
        confined(v.processes(), NS).await;
    }
}

/// The binary with no configuration from the environment but the user's nodes.
fn cli(cluster: &LocalCluster) -> tokio::process::Command {
    let mut c = tokio::process::Command::new(BIN);
    c.env_remove("QUORUMLOCK_NAMESPACE")
        .env_remove("QUORUMLOCK_LOG")
        .env_remove("QUORUMLOCK_FENCING_TOKEN")
        .env("QUORUMLOCK_NODES", urls_as(cluster, USER).join(","))
        .kill_on_drop(true);
    c
}

async fn output(cmd: &mut tokio::process::Command) -> std::process::Output {
    tokio::time::timeout(Duration::from_secs(20), cmd.output())
        .await
        .expect("quorumlock finished in time")
        .expect("start quorumlock")
}

/// The CLI as the confined user: `--namespace` and `QUORUMLOCK_NAMESPACE` reach the same
/// locks as the library's namespace, and another namespace fails with `NOPERM`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_takes_the_namespace_from_a_flag_or_the_environment() {
    let cluster = nodes(3).await;
    set_user(&cluster, USER, &documented_rules(NS)).await;
    let out = output(cli(&cluster).args([
        "run",
        "--namespace",
        NS,
        "--resource",
        "job",
        "--no-wait",
        "--",
        "sh",
        "-c",
        "exit 7",
    ]))
    .await;
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(7), "{err}");

    let locks = builder(urls_as(&cluster, USER), NS)
        .build()
        .await
        .expect("library client");
    let held = locks.try_lock("busy", TTL).await.expect("lock");
    let out = output(cli(&cluster).env("QUORUMLOCK_NAMESPACE", NS).args([
        "run",
        "--resource",
        "busy",
        "--no-wait",
        "--",
        "true",
    ]))
    .await;
    assert_eq!(
        out.status.code(),
        Some(75),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = output(
        cli(&cluster)
            .env("QUORUMLOCK_NAMESPACE", NS)
            .args(["inspect", "busy"]),
    )
    .await;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("verdict: held by "), "{text}");
    held.release().await.expect("release");
    confined(&cluster, NS).await;

    let out = output(cli(&cluster).args([
        "run",
        "--namespace",
        "other",
        "--resource",
        "job",
        "--no-wait",
        "--",
        "true",
    ]))
    .await;
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_ne!(out.status.code(), Some(0), "{err}");
    assert!(is_noperm(&err), "{err}");
    let out = output(cli(&cluster).args([
        "run",
        "--namespace",
        "a:lock",
        "--resource",
        "job",
        "--",
        "true",
    ]))
    .await;
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(err.contains("namespace"), "{err}");
    assert_ne!(out.status.code(), Some(0), "{err}");
}

/// A second client in the namespace, waiting with a long retry delay, is handed "handed"
/// when `locks` releases it.
async fn hand_over_to_a_waiter(locks: &Redlock, urls: Vec<String>) {
    let waiter = builder(urls, NS)
        .retry(slow_retry())
        .build()
        .await
        .expect("the waiter's client");
    handed_over(locks, waiter, "handed").await;
}
