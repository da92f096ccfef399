//! The Docker Compose harness (`testkit/compose/`), driven through `testkit::compose::ComposeCluster`:
//! bring up the five masters and the failover pair, check the deployment contract, inject each
//! fault and watch its effect through the ports published on 127.0.0.1, tear down and check
//! that nothing of the project is left.
//!
//! `compose_shared_faults` runs the fault rows of read-write locks and semaphores (written
//! once against `Faults` in `support/shared_scenarios.rs`, also run locally by
//! `tests/shared_faults.rs`) on a Compose project of its own.
//!
//! Skipped (with one line on stderr) when no Docker engine answers.

#[path = "support/shared_scenarios.rs"]
mod shared_scenarios;

use std::io::Write as _;
use std::time::{Duration, Instant};

use quorumlock_testkit::Faults;
use quorumlock_testkit::compose::{ComposeCluster, ComposeOptions, ComposeService};
use redis::aio::MultiplexedConnection;

/// Bound on one client request (connect + command) in these checks.
const REQUEST: Duration = Duration::from_secs(2);

/// The two tests here take turns. Each starts a Compose project of its own, and two
/// projects starting, killing and failing over containers at once on a 2-core machine
/// stalled the healthy nodes of the other project past the scenarios' 250 ms node timeout
/// (seen once in CI: a writer's attempt with one node paused and one cut off found the
/// three healthy nodes unanswered at 251 ms).
static ONE_PROJECT_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn connect(url: &str) -> redis::RedisResult<MultiplexedConnection> {
    let client = redis::Client::open(url)?;
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(REQUEST))
        .set_response_timeout(Some(REQUEST));
    match tokio::time::timeout(
        REQUEST,
        client.get_multiplexed_async_connection_with_config(&config),
    )
    .await
    {
        Ok(r) => r,
        Err(_) => {
            Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out").into())
        }
    }
}

/// One `PING` on a fresh connection, bounded by [`REQUEST`].
async fn answers(url: &str) -> bool {
    let attempt = async {
        let mut con = connect(url).await?;
        redis::cmd("PING").query_async::<String>(&mut con).await
    };
    matches!(tokio::time::timeout(REQUEST, attempt).await, Ok(Ok(ref s)) if s == "PONG")
}

/// Polls [`answers`] until it equals `want`, at most `limit`.
async fn until_answers(url: &str, want: bool, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if answers(url).await == want {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn config_get(con: &mut MultiplexedConnection, key: &str) -> String {
    let pair: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg(key)
        .query_async(con)
        .await
        .unwrap();
    assert_eq!(pair.len(), 2, "CONFIG GET {key}: {pair:?}");
    pair[1].clone()
}

fn docker_lines(args: &[&str]) -> Vec<String> {
    let out = std::process::Command::new("docker")
        .args(args)
        .output()
        .expect("docker runs");
    assert!(
        out.status.success(),
        "docker {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compose_harness_faults_and_failover() {
    let _turn = ONE_PROJECT_AT_A_TIME.lock().await;
    if !ComposeCluster::engine_available() {
        // Written to the real stderr (not the captured test output) so it shows in a normal run.
        let _ = writeln!(
            std::io::stderr(),
            "docker engine not available: skipping compose scenarios"
        );
        return;
    }
    let started = Instant::now();
    // Projects of earlier runs that were killed before their teardown.
    let stale = ComposeCluster::remove_stale("qltest")
        .await
        .expect("remove stale projects");
    if !stale.is_empty() {
        eprintln!("removed stale compose projects: {stale:?}");
    }
    let options = ComposeOptions::isolated("qltest")
        .expect("free ports")
        .failover(true);
    let project = options.project.clone();
    let cluster = ComposeCluster::up(options).await.expect("compose up");
    eprintln!(
        "compose project {project} up in {:?} with image {}: {:?}",
        started.elapsed(),
        cluster.image(),
        cluster.urls()
    );
    assert_eq!(cluster.len(), 5);
    let urls = cluster.urls();

    // Deployment contract on every node, through the published 127.0.0.1 ports.
    for url in &urls {
        assert!(url.starts_with("redis://127.0.0.1:"), "{url}");
        let mut con = connect(url).await.unwrap_or_else(|e| panic!("{url}: {e}"));
        let pong: String = redis::cmd("PING").query_async(&mut con).await.unwrap();
        assert_eq!(pong, "PONG");
        assert_eq!(
            config_get(&mut con, "maxmemory-policy").await,
            "noeviction",
            "{url}"
        );
        assert_eq!(config_get(&mut con, "appendonly").await, "yes", "{url}");
        assert_eq!(config_get(&mut con, "appendfsync").await, "always", "{url}");
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query_async(&mut con)
            .await
            .unwrap();
        assert!(
            info.contains("role:master"),
            "{url} is not an independent master: {info}"
        );
    }

    // kill → the port stops answering; start → answers, and the AOF (fsync always) kept the key.
    {
        let mut con = connect(&urls[0]).await.unwrap();
        let _: () = redis::cmd("SET")
            .arg("ql:compose:persist")
            .arg("1")
            .query_async(&mut con)
            .await
            .unwrap();
        cluster.kill(0).await.expect("kill");
        assert!(
            until_answers(&urls[0], false, Duration::from_secs(10)).await,
            "killed node still answers"
        );
        cluster.start(0).await.expect("start");
        assert!(answers(&urls[0]).await, "started node does not answer");
        let mut con = connect(&urls[0]).await.unwrap();
        let v: Option<String> = redis::cmd("GET")
            .arg("ql:compose:persist")
            .query_async(&mut con)
            .await
            .unwrap();
        assert_eq!(
            v.as_deref(),
            Some("1"),
            "appendfsync always must keep an acknowledged write across SIGKILL"
        );
    }

    // pause → an open connection's request times out (and so does a new one); resume → answers.
    {
        let mut con = connect(&urls[1]).await.unwrap();
        cluster.pause(1).await.expect("pause");
        let r = tokio::time::timeout(
            Duration::from_millis(1500),
            redis::cmd("PING").query_async::<String>(&mut con),
        )
        .await;
        assert!(!matches!(r, Ok(Ok(_))), "paused node answered: {r:?}");
        assert!(
            !answers(&urls[1]).await,
            "paused node answered a new connection"
        );
        cluster.resume(1).await.expect("resume");
        assert!(
            until_answers(&urls[1], true, Duration::from_secs(10)).await,
            "resumed node does not answer"
        );
    }

    // disconnect (blackhole) → TCP still connects but nothing is answered, on an open
    // connection or a new one; it survives a kill/start; reconnect → answers.
    {
        let mut con = connect(&urls[2]).await.unwrap();
        cluster.disconnect(2).await.expect("disconnect");
        cluster
            .disconnect(2)
            .await
            .expect("disconnect is idempotent");
        let r =
            tokio::time::timeout(REQUEST, redis::cmd("PING").query_async::<String>(&mut con)).await;
        assert!(
            !matches!(r, Ok(Ok(_))),
            "blackholed node answered on an open connection: {r:?}"
        );
        assert!(
            !answers(&urls[2]).await,
            "blackholed node answered a new connection"
        );
        cluster
            .restart(2, Duration::ZERO)
            .await
            .expect("restart while blackholed");
        assert!(
            !answers(&urls[2]).await,
            "the blackhole did not survive a restart"
        );
        cluster.reconnect(2).await.expect("reconnect");
        cluster.reconnect(2).await.expect("reconnect is idempotent");
        assert!(answers(&urls[2]).await, "reconnected node does not answer");
    }

    // unplug (docker network disconnect) → Docker unbinds the published port: refused at once.
    {
        let mut con = connect(&urls[4]).await.unwrap();
        cluster
            .unplug_service(ComposeService::Node(4))
            .await
            .expect("unplug");
        let t = Instant::now();
        let r =
            tokio::time::timeout(REQUEST, redis::cmd("PING").query_async::<String>(&mut con)).await;
        assert!(
            matches!(r, Ok(Err(_))),
            "an open connection to an unplugged node must fail, got {r:?}"
        );
        assert!(
            !answers(&urls[4]).await,
            "unplugged node answered a new connection"
        );
        assert!(
            t.elapsed() < REQUEST,
            "unplugging should fail fast, took {:?}",
            t.elapsed()
        );
        cluster
            .plug_service(ComposeService::Node(4))
            .await
            .expect("plug");
        assert!(answers(&urls[4]).await, "plugged node does not answer");
    }

    // The healing operations and kill are idempotent (the Faults contract).
    cluster.resume(0).await.expect("resume of a running node");
    cluster.start(0).await.expect("start of a running node");
    cluster.kill(0).await.expect("kill");
    cluster.kill(0).await.expect("kill of a dead node");
    cluster.start(0).await.expect("start");
    cluster.pause(0).await.expect("pause");
    cluster.start(0).await.expect("start heals a pause");
    assert!(answers(&urls[0]).await);
    assert!(cluster.kill(9).await.is_err(), "out-of-range node");

    // restart with a delay: down during the delay, up afterwards.
    {
        let t = Instant::now();
        let restart = cluster.restart(3, Duration::from_millis(1500));
        let probe = async {
            tokio::time::sleep(Duration::from_millis(700)).await;
            answers(&urls[3]).await
        };
        let (r, answered_mid_restart) = tokio::join!(restart, probe);
        r.expect("restart");
        assert!(
            !answered_mid_restart,
            "node answered during its restart delay"
        );
        assert!(t.elapsed() >= Duration::from_millis(1500));
        assert!(answers(&urls[3]).await, "restarted node does not answer");
    }

    // The other nodes were never affected.
    for url in &urls {
        assert!(answers(url).await, "{url} does not answer after the faults");
    }

    // Failover profile: replication, then promotion.
    {
        let primary = cluster.primary_url().expect("failover profile is up");
        let replica = cluster.replica_url().expect("failover profile is up");
        assert_eq!(cluster.url_of(ComposeService::Primary).unwrap(), primary);
        let mut p = connect(&primary).await.unwrap();
        let mut r = connect(&replica).await.unwrap();
        let _: () = redis::cmd("SET")
            .arg("ql:compose:repl")
            .arg("v1")
            .query_async(&mut p)
            .await
            .unwrap();
        let acked: i64 = redis::cmd("WAIT")
            .arg(1)
            .arg(5000)
            .query_async(&mut p)
            .await
            .unwrap();
        assert_eq!(acked, 1, "the replica did not acknowledge the write");
        let v: Option<String> = redis::cmd("GET")
            .arg("ql:compose:repl")
            .query_async(&mut r)
            .await
            .unwrap();
        assert_eq!(v.as_deref(), Some("v1"));
        let denied = redis::cmd("SET")
            .arg("ql:compose:x")
            .arg("1")
            .query_async::<()>(&mut r)
            .await;
        assert!(
            denied.is_err(),
            "a replica accepted a write before promotion"
        );

        cluster
            .kill_service(ComposeService::Primary)
            .await
            .expect("kill primary");
        cluster.promote_replica().await.expect("promote");
        let mut r = connect(&replica).await.unwrap();
        let _: () = redis::cmd("SET")
            .arg("ql:compose:x")
            .arg("2")
            .query_async(&mut r)
            .await
            .unwrap();
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query_async(&mut r)
            .await
            .unwrap();
        assert!(
            info.contains("role:master"),
            "promoted replica is not a master: {info}"
        );
    }

    // Tear down; nothing of the project may remain.
    cluster.down().await.expect("compose down");
    let label = format!("label=com.docker.compose.project={project}");
    assert_eq!(
        docker_lines(&["ps", "-aq", "--filter", &label]),
        Vec::<String>::new(),
        "containers left"
    );
    // A network may be left only in the daemon's stale-endpoint state (see the test kit's
    // teardown): then nothing at all is attached to it.
    for net in docker_lines(&["network", "ls", "-q", "--filter", &label]) {
        let attached = docker_lines(&[
            "network",
            "inspect",
            "-f",
            "{{range $k, $v := .Containers}}{{$k}} {{end}}",
            &net,
        ]);
        assert_eq!(
            attached,
            Vec::<String>::new(),
            "network {net} left with containers"
        );
    }
    assert_eq!(
        docker_lines(&["volume", "ls", "-q", "--filter", &label]),
        Vec::<String>::new(),
        "volumes left"
    );
    for url in &urls {
        assert!(!answers(url).await, "{url} still answers after down");
    }
    eprintln!("compose scenarios done in {:?}", started.elapsed());
}

/// The fault rows of read-write locks and semaphores on the Compose nodes (AOF `always`, so
/// every restart is within the deployment contract): kill, pause and cut link, restarts at
/// once and delayed, and the random minority nemesis. Each row checks its history: no reader
/// with a writer, no two writers, never more than P permit holders.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compose_shared_faults() {
    use shared_scenarios::*;
    let _turn = ONE_PROJECT_AT_A_TIME.lock().await;
    if !ComposeCluster::engine_available() {
        let _ = writeln!(
            std::io::stderr(),
            "docker engine not available: skipping compose scenarios"
        );
        return;
    }
    let started = Instant::now();
    let stale = ComposeCluster::remove_stale("qlshared")
        .await
        .expect("remove stale projects");
    if !stale.is_empty() {
        eprintln!("removed stale compose projects: {stale:?}");
    }
    let options = ComposeOptions::isolated("qlshared").expect("free ports");
    let cluster = ComposeCluster::up(options).await.expect("compose up");
    let direct = cluster.urls();
    eprintln!(
        "compose project {} up in {:?} with image {}",
        cluster.project(),
        started.elapsed(),
        cluster.image()
    );

    rw_kill_mid_lease(&cluster).await;
    sem_kill_mid_lease(&cluster, &direct).await;
    pause_and_cut(&cluster, &direct).await;
    // A container's kill and start take a second or more: TTLs long enough that the
    // holders are still valid when the node is back.
    let ttl = Duration::from_secs(5);
    rw_restart_in_contract(&cluster, &direct, "compose-rw-aof", Duration::ZERO, ttl).await;
    sem_restart_in_contract(&cluster, &direct, "compose-sem-aof", Duration::ZERO, ttl).await;
    let short = Duration::from_secs(2);
    let delay = short + Duration::from_millis(300);
    rw_restart_in_contract(&cluster, &direct, "compose-rw-delayed", delay, short).await;
    sem_restart_in_contract(&cluster, &direct, "compose-sem-delayed", delay, short).await;
    rw_under_nemesis(&cluster, 5).await;
    sem_under_nemesis(&cluster, 5).await;

    cluster.down().await.expect("compose down");
    eprintln!("compose shared-fault rows done in {:?}", started.elapsed());
}

/// The `clusters` profile: three Redis Clusters of three masters each, on `127.0.0.1`
/// ports, joined and every slot assigned by the kit. In each, a key lives on its slot's
/// master and the others redirect to it; a killed node's slots stop being served while
/// the other masters go on, and it serves them again when started. The link faults refuse
/// a cluster node (it is on the host's network). Nothing of the project is left after
/// `down`.
/// The profile's three clusters as the three voters of one lock: a lock excludes, a
/// waiter is handed it through sharded pub/sub, and with the master serving the lock's
/// slot killed on one voter the lock holds on the two others: refused to a second client,
/// extended, released.
async fn clusters_as_voters(cluster: &ComposeCluster) {
    use quorumlock_testkit::redis_cluster::{cluster_lock_key, key_slot};
    let voters: Vec<String> = (0..3)
        .map(|k| {
            let seeds = cluster.cluster_seeds(k).expect("a cluster");
            let hosts: Vec<&str> = seeds
                .iter()
                .map(|s| s.trim_start_matches("redis://"))
                .collect();
            format!("redis+cluster://{}", hosts.join(","))
        })
        .collect();
    let client = || async {
        quorumlock::Redlock::builder(voters.clone())
            .node_timeout(Duration::from_millis(500))
            .build()
            .await
            .expect("a client of three cluster voters")
    };
    let (a, b) = (client().await, client().await);
    let res = "orders:7";
    let ttl = Duration::from_secs(10);
    let lock = a.try_lock(res, ttl).await.expect("lock on cluster voters");
    let waiter = tokio::spawn({
        let b = b.clone();
        async move { b.lock(res, ttl).await }
    });
    lock.release().await.expect("release");
    let handed = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter is handed the lock in time")
        .expect("task")
        .expect("the waiter's lock");
    handed.release().await.expect("release");

    // A release and an acquisition return at their quorum; the third voter's request may
    // still be on its way. The lock must be on all three voters before one is cut off,
    // or the two left would not both hold it.
    let slot = key_slot(&cluster_lock_key(res));
    let on_voters = |token: Option<String>| {
        let token = token.clone();
        async move {
            let mut n = 0;
            for k in 0..3 {
                let owner = cluster.cluster_owner(k, slot).await.expect("owner");
                let url = cluster
                    .cluster_seeds(k)
                    .and_then(|s| s.get(owner).cloned())
                    .expect("the owner's URL");
                let mut c = redis::Client::open(url)
                    .expect("url")
                    .get_multiplexed_async_connection()
                    .await
                    .expect("connect");
                let v: Option<String> = redis::cmd("GET")
                    .arg(cluster_lock_key(res))
                    .query_async(&mut c)
                    .await
                    .expect("GET");
                n += usize::from(v == token);
            }
            n
        }
    };
    let mut free = false;
    for _ in 0..100 {
        if on_voters(None).await == 3 {
            free = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(free, "the hand-off's release reached every voter");
    let mut lock = a.try_lock(res, ttl).await.expect("lock again");
    let mut everywhere = false;
    for _ in 0..100 {
        if on_voters(Some(lock.token().to_owned())).await == 3 {
            everywhere = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(everywhere, "the lock reached every voter");
    let owner = cluster.cluster_owner(0, slot).await.expect("owner");
    let node = ComposeService::ClusterNode {
        cluster: 0,
        node: owner,
    };
    cluster
        .kill_service(node)
        .await
        .expect("kill the slot's master on voter 0");
    let e = b
        .try_lock(res, ttl)
        .await
        .expect_err("two voters still hold it");
    // Refused: held on the two voters left. Voter 0 fails at once (its slot's master is
    // gone, and requests go straight to it), so the attempt may be decided, no quorum
    // possible, before the third voter's refusal is counted.
    assert!(
        e.is_held() || e.kind() == quorumlock::ErrorKind::NoQuorum,
        "{e}"
    );
    assert!(
        e.votes().is_some_and(|v| v
            .iter()
            .all(|n| n.outcome != quorumlock::NodeOutcome::Granted)),
        "{e}"
    );
    lock.extend(ttl)
        .await
        .expect("extend on two of three voters");
    lock.release()
        .await
        .expect("release on two of three voters");
    let next = b
        .try_lock(res, ttl)
        .await
        .expect("free on two of three voters");
    next.release().await.expect("release");
    cluster.start_service(node).await.expect("start");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compose_clusters_profile() {
    use quorumlock_testkit::redis_cluster::key_slot;
    let _turn = ONE_PROJECT_AT_A_TIME.lock().await;
    if !ComposeCluster::engine_available() {
        let _ = writeln!(
            std::io::stderr(),
            "docker engine not available: skipping compose scenarios"
        );
        return;
    }
    let started = Instant::now();
    let stale = ComposeCluster::remove_stale("qlclusters")
        .await
        .expect("remove stale projects");
    if !stale.is_empty() {
        eprintln!("removed stale compose projects: {stale:?}");
    }
    let options = ComposeOptions::isolated("qlclusters")
        .expect("free ports")
        .clusters(true);
    let project = options.project.clone();
    let cluster = ComposeCluster::up(options).await.expect("compose up");
    eprintln!(
        "compose project {project} with 3 Redis Clusters up in {:?}",
        started.elapsed()
    );
    assert!(cluster.cluster_seeds(3).is_none());
    let key = "quorumlock:lock:{orders:42}";
    let slot = key_slot(key.as_bytes());
    let mut all = Vec::new();
    for k in 0..3 {
        let seeds = cluster.cluster_seeds(k).expect("a cluster");
        assert_eq!(seeds.len(), 3);
        let owner = cluster.cluster_owner(k, slot).await.expect("owner");
        let mut con = connect(&seeds[owner]).await.expect("connect");
        let _: () = redis::cmd("SET")
            .arg(key)
            .arg(k)
            .query_async(&mut con)
            .await
            .expect("SET on the owner");
        for other in (0..3).filter(|&i| i != owner) {
            let mut con = connect(&seeds[other]).await.expect("connect");
            let r: redis::RedisResult<Option<String>> =
                redis::cmd("GET").arg(key).query_async(&mut con).await;
            let e = r.expect_err("a redirect").to_string().to_uppercase();
            assert!(e.contains("MOVED"), "{e}");
        }
        all.extend(seeds);
    }
    // The three clusters are independent: each holds its own value of the key.
    for k in 0..3 {
        let seeds = cluster.cluster_seeds(k).expect("a cluster");
        let owner = cluster.cluster_owner(k, slot).await.expect("owner");
        let mut con = connect(&seeds[owner]).await.expect("connect");
        let v: String = redis::cmd("GET")
            .arg(key)
            .query_async(&mut con)
            .await
            .expect("GET");
        assert_eq!(v, k.to_string());
    }
    // A killed master: its slots go unserved, the other masters go on; started again
    // (AOF and nodes.conf kept), it serves its slots and its key again.
    let seeds = cluster.cluster_seeds(0).expect("a cluster");
    let owner = cluster.cluster_owner(0, slot).await.expect("owner");
    let node = ComposeService::ClusterNode {
        cluster: 0,
        node: owner,
    };
    cluster.kill_service(node).await.expect("kill");
    assert!(!answers(&seeds[owner]).await);
    let survivor = (owner + 1) % 3;
    assert!(answers(&seeds[survivor]).await);
    cluster.start_service(node).await.expect("start");
    let back = async {
        let end = Instant::now() + Duration::from_secs(20);
        while Instant::now() < end {
            if let Ok(mut con) = connect(&seeds[owner]).await {
                let v: redis::RedisResult<String> =
                    redis::cmd("GET").arg(key).query_async(&mut con).await;
                if v.as_deref() == Ok("0") {
                    return true;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        false
    };
    assert!(
        back.await,
        "the restarted master does not serve its key again"
    );
    let cut = cluster.disconnect_service(node).await;
    assert!(
        matches!(&cut, Err(e) if e.kind() == std::io::ErrorKind::Unsupported),
        "{cut:?}"
    );
    clusters_as_voters(&cluster).await;

    cluster.down().await.expect("compose down");
    let label = format!("label=com.docker.compose.project={project}");
    assert_eq!(
        docker_lines(&["ps", "-aq", "--filter", &label]),
        Vec::<String>::new(),
        "containers left"
    );
    for url in &all {
        assert!(!answers(url).await, "{url} still answers after down");
    }
}
