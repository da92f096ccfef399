//! Adversarial probes of the wait queue against real `redis-server`s: holders that never
//! had to wait, heralds slower than the other nodes, heralds restarted empty.
#![cfg(feature = "testkit")]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use quorumlock::testkit::{LocalCluster, ProxyMode};
use quorumlock::{Error, Redlock, Retry};

type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// The resource's two herald nodes out of `n`: the nodes that announce its releases and
/// keep its wait queue (FNV-1a of the name modulo `n`, and the next one).
fn heralds(name: &str, n: usize) -> [usize; 2] {
    let h = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    let first = (h % n as u64) as usize;
    [first, (first + 1) % n]
}

/// Five nodes; the resource's two heralds answer one client 30 ms late (a second data
/// centre, a loaded host). That client takes the lock with `lock` and gets it at the first
/// attempt, holds it 10 ms, releases, and takes it again, in a loop. Its releases are
/// decided by the three fast nodes, which keep no queue and report no waiters: it must
/// still not take the lock again ahead of a queued waiter. A waiter that arrives while it
/// holds (no one else waiting) is served within two hand-offs (one for the greedy
/// client's re-acquisition before the waiter's place reached the heralds, one of slack).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_that_never_waited_leaves_the_lock_to_a_queued_waiter() -> TestResult {
    let resource = "wr:greedy";
    let cluster = LocalCluster::builder(5).proxies(true).launch().await?;
    let slow = heralds(resource, 5);
    let mut greedy_urls = Vec::new();
    for i in 0..5 {
        if slow.contains(&i) {
            cluster
                .proxy(i)?
                .set_mode(ProxyMode::Delay(Duration::from_millis(30)));
            greedy_urls.push(cluster.url(i)?);
        } else {
            greedy_urls.push(cluster.direct_url(i)?);
        }
    }
    let direct: Vec<String> = (0..5)
        .map(|i| cluster.direct_url(i))
        .collect::<Result<_, _>>()?;
    let greedy = Redlock::builder(&greedy_urls)
        .node_timeout(Duration::from_millis(500))
        .build()
        .await?;
    let stop = Arc::new(AtomicBool::new(false));
    let holds = Arc::new(AtomicU64::new(0));
    let (stop2, holds2) = (stop.clone(), holds.clone());
    let g = tokio::spawn(async move {
        let started = Instant::now();
        while !stop2.load(Ordering::Relaxed) && started.elapsed() < Duration::from_secs(20) {
            let lock = greedy.lock(resource, Duration::from_secs(10)).await?;
            holds2.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(10)).await;
            lock.release().await?;
        }
        Ok::<_, Error>(())
    });
    // The greedy client is in its loop before the waiter arrives.
    let t = Instant::now();
    while holds.load(Ordering::Relaxed) < 3 && t.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(
        holds.load(Ordering::Relaxed) >= 3,
        "the greedy loop never ran"
    );
    let waiter = Redlock::builder(&direct)
        .node_timeout(Duration::from_millis(500))
        .build()
        .await?;
    let patient = Retry::new()
        .delay(Duration::from_secs(2), Duration::from_secs(2))
        .max_wait(Duration::from_secs(6));
    let before = holds.load(Ordering::Relaxed);
    let got = waiter
        .lock_with(resource, Duration::from_secs(10), patient)
        .await;
    let during = holds.load(Ordering::Relaxed) - before;
    stop.store(true, Ordering::Relaxed);
    let outcome = match got {
        Ok(l) => {
            l.release().await?;
            Ok(())
        }
        Err(e) => Err(e),
    };
    tokio::time::timeout(Duration::from_secs(30), g).await???;
    eprintln!("greedy holder took the lock {during} times while the waiter waited: {outcome:?}");
    assert!(outcome.is_ok(), "the waiter gave up: {outcome:?}");
    assert!(
        during <= 2,
        "the releaser took the lock {during} times ahead of the queued waiter"
    );
    Ok(())
}
