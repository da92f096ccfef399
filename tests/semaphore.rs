//! Semaphores against real redis-server processes.
#![cfg(feature = "testkit")]

mod support;

use std::time::Duration;

use quorumlock::testkit::LocalCluster;
use quorumlock::{Error, LockMode, Redlock};

const TTL: Duration = Duration::from_secs(10);

async fn client(urls: &[String]) -> Redlock {
    Redlock::builder(urls)
        .node_timeout(Duration::from_millis(250))
        .build()
        .await
        .expect("build")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smoke() {
    let c = LocalCluster::launch(3).await.expect("cluster");
    let a = client(&c.urls()).await;
    let s = a.semaphore("sem:a", 3).expect("sem");
    assert_eq!(s.capacity(), 3);
    let p1 = s.try_acquire(TTL).await.expect("p1");
    assert_eq!(p1.mode(), LockMode::Permit);
    assert!(a.flush(Duration::from_secs(2)).await);
    let p2 = s.try_acquire(TTL).await.expect("p2");
    assert!(a.flush(Duration::from_secs(2)).await);
    let p3 = s.try_acquire(TTL).await.expect("p3");
    let r = s.try_acquire(TTL).await;
    assert!(matches!(&r, Err(e) if e.is_held()), "{r:?}");
    let other = a.semaphore("sem:a", 4).expect("sem");
    match other.try_acquire(TTL).await {
        Err(Error::PermitsMismatch(m)) => {
            assert_eq!(m.stored(), "3:2:2:3");
            assert_eq!(m.requested(), "4:2:2:3");
        }
        r => panic!("{r:?}"),
    }
    p1.release().await.expect("r1");
    p2.release().await.expect("r2");
    p3.release().await.expect("r3");
}
