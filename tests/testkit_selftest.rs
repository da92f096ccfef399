//! Self-test of the fault-injection kit against real `redis-server` processes: every fault it
//! offers must have the observable effect it promises.

mod support;

use std::io;
use std::time::Duration;

use quorumlock_testkit::nemesis::{FaultKind, RandomNemesis};
use quorumlock_testkit::{Faults, LocalCluster, Persistence, ProxyMode};
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// Shorter than redis-rs' own 500 ms response timeout, so "no answer" shows as `Elapsed`.
const NO_ANSWER: Duration = Duration::from_millis(300);
/// Upper bound for anything that should succeed.
const PATIENCE: Duration = Duration::from_secs(5);

/// A connection whose replies may take up to `PATIENCE` (redis-rs's default response
/// timeout of 500 ms is shorter than `WAIT … PATIENCE` while a replica still syncs).
async fn connect(url: &str) -> redis::RedisResult<MultiplexedConnection> {
    let config = redis::AsyncConnectionConfig::new()
        .set_response_timeout(Some(PATIENCE + Duration::from_secs(1)))
        .set_connection_timeout(Some(PATIENCE));
    redis::Client::open(url)?
        .get_multiplexed_async_connection_with_config(&config)
        .await
}

async fn ping(con: &mut MultiplexedConnection) -> redis::RedisResult<String> {
    redis::cmd("PING").query_async(con).await
}

/// PING within `PATIENCE`, as an error string on failure.
async fn ping_ok(con: &mut MultiplexedConnection) -> Result<(), String> {
    match tokio::time::timeout(PATIENCE, ping(con)).await {
        Ok(Ok(pong)) if pong == "PONG" => Ok(()),
        Ok(Ok(other)) => Err(format!("PING answered {other:?}")),
        Ok(Err(e)) => Err(format!("PING failed: {e}")),
        Err(_) => Err("PING timed out".into()),
    }
}

/// Whether a PING gets no answer at all within `NO_ANSWER` (neither reply nor error).
async fn ping_silent(con: &mut MultiplexedConnection) -> bool {
    tokio::time::timeout(NO_ANSWER, ping(con)).await.is_err()
}

/// Polls a fresh connection to `url` until it answers PING (bounded by count and time).
async fn wait_answers(url: &str) -> Result<MultiplexedConnection, String> {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let mut last = String::new();
    for _ in 0..500 {
        match tokio::time::timeout(NO_ANSWER, connect(url)).await {
            Ok(Ok(mut con)) => match ping_ok(&mut con).await {
                Ok(()) => return Ok(con),
                Err(e) => last = e,
            },
            Ok(Err(e)) => last = e.to_string(),
            Err(_) => last = "connect timed out".into(),
        }
        if tokio::time::Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Err(format!("{url} never answered: {last}"))
}

#[tokio::test]
async fn every_node_answers_ping() -> TestResult {
    let cluster = LocalCluster::launch(3).await?;
    assert_eq!(cluster.len(), 3);
    let urls = cluster.urls();
    assert_eq!(urls.len(), 3);
    for (i, url) in urls.iter().enumerate() {
        assert!(url.starts_with("redis://127.0.0.1:"), "{url}");
        assert_eq!(url, &cluster.direct_url(i)?, "no proxies: urls are direct");
        let mut con = connect(url).await?;
        ping_ok(&mut con).await?;
        let policy: Vec<String> = redis::cmd("CONFIG")
            .arg("GET")
            .arg("maxmemory-policy")
            .query_async(&mut con)
            .await?;
        assert_eq!(policy, ["maxmemory-policy", "noeviction"]);
    }
    let ports: std::collections::HashSet<u16> =
        (0..3).map(|i| cluster.port(i)).collect::<io::Result<_>>()?;
    assert_eq!(ports.len(), 3, "distinct ports");
    Ok(())
}

#[tokio::test]
async fn bad_node_index_is_an_error_not_a_panic() -> TestResult {
    let cluster = LocalCluster::launch(1).await?;
    assert_eq!(
        cluster.kill(5).await.unwrap_err().kind(),
        io::ErrorKind::InvalidInput
    );
    assert_eq!(
        cluster.proxy(0).unwrap_err().kind(),
        io::ErrorKind::Unsupported
    );
    assert_eq!(
        cluster.disconnect(0).await.unwrap_err().kind(),
        io::ErrorKind::Unsupported
    );
    assert_eq!(
        cluster.replication_link(0).unwrap_err().kind(),
        io::ErrorKind::Unsupported
    );
    let err = LocalCluster::launch(0).await.unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    Ok(())
}

#[tokio::test]
async fn kill_and_restart_without_persistence_loses_data() -> TestResult {
    let cluster = LocalCluster::launch(3).await?;
    let url = cluster.url(0)?;
    let port = cluster.port(0)?;
    let mut con = connect(&url).await?;
    let _: () = con.set("k", "v").await?;

    cluster.kill(0).await?;
    assert_eq!(cluster.pid(0)?, None);
    let down = tokio::time::timeout(PATIENCE, connect(&url)).await?;
    assert!(down.is_err(), "a killed node refuses connections");
    cluster.kill(0).await?; // idempotent

    cluster.start(0).await?;
    assert_eq!(cluster.port(0)?, port, "same port after restart");
    let mut con = connect(&url).await?;
    let v: Option<String> = con.get("k").await?;
    assert_eq!(v, None, "no persistence: the node comes back empty");

    // Other nodes were untouched.
    let mut other = connect(&cluster.url(1)?).await?;
    ping_ok(&mut other).await?;
    Ok(())
}

#[tokio::test]
async fn restart_with_aof_always_keeps_data() -> TestResult {
    let cluster = LocalCluster::builder(3)
        .persistence(Persistence::AofAlways)
        .node_persistence(2, Persistence::None)
        .launch()
        .await?;
    for i in [0, 2] {
        let mut con = connect(&cluster.url(i)?).await?;
        let _: () = con.set("k", "v").await?;
        cluster.restart(i, Duration::from_millis(20)).await?;
        let mut con = connect(&cluster.url(i)?).await?;
        let v: Option<String> = con.get("k").await?;
        let expected = (i == 0).then(|| "v".to_owned());
        assert_eq!(v, expected, "node {i}");
    }
    Ok(())
}

#[tokio::test]
async fn pause_silences_a_node_until_resume() -> TestResult {
    let cluster = LocalCluster::launch(3).await?;
    let mut con = connect(&cluster.url(1)?).await?;
    ping_ok(&mut con).await?;

    cluster.pause(1).await?;
    assert!(ping_silent(&mut con).await, "a paused node must not answer");
    let mut other = connect(&cluster.url(0)?).await?;
    ping_ok(&mut other).await?;

    cluster.resume(1).await?;
    cluster.resume(1).await?; // idempotent
    let mut fresh = wait_answers(&cluster.url(1)?).await?;
    let v: Option<String> = fresh.get("nothing").await?;
    assert_eq!(v, None);
    Ok(())
}

#[tokio::test]
async fn proxy_blackhole_stall_delay_reset_on_a_live_connection() -> TestResult {
    let cluster = LocalCluster::builder(3).proxies(true).launch().await?;
    let url = cluster.url(0)?;
    assert_ne!(url, cluster.direct_url(0)?, "urls go through the proxy");
    let proxy = cluster.proxy(0)?;
    let mut con = connect(&url).await?;
    ping_ok(&mut con).await?;
    assert_eq!(proxy.live_connections(), 1);

    // Stall: silent, nothing lost; the same connection works again after the heal.
    proxy.set_mode(ProxyMode::Stall);
    assert!(ping_silent(&mut con).await, "stall: no answer");
    proxy.set_mode(ProxyMode::Pass);
    ping_ok(&mut con).await?;

    // Blackhole: silent; the connection lost a request, so it is reset on the heal and a
    // new connection works.
    cluster.disconnect(0).await?;
    assert!(ping_silent(&mut con).await, "blackhole: no answer");
    // New connections are accepted, but nothing reaches the node (a raw socket: redis-rs'
    // own handshake would wait for replies).
    let mut during = tokio::net::TcpStream::connect(proxy.addr()).await?;
    during.write_all(b"PING\r\n").await?;
    let mut buf = [0u8; 16];
    let read = tokio::time::timeout(NO_ANSWER, during.read(&mut buf)).await;
    assert!(
        read.is_err(),
        "blackhole: new connections are silent too: {read:?}"
    );
    cluster.reconnect(0).await?;
    let broken = tokio::time::timeout(PATIENCE, ping(&mut con)).await?;
    assert!(
        broken.is_err(),
        "a connection that lost bytes is reset: {broken:?}"
    );
    let mut con = wait_answers(&url).await?;

    // Delay: each way, so a round trip takes at least twice the delay.
    proxy.set_mode(ProxyMode::Delay(Duration::from_millis(60)));
    let t0 = std::time::Instant::now();
    ping_ok(&mut con).await?;
    let rtt = t0.elapsed();
    assert!(
        rtt >= Duration::from_millis(120),
        "round trip {rtt:?} under 2 x 60 ms"
    );
    proxy.set_mode(ProxyMode::Pass);
    ping_ok(&mut con).await?;

    // Blackholed replies: the command runs on the node, the client never hears back.
    proxy.set_mode(ProxyMode::BlackholeReplies);
    let set = tokio::time::timeout(NO_ANSWER, con.set::<_, _, ()>("landed", "1")).await;
    assert!(set.is_err(), "reply must be dropped");
    let mut direct = connect(&cluster.direct_url(0)?).await?;
    let mut landed = None;
    for _ in 0..100 {
        landed = direct.get::<_, Option<String>>("landed").await?;
        if landed.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(landed.as_deref(), Some("1"), "the write reached the node");
    proxy.set_mode(ProxyMode::Pass);

    // Reset: live connections are cut, new ones refused until the mode changes.
    let mut con = wait_answers(&url).await?;
    proxy.set_mode(ProxyMode::Reset);
    let cut = tokio::time::timeout(PATIENCE, ping(&mut con)).await?;
    assert!(cut.is_err(), "reset: live connection errors: {cut:?}");
    let refused = tokio::time::timeout(PATIENCE, async {
        let mut c = connect(&url).await?;
        ping(&mut c).await
    })
    .await?;
    assert!(refused.is_err(), "reset: new connections fail: {refused:?}");
    proxy.set_mode(ProxyMode::Pass);
    wait_answers(&url).await?;
    Ok(())
}

#[tokio::test]
async fn promoted_replica_misses_writes_made_while_its_link_was_blackholed() -> TestResult {
    let cluster = LocalCluster::builder(3).replicated(0).launch().await?;
    let url = cluster.url(0)?;
    let mut con = connect(&url).await?;

    // Link in pass mode: writes replicate.
    let _: () = con.set("before", "1").await?;
    let acked: i64 = redis::cmd("WAIT")
        .arg(1)
        .arg(PATIENCE.as_millis() as u64)
        .query_async(&mut con)
        .await?;
    assert_eq!(acked, 1, "the replica acknowledged the write");
    let mut replica = connect(&cluster.replica_url(0)?).await?;
    let replicated: Option<String> = replica.get("before").await?;
    assert_eq!(replicated.as_deref(), Some("1"));

    // Link blackholed: the next write stays on the master, which then dies.
    cluster.replication_link(0)?.blackhole();
    let _: () = con.set("x", "1").await?;
    let acked: i64 = redis::cmd("WAIT")
        .arg(1)
        .arg(200)
        .query_async(&mut con)
        .await?;
    assert_eq!(acked, 0, "the replica must not have the write");
    cluster.kill(0).await?;
    cluster.promote_replica(0).await?;

    let mut con = wait_answers(&url).await?;
    let role: redis::Value = redis::cmd("ROLE").query_async(&mut con).await?;
    assert!(format!("{role:?}").contains("master"), "{role:?}");
    let x: Option<String> = con.get("x").await?;
    assert_eq!(x, None, "the promoted replica never got x");
    let before: Option<String> = con.get("before").await?;
    assert_eq!(before.as_deref(), Some("1"));
    assert_eq!(cluster.port(0)?, cluster.replica_port(0)?);
    // The promoted replica is writable.
    let _: () = con.set("after", "1").await?;
    Ok(())
}

#[tokio::test]
async fn random_nemesis_heals_every_node() -> TestResult {
    let cluster = LocalCluster::builder(3).proxies(true).launch().await?;
    let nemesis = RandomNemesis::new(11)
        .duration(Duration::from_millis(800))
        .interval(Duration::from_millis(20), Duration::from_millis(100))
        .kinds(&[
            FaultKind::Kill,
            FaultKind::Pause,
            FaultKind::Disconnect,
            FaultKind::Restart,
        ]);
    let log = nemesis.run(&cluster).await?;
    assert_eq!(
        log.faults(),
        nemesis
            .plan(3)
            .into_iter()
            .map(|(_, f)| f)
            .collect::<Vec<_>>()
    );
    for url in Faults::urls(&cluster) {
        wait_answers(&url).await?;
    }
    Ok(())
}

#[tokio::test]
async fn dropping_the_cluster_kills_and_reaps_every_server() -> TestResult {
    let cluster = LocalCluster::builder(2).replicated(1).launch().await?;
    let mut pids = Vec::new();
    for i in 0..2 {
        pids.extend(cluster.pid(i)?);
    }
    cluster.pause(0).await?; // a stopped process must die too
    assert_eq!(pids.len(), 2);
    drop(cluster);
    for pid in pids {
        // Reaped: not even a zombie entry is left.
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "redis-server {pid} survived the drop"
        );
    }
    Ok(())
}

/// Faults can be injected from a spawned task: the futures are `Send`.
#[test]
fn fault_futures_are_send() {
    fn send<T: Send>(_: &T) {}
    fn check(cluster: &LocalCluster, nemesis: &RandomNemesis) {
        send(&cluster.kill(0));
        send(&cluster.promote_replica(0));
        send(&Faults::pause(cluster, 0));
        send(&nemesis.run(cluster));
    }
    let _ = check;
}

/// The test kit's local Redis Clusters, against real `redis-server` processes: the kit
/// assigns every slot, a key lives on its slot's master only (others answer `MOVED`), a
/// graceful failover keeps the key and moves the slot to the replica, a crash failover
/// promotes the replica and the crashed master rejoins as a replica, and a slot migrated
/// half-way answers `ASK` for keys not yet moved, then moves with its keys.
mod redis_cluster {
    use std::time::Duration;

    use quorumlock_testkit::redis_cluster::{RedisCluster, SLOTS, key_slot};
    use redis::AsyncCommands;

    use super::support::{eventually, raw};

    /// `GET key` on process `i`: the value, or the server's error text in capitals.
    async fn get_on(cluster: &RedisCluster, i: usize, key: &str) -> Result<Option<String>, String> {
        let mut c = raw(cluster.processes(), i).await;
        c.get(key).await.map_err(|e| e.to_string().to_uppercase())
    }

    async fn set_on(
        cluster: &RedisCluster,
        i: usize,
        key: &str,
        value: &str,
    ) -> Result<(), String> {
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
}
