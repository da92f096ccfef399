//! Read-write locks against real redis-server processes.
#![cfg(feature = "testkit")]

mod support;

use std::time::Duration;

use quorumlock::testkit::LocalCluster;
use quorumlock::{LockMode, Redlock};

const TTL: Duration = Duration::from_secs(10);

async fn client(urls: &[String]) -> Redlock {
    Redlock::builder(urls)
        .node_timeout(Duration::from_millis(250))
        .build()
        .await
        .expect("build")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_share_and_a_writer_excludes_them() {
    let c = LocalCluster::launch(3).await.expect("cluster");
    let a = client(&c.urls()).await;
    let r1 = a.try_read_lock("rw:a", TTL).await.expect("reader 1");
    let r2 = a.try_read_lock("rw:a", TTL).await.expect("reader 2");
    assert_eq!(r1.mode(), LockMode::Read);
    let w = a.try_write_lock("rw:a", TTL).await;
    assert!(matches!(&w, Err(e) if e.is_held()), "{w:?}");
    r1.release().await.expect("release 1");
    r2.release().await.expect("release 2");
    let w = a.try_write_lock("rw:a", TTL).await.expect("writer");
    assert_eq!(w.mode(), LockMode::Write);
    let r = a.try_read_lock("rw:a", TTL).await;
    assert!(matches!(&r, Err(e) if e.is_held()), "{r:?}");
    w.release().await.expect("release writer");
}
