//! Fault scenarios written once against the `Faults` trait and run on every backend: the
//! local `redis-server` processes (always), voters that are local Redis Clusters (always),
//! and the Docker Compose harness (whenever a Docker engine answers; otherwise one line
//! says it was skipped).

use std::time::Duration;

use quorumlock::{Error, Redlock};
use quorumlock_testkit::compose::{ComposeCluster, ComposeOptions, ComposeService};
use quorumlock_testkit::{ClusterVoters, Faults, History, LocalCluster, ViolationKind};

const TTL: Duration = Duration::from_secs(5);

async fn client(urls: &[String]) -> Redlock {
    Redlock::builder(urls)
        .node_timeout(Duration::from_millis(250))
        .connect_timeout(Duration::from_secs(2))
        .build()
        .await
        .expect("build")
}

/// Fault-matrix row "kill 1 or 2 nodes mid-lease, they stay down": safe; lock, extend and
/// release keep working.
async fn kill_nodes_mid_lease<F: Faults>(f: &F) {
    let urls = f.urls();
    let (a, b) = (client(&urls).await, client(&urls).await);
    let history = History::new();
    let (ra, rb) = (history.client(1), history.client(2));
    let res = "scenario:kill";

    ra.acquire_invoked(res);
    let mut lock = a.try_lock(res, TTL).await.expect("A acquires");
    ra.acquired(res, lock.deadline(), None);
    f.kill(0).await.expect("kill node 0");
    f.kill(1).await.expect("kill node 1");
    rb.acquire_invoked(res);
    match b.try_lock(res, TTL).await {
        Err(e) => {
            assert!(matches!(e, Error::Held(_) | Error::NoQuorum(_)), "{e}");
            rb.acquire_failed(res);
        }
        Ok(l) => {
            rb.acquired(res, l.deadline(), None);
            panic!("B acquired while A holds 3 of 5 live nodes: {l:?}");
        }
    }
    lock.extend(TTL).await.expect("extend with 3 of 5 nodes");
    ra.extended(res, lock.deadline());
    ra.release_invoked(res);
    lock.release().await.expect("release with 3 of 5 nodes");
    rb.acquire_invoked(res);
    let lb = b
        .try_lock(res, TTL)
        .await
        .expect("B acquires after the release");
    rb.acquired(res, lb.deadline(), None);
    rb.release_invoked(res);
    lb.release().await.expect("B releases");
    f.start(0).await.expect("start node 0");
    f.start(1).await.expect("start node 1");
    let report = history.check();
    assert!(report.is_clean(), "{report}");
}

/// Fault-matrix rows "pause 1–2 nodes" and "client cut off from a minority": acquisition still
/// succeeds, within the per-node timeout. (A backend that cannot cut a link, Redis Cluster
/// voters, has node 2 paused instead: two of five nodes silent all the same.)
async fn pause_and_disconnect<F: Faults>(f: &F) {
    let urls = f.urls();
    let a = client(&urls).await;
    let node_timeout = Duration::from_millis(250);
    let drift = TTL / 100 + Duration::from_millis(2);
    f.pause(1).await.expect("pause node 1");
    let cut = match f.disconnect(2).await {
        Err(e) if e.kind() == std::io::ErrorKind::Unsupported => {
            f.pause(2).await.expect("pause node 2");
            false
        }
        other => other.map(|()| true).expect("cut node 2"),
    };
    let lock = a
        .try_lock("scenario:pause", TTL)
        .await
        .expect("3 healthy nodes suffice");
    assert!(
        lock.remaining() > TTL - drift - node_timeout,
        "the attempt took longer than one node timeout: {:?} left",
        lock.remaining()
    );
    lock.release().await.expect("release");
    f.resume(1).await.expect("resume");
    if cut {
        f.reconnect(2).await.expect("reconnect");
    } else {
        f.resume(2).await.expect("resume node 2");
    }
    // Both heal: a lock again, now on all five.
    let lock = a
        .try_lock("scenario:pause", TTL)
        .await
        .expect("after healing");
    lock.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_backend() {
    let c = LocalCluster::builder(5)
        .proxies(true)
        .launch()
        .await
        .expect("local cluster");
    kill_nodes_mid_lease(&c).await;
    pause_and_disconnect(&c).await;
}

/// The same scenarios with every voter a Redis Cluster (one master each: a fault on a voter
/// acts on the whole cluster).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_voters_backend() {
    let c = ClusterVoters::launch(5, 1, 0).await.expect(
        "five local Redis Clusters (is redis-server installed? run scripts/install-deps.sh)",
    );
    kill_nodes_mid_lease(&c).await;
    pause_and_disconnect(&c).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compose_backend() {
    if !ComposeCluster::engine_available() {
        eprintln!("docker engine not available: skipping compose scenarios");
        return;
    }
    let _ = ComposeCluster::remove_stale("qlscn").await;
    let options = ComposeOptions::isolated("qlscn")
        .expect("options")
        .failover(true);
    let c = ComposeCluster::up(options).await.expect("compose up");
    kill_nodes_mid_lease(&c).await;
    pause_and_disconnect(&c).await;
    failover_to_a_lagging_replica(&c).await;
    c.down().await.expect("compose down");
}

/// Fault-matrix row "kill the master of one node mid-lease; its replica, which never got the key,
/// is promoted": Redlock on 5 nodes stays safe (f = 1); a single-instance lock with a replica
/// lets a second holder in, and the checker says so.
async fn failover_to_a_lagging_replica(c: &ComposeCluster) {
    let primary = c.url_of(ComposeService::Primary).expect("primary");
    let replica = c.url_of(ComposeService::Replica).expect("replica");
    let others: Vec<String> = (1..5)
        .map(|i| c.url_of(ComposeService::Node(i)).expect("node"))
        .collect();
    let before: Vec<String> = std::iter::once(primary.clone())
        .chain(others.iter().cloned())
        .collect();
    let after: Vec<String> = std::iter::once(replica.clone())
        .chain(others.iter().cloned())
        .collect();

    // The replica's link is cut before A acquires: it never receives A's keys.
    c.disconnect_service(ComposeService::Replica)
        .await
        .expect("cut the replica");
    let history = History::new();
    let (ra, rb) = (history.client(1), history.client(2));
    let a5 = client(&before).await;
    let a1 = client(std::slice::from_ref(&primary)).await;
    let lock5 = a5
        .try_lock("failover:five", TTL)
        .await
        .expect("A on 5 nodes");
    ra.acquired("failover:five", lock5.deadline(), None);
    let lock1 = a1
        .try_lock("failover:single", TTL)
        .await
        .expect("A on the single master");
    ra.acquired("failover:single", lock1.deadline(), None);

    // The master dies; the replica, which never got the keys, is promoted.
    c.kill_service(ComposeService::Primary)
        .await
        .expect("kill primary");
    c.reconnect_service(ComposeService::Replica)
        .await
        .expect("reconnect replica");
    c.promote_replica().await.expect("promote");

    let b5 = client(&after).await;
    let b1 = client(std::slice::from_ref(&replica)).await;
    match b5.try_lock("failover:five", TTL).await {
        Ok(l) => {
            rb.acquired("failover:five", l.deadline(), None);
        }
        Err(e) => assert!(e.is_held(), "B on 5 nodes: {e}"),
    }
    match b1.try_lock("failover:single", TTL).await {
        Ok(l) => {
            rb.acquired("failover:single", l.deadline(), None);
        }
        Err(e) => panic!("B on the promoted replica: {e:#?}"),
    }
    let report = history.check();
    let overlaps: Vec<_> = report
        .violations()
        .iter()
        .filter(|v| v.kind == ViolationKind::Overlap)
        .map(|v| v.to_string())
        .collect();
    assert!(
        overlaps.iter().all(|v| !v.contains("failover:five")),
        "Redlock on 5 nodes must stay safe: {report}"
    );
    assert!(
        overlaps.iter().any(|v| v.contains("failover:single")),
        "the single-instance lock with a promoted replica must show the violation: {report}"
    );
    drop((lock5, lock1));
}
