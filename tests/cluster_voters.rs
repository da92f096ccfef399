//! Voters that are Redis Clusters (`redis+cluster://`), against real local clusters: locks
//! taken, excluded, extended, released and waited for through the same API as on plain
//! masters; the keys of a resource in the slot Redis gives its name; a multi-resource lock
//! within one slot taken and one across slots refused; `MOVED` and `ASK` redirects met by
//! acquire, extend and release while slots migrate mid-lease; a cluster voter's master
//! failed over mid-lease, losing the key (one voter lost: the lock holds); and, the
//! negative control, two of three voters failed over that way at once, which the history
//! checker must flag.

mod support;

use std::time::{Duration, Instant};

use quorumlock::{ErrorKind, Lock, Redlock};
use quorumlock_testkit::redis_cluster::{
    RedisCluster, cluster_lock_key, cluster_release_channel, key_slot,
};
use quorumlock_testkit::{History, ViolationKind};
use support::eventually;

const TTL: Duration = Duration::from_secs(10);

/// Three Redis Clusters of `masters` masters with `replicas` replicas each.
async fn voters(masters: usize, replicas: usize) -> Vec<RedisCluster> {
    let (a, b, c) = tokio::join!(
        RedisCluster::launch(masters, replicas),
        RedisCluster::launch(masters, replicas),
        RedisCluster::launch(masters, replicas),
    );
    let hint =
        "start a local Redis Cluster (is redis-server installed? run scripts/install-deps.sh)";
    vec![a.expect(hint), b.expect(hint), c.expect(hint)]
}

async fn client(voters: &[RedisCluster], fencing: bool) -> Redlock {
    Redlock::builder(voters.iter().map(RedisCluster::voter_url))
        .fencing(fencing)
        .node_timeout(Duration::from_millis(500))
        .build()
        .await
        .expect("build a client of cluster voters")
}

/// A connection to process `process` of `cluster`.
async fn process_conn(cluster: &RedisCluster, process: usize) -> redis::aio::MultiplexedConnection {
    let url = cluster.processes().url(process).expect("the process's URL");
    redis::Client::open(url)
        .expect("URL")
        .get_multiplexed_async_connection()
        .await
        .expect("connect to the process")
}

/// A connection to the process that serves `key`'s slot in `cluster`.
async fn owner_conn(cluster: &RedisCluster, key: &[u8]) -> redis::aio::MultiplexedConnection {
    let owner = cluster
        .owner(key_slot(key))
        .await
        .expect("the slot's owner");
    process_conn(cluster, owner).await
}

/// The value of `key` on the process that serves its slot in `cluster` (`None`: absent).
async fn value_at_owner(cluster: &RedisCluster, key: &[u8]) -> Option<Vec<u8>> {
    redis::cmd("GET")
        .arg(key)
        .query_async(&mut owner_conn(cluster, key).await)
        .await
        .expect("GET at the owner")
}

/// The value of `key` on process `process` of `cluster`, asked with `ASKING` (a master
/// importing the key's slot serves it then).
async fn value_asking(cluster: &RedisCluster, process: usize, key: &[u8]) -> Option<Vec<u8>> {
    let mut pipe = redis::pipe();
    pipe.cmd("ASKING").ignore().cmd("GET").arg(key);
    let (value,): (Option<Vec<u8>>,) = pipe
        .query_async(&mut process_conn(cluster, process).await)
        .await
        .expect("ASKING GET");
    value
}

/// The lock a waiting task was handed, within 10 s.
async fn handed(waiter: tokio::task::JoinHandle<Result<Lock, quorumlock::Error>>) -> Lock {
    tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter got the lock in time")
        .expect("task")
        .expect("the waiter's lock")
}

/// How many `command` calls the process serving `key`'s slot ran (INFO commandstats).
async fn calls_at_owner(cluster: &RedisCluster, key: &[u8], command: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut owner_conn(cluster, key).await)
        .await
        .expect("INFO commandstats");
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// How many connections are subscribed to the shard channel `channel` on its slot's
/// master in `cluster` (`PUBSUB SHARDNUMSUB`).
async fn shard_subscribers(cluster: &RedisCluster, channel: &[u8]) -> u64 {
    let (_, n): (Vec<u8>, u64) = redis::cmd("PUBSUB")
        .arg("SHARDNUMSUB")
        .arg(channel)
        .query_async(&mut owner_conn(cluster, channel).await)
        .await
        .expect("PUBSUB SHARDNUMSUB");
    n
}

/// How many connections listen to the shard channel `channel` anywhere in `cluster`: on
/// its slot's master, or on a replica of it (a shard's messages reach its replicas too).
async fn shard_listeners(cluster: &RedisCluster, channel: &[u8]) -> u64 {
    let mut total = 0;
    for p in 0..cluster.processes().len() {
        let Ok(url) = cluster.processes().url(p) else {
            continue;
        };
        let Ok(client) = redis::Client::open(url) else {
            continue;
        };
        let connect = client.get_multiplexed_async_connection();
        let Ok(Ok(mut conn)) = tokio::time::timeout(Duration::from_secs(1), connect).await else {
            continue;
        };
        let n: redis::RedisResult<(Vec<u8>, u64)> = redis::cmd("PUBSUB")
            .arg("SHARDNUMSUB")
            .arg(channel)
            .query_async(&mut conn)
            .await;
        total += n.map_or(0, |(_, n)| n);
    }
    total
}

/// How many voters hold `resource` for the owner of `token`, as an inspection reads them
/// (a refused attempt's clean-up may still be on its way on another voter).
async fn held_by(locks: &Redlock, resource: &str, token: &str) -> usize {
    let seen = locks.inspect(resource).await.expect("inspect");
    seen.nodes()
        .iter()
        .filter(|n| {
            n.reading()
                .and_then(|r| r.holder())
                .is_some_and(|h| h.is_prefix_of(token))
        })
        .count()
}

/// How many voters hold `resource`, as an inspection reads them.
async fn holders(locks: &Redlock, resource: &str) -> usize {
    let seen = locks.inspect(resource).await.expect("inspect");
    seen.nodes()
        .iter()
        .filter(|n| n.reading().is_some_and(|r| r.holder().is_some()))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_voters_lock_exclude_extend_release_and_wait() {
    let v = voters(3, 0).await;
    let (a, b) = (client(&v, true).await, client(&v, true).await);
    let mut lock = a.try_lock("orders:42", TTL).await.expect("first lock");
    let first_token = lock.fencing_token().expect("fencing token");
    // The lock key is in the slot of the name itself, on every voter.
    let key = cluster_lock_key("orders:42");
    assert_eq!(key_slot(&key), key_slot(b"orders:42"));
    for c in &v {
        let held = value_at_owner(c, &key)
            .await
            .expect("the key at the slot's owner");
        assert_eq!(held, lock.token().as_bytes(), "the voter holds our token");
    }
    let e = b.try_lock("orders:42", TTL).await.expect_err("held");
    assert_eq!(e.kind(), ErrorKind::Held, "{e}");
    lock.extend(TTL * 2)
        .await
        .expect("extend on cluster voters");
    assert!(lock.ttl() == TTL * 2);
    // A waiter listens on the resource's shard channel, on the master of its slot, and is
    // handed the lock once it is released: the announcement is an SPUBLISH on that shard.
    let waiter = tokio::spawn({
        let b = b.clone();
        async move { b.lock("orders:42", TTL).await }
    });
    let channel = cluster_release_channel("orders:42");
    for c in &v {
        let listening = eventually(Duration::from_secs(10), || async {
            shard_subscribers(c, &channel).await >= 1
        })
        .await;
        assert!(
            listening,
            "the waiter subscribed to the shard channel on every voter"
        );
    }
    assert_eq!(holders(&a, "orders:42").await, 3);
    let before: Vec<u64> =
        futures::future::join_all(v.iter().map(|c| calls_at_owner(c, &key, "spublish"))).await;
    lock.release().await.expect("release");
    let next = handed(waiter).await;
    let second_token = next.fencing_token().expect("fencing token");
    assert!(second_token > first_token, "{second_token} > {first_token}");
    for (c, before) in v.iter().zip(before) {
        let after = calls_at_owner(c, &key, "spublish").await;
        assert!(
            after > before,
            "the release was announced on the shard ({before} -> {after})"
        );
        assert_eq!(
            calls_at_owner(c, &key, "publish").await,
            0,
            "and never cluster-wide"
        );
    }
    next.release().await.expect("release");
    // (It returns at its quorum: the last voter's release may land a moment later.)
    let free = eventually(Duration::from_secs(5), || async {
        holders(&a, "orders:42").await == 0
    })
    .await;
    assert!(free, "released on every voter");
    for c in &v {
        assert_eq!(value_at_owner(c, &key).await, None, "released everywhere");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_within_one_slot_is_taken_and_one_across_slots_refused() {
    let v = voters(3, 0).await;
    let (a, b) = (client(&v, false).await, client(&v, false).await);
    let set = ["{order:7}:stock", "{order:7}:payment"];
    let lock = a.try_lock_many(set, TTL).await.expect("a set in one slot");
    let e = b
        .try_lock("{order:7}:payment", TTL)
        .await
        .expect_err("held");
    assert_eq!(e.kind(), ErrorKind::Held, "{e}");
    lock.release().await.expect("release");
    b.try_lock("{order:7}:payment", TTL)
        .await
        .expect("free again")
        .release()
        .await
        .expect("release");
    assert_ne!(key_slot(b"stock"), key_slot(b"payment"));
    let e = a
        .try_lock_many(["stock", "payment"], TTL)
        .await
        .expect_err("a set across slots");
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    assert!(e.to_string().contains("hash tag"), "{e}");
    // Nothing was taken.
    assert_eq!(holders(&a, "stock").await, 0);
}

/// Moves `slot` on every voter to its other master (the slot's owner changes under the
/// client's cached slot map, so its next command meets `MOVED`).
async fn move_slot_everywhere(v: &[RedisCluster], slot: u16) -> Vec<usize> {
    let mut sources = Vec::new();
    for c in v {
        let from = c.owner(slot).await.expect("owner");
        sources.push(from);
        c.migrate_slot(slot, (from + 1) % c.masters())
            .await
            .expect("migrate the slot");
    }
    sources
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moved_and_ask_redirects_during_acquire_extend_and_release() {
    let v = voters(2, 0).await;
    let (a, b) = (client(&v, false).await, client(&v, false).await);
    let (first, second) = ("{mig}first", "{mig}second");
    let slot = key_slot(first.as_bytes());
    let mut lock = a.try_lock(first, TTL).await.expect("lock");

    // The slot moves, keys and all, mid-lease: the extension meets MOVED on every voter.
    let sources = move_slot_everywhere(&v, slot).await;
    lock.extend(TTL * 2).await.expect("extend after MOVED");
    assert_eq!(
        holders(&b, first).await,
        3,
        "every voter still holds the lock"
    );
    let e = b.try_lock(first, TTL).await.expect_err("still held");
    assert_eq!(e.kind(), ErrorKind::Held, "{e}");

    // Voter 0 starts moving the slot back and stops half-way. The key of `second` is on
    // neither side, so the old owner answers ASK and the acquisition lands on the
    // importing master: every voter grants it.
    v[0].begin_migration(slot, sources[0])
        .await
        .expect("begin migration");
    let other = b.try_lock(second, TTL).await.expect("acquire through ASK");
    let key = cluster_lock_key(second);
    // The attempt returns at its quorum; voter 0's grant (MOVED, then ASK) may land a
    // moment later.
    let granted = eventually(Duration::from_secs(5), || async {
        value_asking(&v[0], sources[0], &key).await.as_deref() == Some(other.token().as_bytes())
    })
    .await;
    assert!(granted, "voter 0 granted through ASK");
    for c in &v[1..] {
        assert_eq!(
            value_at_owner(c, &key).await.as_deref(),
            Some(other.token().as_bytes())
        );
    }
    // A release script names several keys of the migrating slot, which Redis answers
    // TRYAGAIN until the migration ends: voter 0 counts as failed for now, the two others
    // make the quorum, and the release goes on in the background on voter 0.
    other
        .release()
        .await
        .expect("release with voter 0 migrating");
    for c in &v[1..] {
        assert_eq!(value_at_owner(c, &key).await, None, "released");
    }
    v[0].finish_migration(slot, sources[0])
        .await
        .expect("finish migration");
    let cleared = eventually(Duration::from_secs(10), || async {
        value_at_owner(&v[0], &key).await.is_none()
    })
    .await;
    assert!(
        cleared,
        "the release landed on voter 0 once its migration ended"
    );

    // `first` moved back with its slot on voter 0; the client's slot map is stale there
    // again, so the release meets MOVED.
    lock.release().await.expect("release after MOVED");
    // (It returns at its quorum: the last voter's release may land a moment later.)
    let free = eventually(Duration::from_secs(5), || async {
        holders(&a, first).await == 0
    })
    .await;
    assert!(free, "released on every voter");
    let taken = b.try_lock(first, TTL).await.expect("first is free");
    taken.release().await.expect("release");
}

/// Fails over, on voter `c`, the master that holds `resource`, losing its key (as if
/// replication lagged behind the crash).
async fn crash_losing(c: &RedisCluster, resource: &str) {
    let key = cluster_lock_key(resource);
    let master = c.owner(key_slot(&key)).await.expect("owner");
    // The lock returned at its quorum: this voter's grant may land a moment later.
    let held = eventually(Duration::from_secs(5), || async {
        value_at_owner(c, &key).await.is_some()
    })
    .await;
    assert!(held, "the voter held the key");
    let promoted = c
        .crash_failover_losing(master, &key)
        .await
        .expect("crash failover");
    assert_eq!(c.owner(key_slot(&key)).await.expect("owner"), promoted);
    assert_eq!(value_at_owner(c, &key).await, None, "the key is lost");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_losing_one_voters_key_keeps_the_lock_safe() {
    let v = voters(1, 1).await;
    let (a, b) = (client(&v, false).await, client(&v, false).await);
    let mut lock = a.try_lock("stock:9", TTL).await.expect("lock");
    let token = lock.token().to_owned();
    // A graceful failover on voter 1 (the replica catches up first) loses nothing: every
    // voter still holds the lock, on voter 1 at its new master.
    let key = cluster_lock_key("stock:9");
    let old = v[1].owner(key_slot(&key)).await.expect("owner");
    let promoted = v[1].failover(old).await.expect("graceful failover");
    assert_ne!(promoted, old);
    assert_eq!(held_by(&b, "stock:9", &token).await, 3);
    lock.extend(TTL)
        .await
        .expect("extend after a graceful failover");
    // A crash that loses the key on voter 0: two voters still hold it.
    crash_losing(&v[0], "stock:9").await;
    assert_eq!(held_by(&b, "stock:9", &token).await, 2);
    let e = b
        .try_lock("stock:9", TTL)
        .await
        .expect_err("two voters still hold it");
    assert_eq!(e.kind(), ErrorKind::Held, "{e}");
    lock.extend(TTL)
        .await
        .expect("extend on the two voters left");
    assert_eq!(held_by(&b, "stock:9", &token).await, 2);
    lock.release().await.expect("release");
    let _free = b
        .try_lock("stock:9", TTL)
        .await
        .expect("free after the release");
}

/// The negative control: two of three voters lose the key in a failover at once. Outside
/// what the quorum tolerates, a second client gets the lock while the first still believes
/// it holds it, and the checker must say so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_of_three_voters_failed_over_at_once_is_flagged() {
    let v = voters(1, 1).await;
    let (a, b) = (client(&v, false).await, client(&v, false).await);
    let h = History::new();
    let (ha, hb) = (h.client(1), h.client(2));
    let resource = "coupon:last";
    ha.acquire_invoked(resource);
    let lock = a.try_lock(resource, TTL).await.expect("lock");
    ha.acquired(resource, lock.deadline(), None);
    crash_losing(&v[0], resource).await;
    crash_losing(&v[1], resource).await;
    hb.acquire_invoked(resource);
    let second = b
        .try_lock(resource, TTL)
        .await
        .expect("the lost keys let b in");
    hb.acquired(resource, second.deadline(), None);
    assert!(
        Instant::now() < lock.deadline(),
        "a still believes it holds the lock"
    );
    let report = h.check();
    assert!(report.has(ViolationKind::Overlap), "{report}\n{h}");
    drop((lock, second));
}

/// A store given twice, under two addresses, would count its one failure twice: the
/// client refuses to build. Two seeds of one Redis Cluster, and one master by two names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_store_under_two_addresses_is_refused() {
    let (x, z) = tokio::join!(RedisCluster::launch(1, 1), RedisCluster::launch(1, 0));
    let (x, z) = (x.expect("cluster"), z.expect("cluster"));
    let seed = |i: usize| {
        let port = x.processes().port(i).expect("port");
        format!("redis+cluster://127.0.0.1:{port}")
    };
    let e = Redlock::builder([seed(0), seed(1), z.voter_url()])
        .build()
        .await
        .expect_err("one cluster under two seeds");
    assert_eq!(e.kind(), ErrorKind::Config, "{e}");
    assert!(e.to_string().contains("voters #1"), "{e}");
    assert!(e.to_string().contains("and #2"), "{e}");

    let plain = quorumlock_testkit::LocalCluster::launch(2)
        .await
        .expect("masters");
    let port = plain.port(0).expect("port");
    let e = Redlock::builder([
        format!("redis://127.0.0.1:{port}"),
        plain.url(1).expect("url"),
        format!("redis://localhost:{port}"),
    ])
    .build()
    .await
    .expect_err("one master under two names");
    assert_eq!(e.kind(), ErrorKind::Config, "{e}");
    assert!(e.to_string().contains("voters #1"), "{e}");
    // A group mixing clusters and masters is refused; three distinct clusters are fine.
    let e = Redlock::builder([seed(0), z.voter_url(), plain.url(1).expect("url")])
        .build()
        .await
        .expect_err("a group mixing clusters and masters");
    assert_eq!(e.kind(), ErrorKind::Config, "{e}");
    let w = RedisCluster::launch(1, 0).await.expect("cluster");
    Redlock::builder([seed(1), z.voter_url(), w.voter_url()])
        .build()
        .await
        .expect("three independent clusters");
}

/// The start-up checks look at every shard of a Redis Cluster voter (each warning names
/// its shard), and a cluster node given as one master is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_up_checks_look_at_every_shard() {
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("buffer").extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let buf = Buf::default();
    let writer = buf.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_max_level(tracing::Level::WARN)
        .with_ansi(false)
        .finish();
    // The process's subscriber (no other test of this file sets one): the checks run on
    // any worker thread. Other tests' warnings land here too; the assertions name this
    // test's own shards by port.
    tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");

    let v = voters(2, 1).await;
    // The second master of voter 0 evicts keys.
    let url = v[0].processes().url(1).expect("url");
    let mut conn = process_conn(&v[0], 1).await;
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory-policy")
        .arg("allkeys-lru")
        .query_async(&mut conn)
        .await
        .expect("CONFIG SET");
    let _a = client(&v, false).await;
    let e = Redlock::builder([url.clone()])
        .build()
        .await
        .expect_err("a cluster node given as one master");
    assert_eq!(e.kind(), ErrorKind::Config, "{e}");
    assert!(e.to_string().contains("redis+cluster://"), "{e}");
    let port = v[0].processes().port(1).expect("port");
    let text = || String::from_utf8_lossy(&buf.0.lock().expect("buffer")).to_string();
    let shard = format!("(shard 127.0.0.1:{port})");
    let seen = eventually(Duration::from_secs(20), || async {
        let t = text();
        let about = |what: &str| t.lines().any(|l| l.contains(&shard) && l.contains(what));
        about("maxmemory-policy is not noeviction") && about("fails over to a replica by itself")
    })
    .await;
    assert!(seen, "missing warnings in:\n{}", text());
    let ours: Vec<String> = (0..v[0].processes().len())
        .filter_map(|p| v[0].processes().port(p).ok())
        .map(|p| format!("127.0.0.1:{p}"))
        .collect();
    let evicting = text()
        .lines()
        .filter(|l| l.contains("not noeviction") && ours.iter().any(|p| l.contains(p.as_str())))
        .map(str::to_owned)
        .collect::<Vec<_>>();
    assert_eq!(evicting.len(), 1, "only the one shard evicts: {evicting:?}");
    assert!(
        evicting[0].contains(&format!("127.0.0.1:{port}")),
        "{evicting:?}"
    );
}

/// The master serving the group-map record's slot crashes on one voter. Until the cluster
/// fails it over, the record's requests there meet `MOVED` to the dead master: that says
/// where the record is, not what it holds, so the client goes on locking on the two other
/// voters (it was refused every lock for its lifetime before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_master_holding_the_group_map_record_is_no_mismatch() {
    let (x, y, z) = tokio::join!(
        RedisCluster::launch(3, 1),
        RedisCluster::launch(1, 0),
        RedisCluster::launch(1, 0)
    );
    let v = vec![
        x.expect("cluster"),
        y.expect("cluster"),
        z.expect("cluster"),
    ];
    let a = client(&v, false).await;
    a.try_lock("warm", Duration::from_secs(1))
        .await
        .expect("lock")
        .release()
        .await
        .expect("release");
    let record = key_slot(b"quorumlock:groupmap");
    let master = v[0].owner(record).await.expect("owner");
    v[0].processes().kill(master).await.expect("kill");
    let mut held = Vec::new();
    for i in 0..10u32 {
        // A longer TTL every time: the record is rewritten to cover it.
        let ttl = Duration::from_secs(60 + 30 * u64::from(i));
        match a.try_lock(&format!("after-crash:{i}"), ttl).await {
            Ok(lock) => held.push(lock),
            Err(e) => assert_ne!(e.kind(), ErrorKind::GroupMapMismatch, "try {i}: {e}"),
        }
    }
    assert!(!held.is_empty(), "the two other voters make a quorum");
    for lock in held {
        lock.release().await.expect("release");
    }
}

/// The first name `prefix-<i>` whose slot master 0 of a two-master cluster serves (`low`:
/// slots 0–8191) or master 1 does.
fn name_on(low: bool, prefix: &str) -> String {
    (0..10_000)
        .map(|i| format!("{prefix}-{i}"))
        .find(|n| (key_slot(n.as_bytes()) < 8192) == low)
        .expect("a name on each half")
}

/// A waiter's shard subscriptions follow its slot: after a migration (voter 0), a graceful
/// failover (voter 1) and a crash failover (voter 2), it listens on the slot's new master
/// of every voter, and the release reaches it there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiters_subscriptions_follow_its_slot() {
    let v = voters(2, 1).await;
    let (a, b) = (client(&v, false).await, client(&v, false).await);
    let res = name_on(true, "follow");
    let channel = cluster_release_channel(&res);
    let slot = key_slot(channel.as_slice());
    let lock = a.try_lock(&res, TTL).await.expect("lock");
    let waiter = tokio::spawn({
        let (b, res) = (b.clone(), res.clone());
        async move { b.lock(&res, TTL).await }
    });
    for c in &v {
        let on = eventually(Duration::from_secs(10), || async {
            shard_subscribers(c, &channel).await >= 1
        })
        .await;
        assert!(on, "subscribed before the faults");
    }
    v[0].migrate_slot(slot, 1).await.expect("migrate");
    let old = v[1].owner(slot).await.expect("owner");
    v[1].failover(old).await.expect("failover");
    let old = v[2].owner(slot).await.expect("owner");
    v[2].crash_failover(old).await.expect("crash failover");
    for (k, c) in v.iter().enumerate() {
        // On the slot's new master, or (after the graceful failover) still on the old
        // master, which is now its replica and hears its shard's messages.
        let on = eventually(Duration::from_secs(15), || async {
            shard_listeners(c, &channel).await >= 1
        })
        .await;
        assert!(on, "voter {k}: the waiter listens on the slot's shard");
    }
    // The crashed master's voter: on the new master itself.
    let on = eventually(Duration::from_secs(15), || async {
        shard_subscribers(&v[2], &channel).await >= 1
    })
    .await;
    assert!(on, "voter 2: the waiter listens on the promoted replica");
    lock.release().await.expect("release");
    let next = handed(waiter).await;
    next.release().await.expect("release");
}

/// A shard that does not answer holds up no other shard's subscriptions: with one master
/// of voter 0 paused, a waiter on the other master's slots is subscribed there at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_shard_holds_up_no_other_subscription() {
    let v = voters(2, 0).await;
    let (a, b) = (client(&v, false).await, client(&v, false).await);
    let (stuck, live) = (name_on(true, "stuck"), name_on(false, "live"));
    let held_stuck = a.try_lock(&stuck, TTL).await.expect("lock");
    let held_live = a.try_lock(&live, TTL).await.expect("lock");
    let paused = v[0].owner(key_slot(stuck.as_bytes())).await.expect("owner");
    v[0].processes().pause(paused).await.expect("pause");
    // Waiters on the paused master's slot first: their SSUBSCRIBEs there go unanswered.
    let mut waiters = Vec::new();
    for i in 0..3 {
        let (b, r) = (b.clone(), format!("{stuck}{}", ["", "x", "y"][i]));
        waiters.push(tokio::spawn(
            async move { b.try_lock(&r, TTL).await.is_ok() },
        ));
    }
    let blocked = tokio::spawn({
        let (b, r) = (b.clone(), stuck.clone());
        async move { b.lock(&r, Duration::from_secs(1)).await.is_ok() }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let live_waiter = tokio::spawn({
        let (b, r) = (b.clone(), live.clone());
        async move { b.lock(&r, TTL).await }
    });
    let channel = cluster_release_channel(&live);
    let on = eventually(Duration::from_secs(3), || async {
        shard_subscribers(&v[0], &channel).await >= 1
    })
    .await;
    assert!(
        on,
        "the live shard's channel was subscribed while the other shard is silent"
    );
    v[0].processes().resume(paused).await.expect("resume");
    held_live.release().await.expect("release");
    let next = handed(live_waiter).await;
    next.release().await.expect("release");
    held_stuck.release().await.expect("release");
    blocked.abort();
    for w in waiters {
        w.abort();
    }
}
