//! The rule that the head of a wait queue claims when its join or renewal finds the key
//! free (or transferred to it) on a quorum: the claim loop it must not become, the quorum
//! it needs, and the release it must end with a node down. Real `redis-server` processes
//! through `LocalCluster`.

#[path = "support/scripts.rs"]
mod scripts;
mod support;

use std::time::{Duration, Instant};

use quorumlock::{Redlock, Retry};
use quorumlock_testkit::{LocalCluster, ProxyMode};
use support::{
    acquires_run, del_on, heralds, lock_key, log_every_command, queue_keys, queued_on, raw,
};

type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// A claim that fails although no node refused it (here: two of three nodes 60 ms away,
/// and a minimum validity of 900 ms of a 1 s TTL) must not be repeated at network speed
/// because the next renewal finds the key free again: the retry delay (2 s) holds. Over
/// the 5 s after the key became free, at most 4 claims (10 before the fix).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_claim_on_a_free_key_keeps_the_retry_delay() -> TestResult {
    let cluster = LocalCluster::builder(3).proxies(true).launch().await?;
    let res = "head-claims-free-loop";
    let direct: Vec<String> = (0..3)
        .map(|i| cluster.direct_url(i))
        .collect::<Result<_, _>>()?;
    let holder = Redlock::builder(direct).build().await?;
    let waiter = Redlock::builder(cluster.urls())
        .retry(
            Retry::new()
                .delay(Duration::from_secs(2), Duration::from_secs(2))
                .max_wait(Duration::from_secs(6)),
        )
        .node_timeout(Duration::from_millis(400))
        .min_validity(Duration::from_millis(900))
        .build()
        .await?;
    let _lock = holder.try_lock(res, Duration::from_secs(30)).await?;
    let w = tokio::spawn(async move { waiter.lock(res, Duration::from_secs(1)).await });
    queued_on(&cluster, res, &[0, 1, 2], 1).await?;
    for i in [1, 2] {
        cluster
            .proxy(i)?
            .set_mode(ProxyMode::Delay(Duration::from_millis(60)));
    }
    log_every_command(&cluster).await?;
    // The key becomes free with no announcement (an expiry, or a release whose
    // announcement the waiter spent on a claim that overtook it).
    del_on(&cluster, &[0, 1, 2], &[lock_key(res)]).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let claims: Vec<String> = acquires_run(&cluster)
        .await
        .into_iter()
        .filter(|(i, args)| *i == 0 && args.first().is_some_and(|a| a == "EVALSHA"))
        .filter_map(|(_, args)| args.get(4).cloned())
        .collect();
    println!("5 s after the key was freed: {} claims", claims.len());
    let _ = tokio::time::timeout(Duration::from_secs(10), w).await?;
    assert!(
        claims.len() <= 4,
        "{} claims in 5 s with a retry delay of 2 s",
        claims.len()
    );
    Ok(())
}

/// The same loop with a failure that costs no time: a fenced client, two of three nodes'
/// fence counters unreadable (their fenced acquire fails: an error, not a refusal), the
/// key free. Retry delay 2 s, maximum wait 4 s: at most 4 attempts (720–773 before the
/// fix).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_fenced_claim_on_a_free_key_keeps_the_retry_delay() -> TestResult {
    let cluster = LocalCluster::builder(3).launch().await?;
    let res = "head-claims-free-loop-fenced";
    let holder = Redlock::builder(cluster.urls())
        .fencing(true)
        .build()
        .await?;
    let waiter = Redlock::builder(cluster.urls())
        .fencing(true)
        .retry(
            Retry::new()
                .delay(Duration::from_secs(2), Duration::from_secs(2))
                .max_wait(Duration::from_secs(4)),
        )
        .build()
        .await?;
    let _lock = holder.try_lock(res, Duration::from_secs(30)).await?;
    let w = tokio::spawn(async move { waiter.lock(res, Duration::from_secs(10)).await });
    queued_on(&cluster, res, &[0, 1, 2], 1).await?;
    for i in [1, 2] {
        let _: () = redis::cmd("SET")
            .arg(format!("quorumlock:fence:{res}"))
            .arg("not-a-number")
            .query_async(&mut raw(&cluster, i).await)
            .await?;
    }
    del_on(&cluster, &[0, 1, 2], &[lock_key(res)]).await;
    let got = tokio::time::timeout(Duration::from_secs(10), w).await??;
    let attempts = match &got {
        Err(quorumlock::Error::Timeout(t)) => t.attempts(),
        other => return Err(format!("unexpected: {other:?}").into()),
    };
    println!("the waiter gave up after {attempts} attempts (max wait 4 s, retry delay 2 s)");
    assert!(
        attempts <= 4,
        "{attempts} attempts in 4 s with a retry delay of 2 s"
    );
    Ok(())
}

/// The holder keeps its key on two of three nodes (a quorum); the third node's key is
/// gone. The head's renewals find the key free on one node only: it does not claim into
/// the held lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_head_does_not_claim_on_a_minority_of_free_keys() -> TestResult {
    let cluster = LocalCluster::builder(3).launch().await?;
    let res = "head-claims-minority-free";
    let holder = Redlock::builder(cluster.urls()).build().await?;
    let waiter = Redlock::builder(cluster.urls())
        .retry(
            Retry::new()
                .delay(Duration::from_secs(30), Duration::from_secs(30))
                .max_wait(Duration::from_secs(4)),
        )
        .build()
        .await?;
    let lock = holder.try_lock(res, Duration::from_secs(30)).await?;
    let w = tokio::spawn(async move { waiter.lock(res, Duration::from_secs(10)).await });
    queued_on(&cluster, res, &[0, 1, 2], 1).await?;
    log_every_command(&cluster).await?;
    del_on(&cluster, &[0], &[lock_key(res)]).await;
    // Two renewals (one a second).
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let claims = acquires_run(&cluster).await;
    assert!(
        claims.is_empty(),
        "the head claimed into a held lock: {claims:?}"
    );
    drop(lock);
    w.abort();
    Ok(())
}

/// Five nodes, one down; a plain release reaches the two heralds at once and the two
/// other live nodes 80 ms late, so the waiter's claim, prompted by the first herald,
/// overtakes it there. The release then lands before the waiter's next join on some
/// nodes (the key free there) and after it on others (the key transferred to it):
/// neither alone a quorum of three. Together they are: the head claims at its next
/// renewal, not at its fallback timer (30 s, beyond its maximum wait of 8 s; it gave up
/// in 10 runs of 13 before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overtaken_release_with_a_node_down_is_ended_by_a_claim() -> TestResult {
    overtaken_release_on_five(true).await
}

/// The control: every node up, the three non-heralds 80 ms late: handed over by transfer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overtaken_release_with_every_node_up_is_handed_over() -> TestResult {
    overtaken_release_on_five(false).await
}

async fn overtaken_release_on_five(kill: bool) -> TestResult {
    let n = 5;
    let res = "head-claims-overtaken-5";
    let [h1, h2] = heralds(res, n);
    let others: Vec<usize> = (0..n).filter(|i| *i != h1 && *i != h2).collect();
    let dead = others.first().copied().ok_or("no other node")?;
    let slow: Vec<usize> = if kill {
        others.iter().copied().skip(1).collect()
    } else {
        others.clone()
    };
    let cluster = LocalCluster::builder(n).proxies(true).launch().await?;
    let holder = Redlock::builder(cluster.urls()).build().await?;
    let direct: Vec<String> = (0..n)
        .map(|i| cluster.direct_url(i))
        .collect::<Result<_, _>>()?;
    let waiter = Redlock::builder(direct)
        .retry(
            Retry::new()
                .delay(Duration::from_secs(30), Duration::from_secs(30))
                .max_wait(Duration::from_secs(8)),
        )
        .build()
        .await?;
    if kill {
        cluster.kill(dead).await?;
    }
    let ttl = Duration::from_secs(10);
    let lock = holder.try_lock(res, ttl).await?;
    let w = tokio::spawn(async move { waiter.lock(res, ttl).await });
    let live: Vec<usize> = (0..n).filter(|i| !kill || *i != dead).collect();
    queued_on(&cluster, res, &live, 1).await?;
    // No queue: the release is plain where it lands before the waiter queues again.
    del_on(&cluster, &live, &queue_keys(res)).await;
    for &i in &slow {
        cluster
            .proxy(i)?
            .set_mode(ProxyMode::Delay(Duration::from_millis(80)));
    }
    // The release script is cached on every node: through the 80 ms delays a `NOSCRIPT`
    // exchange would take two round trips (320 ms), past the node timeout (200 ms).
    for &i in &live {
        let _: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(scripts::source("release_one"))
            .query_async(&mut raw(&cluster, i).await)
            .await?;
    }
    let releasing = Instant::now();
    lock.release().await?;
    let got = tokio::time::timeout(Duration::from_secs(12), w).await??;
    let took = releasing.elapsed();
    println!("node down {kill}: the waiter ended {took:?} after the release began");
    let held = got?;
    assert!(held.is_valid());
    assert!(took < Duration::from_secs(3), "{took:?}");
    held.release().await?;
    Ok(())
}
