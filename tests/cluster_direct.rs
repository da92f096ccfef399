//! The direct path of a Redis Cluster voter (`io::node::direct`: one connection per shard
//! master, for requests whose slot is known), against real local Redis Clusters, seen
//! from outside: where the keys land, how often the slot map is read, and whether locks
//! are granted again after the slot moves or its master fails over.

mod support;

use std::time::{Duration, Instant};

use quorumlock::keys::{Keys, key_slot};
use quorumlock::{Error, Redlock};
use quorumlock_testkit::LocalCluster;
use quorumlock_testkit::redis_cluster::RedisCluster;
use support::raw;

const TTL: Duration = Duration::from_secs(5);

async fn client(cluster: &RedisCluster, node_timeout: Duration) -> Result<Redlock, Error> {
    Redlock::builder([cluster.voter_url()])
        .node_timeout(node_timeout)
        .build()
        .await
}

/// Whether process `i` holds `key` (asked with `ASKING`, so that an importing master
/// answers for a slot it is still importing).
async fn holds(processes: &LocalCluster, i: usize, key: &[u8]) -> bool {
    let n: Result<(i64,), _> = redis::pipe()
        .cmd("ASKING")
        .ignore()
        .cmd("EXISTS")
        .arg(key)
        .query_async(&mut raw(processes, i).await)
        .await;
    matches!(n, Ok((1,)))
}

/// `calls` of `cmdstat_<name>` on process `i` (`INFO commandstats`).
async fn calls(processes: &LocalCluster, i: usize, name: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut raw(processes, i).await)
        .await
        .unwrap_or_default();
    let prefix = format!("cmdstat_{name}:calls=");
    info.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|r| r.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// A lock request reaches the slot's master; after the slot moves, the old master's
/// `MOVED` is followed and the lock is taken on the new owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_reach_the_slots_master_directly_and_follow_it()
-> Result<(), Box<dyn std::error::Error>> {
    let cluster = RedisCluster::launch(2, 0).await?;
    // Generous: a request that meets MOVED or ASK waits for the slot map to be read.
    let locks = client(&cluster, Duration::from_secs(5)).await?;
    let keys = Keys::default().on_cluster();
    let slot = key_slot(b"direct");
    let owner = cluster.owner(slot).await?;

    let lock = locks.try_lock("direct", TTL).await?;
    assert!(holds(cluster.processes(), owner, &keys.lock("direct")).await);
    lock.release().await?;

    // The slot moves: MOVED, followed, and the lock is taken on the new owner.
    let to = (owner + 1) % cluster.masters();
    cluster.migrate_slot(slot, to).await?;
    let lock = locks.try_lock("direct", TTL).await?;
    assert!(holds(cluster.processes(), to, &keys.lock("direct")).await);
    lock.release().await?;

    Ok(())
}

/// During a migration, a new key of the slot meets `ASK` at its owner and is written on
/// the importing master. Its release is a script over the lock key and the resource's
/// waiting-state keys, which exist on neither master: Redis answers a multi-key request
/// on a half-migrated slot with `TRYAGAIN` until the migration ends, so the release is
/// sent again (5 to 100 ms apart) and completes once the slot has moved, deleting the key
/// on its new owner. (A caller whose node timeout passes first gets `NoQuorum`, the voter
/// timed out, while the release goes on in the background for up to 30 s; the lock's TTL
/// bounds the key in any case.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_taken_during_a_migration_follows_ask_and_is_released_once_it_ends()
-> Result<(), Box<dyn std::error::Error>> {
    let cluster = RedisCluster::launch(2, 0).await?;
    let locks = client(&cluster, Duration::from_secs(10)).await?;
    let keys = Keys::default().on_cluster();
    let fresh = "{direct}fresh";
    let slot = key_slot(fresh.as_bytes());
    let owner = cluster.owner(slot).await?;
    let importing = (owner + 1) % cluster.masters();
    // The slot starts moving and stops half-way: a new key of it meets ASK at its owner.
    cluster.begin_migration(slot, importing).await?;
    let lock = locks.try_lock(fresh, TTL).await?;
    assert!(
        holds(cluster.processes(), importing, &keys.lock(fresh)).await,
        "written on the importing master through ASK"
    );
    assert!(
        !holds(cluster.processes(), owner, &keys.lock(fresh)).await,
        "not on the migrating master"
    );
    let release = tokio::spawn(async move { lock.release().await });
    cluster.finish_migration(slot, importing).await?;
    tokio::time::timeout(Duration::from_secs(15), release).await???;
    assert!(
        !holds(cluster.processes(), importing, &keys.lock(fresh)).await,
        "released on the slot's new owner"
    );
    Ok(())
}

/// A one-master cluster answers `CLUSTER SLOTS` with an empty host for itself (no node
/// ever introduced it): it is taken to be at the address asked, so the voter gets a
/// direct path, and healthy traffic reads the map no more (without a direct path it read
/// it 20 times in 40 cycles).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_master_cluster_gets_a_direct_path_and_reads_its_map_once()
-> Result<(), Box<dyn std::error::Error>> {
    let cluster = RedisCluster::launch(1, 0).await?;
    let locks = client(&cluster, Duration::from_secs(1)).await?;
    locks.try_lock("solo", TTL).await?.release().await?;
    let before = calls(cluster.processes(), 0, "cluster|slots").await;
    for _ in 0..40 {
        locks.try_lock("solo", TTL).await?.release().await?;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let read = calls(cluster.processes(), 0, "cluster|slots")
        .await
        .saturating_sub(before);
    assert!(
        read <= 2,
        "CLUSTER SLOTS read {read} times in 2 s of healthy traffic"
    );
    Ok(())
}

/// After a crash failover, and after a paused master's takeover by its replica, locks are
/// granted again within a few seconds, with no restart: an I/O error, or a request its
/// caller stopped waiting for, has the map read again (without those readings the voter
/// failed for good).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_direct_path_follows_a_crash_and_a_paused_failover()
-> Result<(), Box<dyn std::error::Error>> {
    let cluster = RedisCluster::launch(2, 1).await?;
    let locks = client(&cluster, Duration::from_millis(200)).await?;
    let slot = key_slot(b"follow");
    // One lock and release every 20 ms until one is granted, for at most 10 s.
    let granted_again = || async {
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(10) {
            if let Ok(lock) = locks.try_lock("follow", TTL).await {
                let _ = lock.release().await;
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        false
    };
    assert!(granted_again().await);
    let owner = cluster.owner(slot).await?;
    let promoted = cluster.crash_failover(owner).await?;
    assert!(
        granted_again().await,
        "still failing after a crash failover"
    );
    // The killed process back (a replica of the new master), then the new master paused
    // and taken over by it.
    cluster.processes().start(owner).await?;
    let start = Instant::now();
    while !cluster.replicas_of(promoted).await?.contains(&owner) {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the restarted process never replicated the new master"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(cluster.pause_failover(promoted).await?, owner);
    assert!(
        granted_again().await,
        "still failing after a paused failover"
    );
    cluster.processes().resume(promoted).await?;
    Ok(())
}
