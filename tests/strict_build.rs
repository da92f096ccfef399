//! A strict build (`RedlockBuilder::strict(true)`) fails when any node refuses the client's
//! credentials at start, naming the node and the cause; a lenient build (the default)
//! locks on the others, and a node that is merely down fails neither.
//!
//! The TLS cases (a server certificate not trusted, a client certificate refused) are in
//! `tests/tls.rs`, beside the certificates they need.

use std::time::Duration;

use quorumlock::Redlock;
use quorumlock_testkit::LocalCluster;
use quorumlock_testkit::redis_cluster::RedisCluster;
use support::{nodes_config_error as config_text, require_password};

mod support;

const TTL: Duration = Duration::from_secs(10);

/// Three nodes; node 2 requires `password` (set on the server after it started, as an
/// operator would).
async fn third_node_with_password(password: &str) -> LocalCluster {
    let cluster = LocalCluster::builder(3).launch().await.expect("cluster");
    require_password(&cluster.direct_url(2).expect("url"), password).await;
    cluster
}

/// The URLs of `cluster`, each with `password` (Redis refuses a password where none is
/// set, so a test gives it only to the node that asks for it).
fn with_password(cluster: &LocalCluster, password: &str) -> Vec<String> {
    cluster
        .urls()
        .iter()
        .map(|u| u.replacen("redis://", &format!("redis://:{password}@"), 1))
        .collect()
}

fn builder(urls: &[String]) -> quorumlock::RedlockBuilder {
    Redlock::builder(urls).connect_timeout(Duration::from_secs(5))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_refuses_the_password_fails_a_strict_build_and_is_named() {
    let cluster = third_node_with_password("s3cret").await;
    let urls = cluster.urls();
    let text = config_text(builder(&urls).strict(true).build().await);
    let third = urls[2].trim_start_matches("redis://");
    assert!(
        text.contains(third) && !text.contains(urls[0].trim_start_matches("redis://")),
        "names the node that refused, and only it: {text}"
    );
    assert!(
        text.contains("refused this client's credentials") && text.contains("uthentication"),
        "says the cause: {text}"
    );
    // A wrong password (not a missing one) reads the same way, and never shows the one
    // given.
    let mut urls = cluster.urls();
    urls[2] = with_password(&cluster, "wrong-pass").remove(2);
    let text = config_text(builder(&urls).strict(true).build().await);
    assert!(text.contains(third), "{text}");
    assert!(
        !text.contains("wrong-pass"),
        "no password in the error: {text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lenient_build_locks_on_the_nodes_that_accept_the_credentials() {
    let cluster = third_node_with_password("s3cret").await;
    let locks = builder(&cluster.urls())
        .build()
        .await
        .expect("the default build is lenient");
    let lock = locks
        .try_lock("strict:lenient", TTL)
        .await
        .expect("2 of 3 nodes are a quorum");
    lock.release().await.expect("release");
    // With the right password where it is asked for, a strict build succeeds.
    let mut urls = cluster.urls();
    urls[2] = with_password(&cluster, "s3cret").remove(2);
    let strict = builder(&urls).strict(true).build().await;
    assert!(strict.is_ok(), "{:?}", strict.err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_is_down_does_not_fail_a_strict_build() {
    let cluster = LocalCluster::builder(3).launch().await.expect("cluster");
    cluster.kill(2).await.expect("kill node 2");
    let locks = builder(&cluster.urls())
        .connect_timeout(Duration::from_millis(300))
        .strict(true)
        .build()
        .await
        .expect("a dead minority is a fault, not a misconfiguration");
    let lock = locks
        .try_lock("strict:down", TTL)
        .await
        .expect("2 of 3 nodes are a quorum");
    lock.release().await.expect("release");
}

/// A Redis Cluster voter (`redis+cluster://`) whose nodes require a password the client
/// does not give (`NOAUTH` on `CLUSTER NODES`) fails a strict build. A *wrong* password on
/// a cluster voter is not told apart: redis-rs's cluster client reports only that it found
/// no connection (documented on `RedlockBuilder::strict`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_voter_that_asks_for_a_password_fails_a_strict_build() {
    let (a, b, c) = tokio::join!(
        RedisCluster::launch(1, 0),
        RedisCluster::launch(1, 0),
        RedisCluster::launch(1, 0),
    );
    let (a, b, c) = (
        a.expect("cluster"),
        b.expect("cluster"),
        c.expect("cluster"),
    );
    for url in c.seed_urls() {
        require_password(&url, "s3cret").await;
    }
    let text = config_text(
        builder(&[a.voter_url(), b.voter_url(), c.voter_url()])
            .connect_timeout(Duration::from_secs(3))
            .strict(true)
            .build()
            .await,
    );
    assert!(text.contains("refused this client's credentials"), "{text}");
}
