//! Nodes given as redis-rs's connection info (`Redlock::builder_from_info`,
//! `RedlockBuilder::group_from_info`): a `ConnectionInfo`, a `(host, port)` pair or a URL
//! string, checked at `build()` as a URL is, passwords never shown.

use std::time::Duration;

use quorumlock::Redlock;
use quorumlock_testkit::LocalCluster;
use redis::IntoConnectionInfo;
use support::{nodes_config_error, require_password};

mod support;

const TTL: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_given_as_connection_info_lock_and_hide_their_password() {
    let cluster = LocalCluster::builder(3).launch().await.expect("cluster");
    // Node 2 asks for a password; its connection info carries it.
    require_password(&cluster.direct_url(2).expect("url"), "pa55word").await;
    let urls = cluster.urls();
    let port = |i: usize| cluster.port(i).expect("port");
    let with_password = urls[2]
        .as_str()
        .into_connection_info()
        .expect("a URL")
        .set_redis_settings(redis::RedisConnectionInfo::default().set_password("pa55word"));
    let locks = Redlock::builder_from_info([
        urls[0].as_str().into_connection_info().expect("a URL"),
        ("127.0.0.1", port(1))
            .into_connection_info()
            .expect("a pair"),
        with_password,
    ])
    .strict(true)
    .build()
    .await
    .expect("every node accepts the credentials it was given");
    let shown = format!("{locks:?} {:?}", locks.nodes());
    assert!(!shown.contains("pa55word"), "{shown}");
    // With node 0 down, a grant needs node 2: it votes with its connection info's
    // password.
    cluster.kill(0).await.expect("kill node 0");
    let lock = locks
        .try_lock("info:lock", TTL)
        .await
        .expect("nodes 1 and 2 grant");
    lock.release().await.expect("release");
}

#[tokio::test]
async fn connection_info_is_checked_at_build_as_a_url_is() {
    // Not convertible by redis-rs: reported at build, naming the node, not the text.
    let text = nodes_config_error(
        Redlock::builder_from_info(["redis://127.0.0.1:1", "secret-not-a-url"])
            .build()
            .await,
    );
    assert!(text.contains("node #2"), "{text}");
    assert!(!text.contains("secret-not-a-url"), "{text}");
    // One node given twice, once as a URL and once as a pair.
    let text = nodes_config_error(
        Redlock::builder_from_info([
            "redis://127.0.0.1:7".into_connection_info().expect("a URL"),
            ("127.0.0.1", 7).into_connection_info().expect("a pair"),
        ])
        .build()
        .await,
    );
    assert!(text.contains("the same node"), "{text}");
}
