//! The test kit's local Redis Clusters, against real `redis-server` processes: the kit
//! assigns every slot, a key lives on its slot's master only (others answer `MOVED`), a
//! graceful failover keeps the key and moves the slot to the replica, a crash failover
//! promotes the replica and the crashed master rejoins as a replica, and a slot migrated
//! half-way answers `ASK` for keys not yet moved, then moves with its keys.
#![cfg(feature = "testkit")]

mod support;

use std::time::Duration;

use quorumlock::testkit::redis_cluster::{RedisCluster, SLOTS, key_slot};
use redis::AsyncCommands;
use support::{eventually, raw};

/// `GET key` on process `i`: the value, or the server's error text in capitals.
async fn get_on(cluster: &RedisCluster, i: usize, key: &str) -> Result<Option<String>, String> {
    let mut c = raw(cluster.processes(), i).await;
    c.get(key).await.map_err(|e| e.to_string().to_uppercase())
}

async fn set_on(cluster: &RedisCluster, i: usize, key: &str, value: &str) -> Result<(), String> {
    let mut c = raw(cluster.processes(), i).await;
    c.set(key, value).await.map_err(|e| e.to_string())
}

async fn role(cluster: &RedisCluster, i: usize) -> String {
    let info: String = redis::cmd("INFO")
        .arg("replication")
        .query_async(&mut raw(cluster.processes(), i).await)
        .await
        .expect("INFO replication");
    info.lines()
        .find_map(|l| l.strip_prefix("role:"))
        .unwrap_or("")
        .trim()
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_slot_is_served_and_other_masters_redirect() {
    let cluster = RedisCluster::launch(3, 0).await.expect("launch a cluster");
    assert_eq!(cluster.masters(), 3);
    assert_eq!(cluster.seed_urls().len(), 3);
    let mut owners = [0usize; 3];
    for slot in [0, 5460, 5461, 10921, 10922, SLOTS - 1] {
        let owner = cluster.owner(slot).await.expect("owner");
        owners[owner] += 1;
    }
    assert!(owners.iter().all(|&n| n == 2), "{owners:?}");
    let key = "quorumlock:lock:{orders:42}";
    let owner = cluster
        .owner(key_slot(key.as_bytes()))
        .await
        .expect("owner");
    set_on(&cluster, owner, key, "v")
        .await
        .expect("SET on the owner");
    assert_eq!(get_on(&cluster, owner, key).await, Ok(Some("v".to_owned())));
    for other in (0..3).filter(|&i| i != owner) {
        let redirected = get_on(&cluster, other, key).await;
        let port = cluster.processes().port(owner).expect("port");
        assert!(
            matches!(&redirected, Err(e) if e.contains("MOVED") && e.contains(&port.to_string())),
            "{redirected:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_failover_keeps_the_key_and_moves_the_slot() {
    let cluster = RedisCluster::launch(3, 1).await.expect("launch a cluster");
    assert_eq!(cluster.processes().len(), 6);
    let key = "quorumlock:lock:{stock}";
    let slot = key_slot(key.as_bytes());
    let master = cluster.owner(slot).await.expect("owner");
    assert!(master < 3, "a replica serves slot {slot}");
    set_on(&cluster, master, key, "token").await.expect("SET");
    let promoted = cluster.failover(master).await.expect("failover");
    assert_ne!(promoted, master);
    assert_eq!(cluster.owner(slot).await.expect("owner"), promoted);
    assert_eq!(role(&cluster, promoted).await, "master");
    assert_eq!(
        get_on(&cluster, promoted, key).await,
        Ok(Some("token".to_owned()))
    );
    let demoted = eventually(Duration::from_secs(10), || async {
        role(&cluster, master).await == "slave"
    })
    .await;
    assert!(demoted, "the old master did not become a replica");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_master_is_replaced_by_its_replica_and_rejoins_as_one() {
    let cluster = RedisCluster::launch(3, 1).await.expect("launch a cluster");
    let slot = key_slot(b"{cron}");
    let master = cluster.owner(slot).await.expect("owner");
    let promoted = cluster
        .crash_failover(master)
        .await
        .expect("crash failover");
    assert_ne!(promoted, master);
    assert_eq!(cluster.owner(slot).await.expect("owner"), promoted);
    // The other masters' slots stay served meanwhile.
    let mut served_elsewhere = false;
    for k in 0..20 {
        let key = format!("other-{k}");
        let owner = cluster
            .owner(key_slot(key.as_bytes()))
            .await
            .expect("owner");
        if owner != promoted {
            set_on(&cluster, owner, &key, "1")
                .await
                .expect("SET on another master");
            served_elsewhere = true;
            break;
        }
    }
    assert!(served_elsewhere, "no key of another master among 20");
    cluster.processes().start(master).await.expect("restart");
    let rejoined = eventually(Duration::from_secs(15), || async {
        role(&cluster, master).await == "slave"
    })
    .await;
    assert!(rejoined, "the crashed master did not rejoin as a replica");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_migrated_half_way_asks_then_moves_with_its_keys() {
    let cluster = RedisCluster::launch(3, 0).await.expect("launch a cluster");
    let kept = "quorumlock:lock:{ledger}";
    let fresh = "quorumlock:fence:{ledger}";
    let slot = key_slot(kept.as_bytes());
    assert_eq!(slot, key_slot(fresh.as_bytes()));
    let from = cluster.owner(slot).await.expect("owner");
    let to = (from + 1) % 3;
    set_on(&cluster, from, kept, "token").await.expect("SET");
    cluster.begin_migration(slot, to).await.expect("begin");
    // The key still on the source is served there; a key it does not have is sent on.
    assert_eq!(
        get_on(&cluster, from, kept).await,
        Ok(Some("token".to_owned()))
    );
    let asked = get_on(&cluster, from, fresh).await;
    assert!(matches!(&asked, Err(e) if e.contains("ASK")), "{asked:?}");
    cluster.finish_migration(slot, to).await.expect("finish");
    assert_eq!(cluster.owner(slot).await.expect("owner"), to);
    assert_eq!(
        get_on(&cluster, to, kept).await,
        Ok(Some("token".to_owned()))
    );
    let moved = get_on(&cluster, from, kept).await;
    assert!(matches!(&moved, Err(e) if e.contains("MOVED")), "{moved:?}");
    // A whole migration back, in one call.
    cluster
        .migrate_slot(slot, from)
        .await
        .expect("migrate back");
    assert_eq!(
        get_on(&cluster, from, kept).await,
        Ok(Some("token".to_owned()))
    );
}
