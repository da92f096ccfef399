//! What a user reads when a lock is refused, times out or is lost, against real
//! `redis-server`s: the message names the resource(s) and says what each node did in plain
//! words, the alternate form (`{:#}`) gives each node's cause, and the lost signal yields
//! the [`Lost`](quorumlock::Lost) it always is, naming its resources.

use std::time::Duration;

use quorumlock::{Error, LostReason, Watchdog};

mod support;

const TTL: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_names_the_resource_and_each_nodes_cause() {
    let cluster = support::proxied(3).await;
    let a = support::client(cluster.urls(), Duration::from_millis(500), false).await;
    let b = support::client(cluster.urls(), Duration::from_millis(500), false).await;
    let held = a.try_lock("orders:42", TTL).await.expect("free");
    cluster.kill(2).await.expect("kill node 2");

    let e = b.try_lock("orders:42", TTL).await.expect_err("held");
    // One node holds A's key, one is down: refused, decided as held or as no quorum.
    let line = e.to_string();
    match &e {
        Error::Held(_) => assert!(
            line.starts_with(
                "\"orders:42\" is held by another owner: 0 of 3 nodes granted (2 needed); "
            ),
            "{line}"
        ),
        Error::NoQuorum(_) => assert!(
            line.starts_with("no quorum for \"orders:42\": 0 of 3 nodes granted (2 needed); "),
            "{line}"
        ),
        other => panic!("refused: {other:?}"),
    }
    assert!(!line.contains('\n'), "one line: {line}");
    // The alternate form has one line per node, node 2's with the cause of its failure.
    let full = format!("{e:#}");
    let lines: Vec<&str> = full.lines().collect();
    assert_eq!(lines.len(), 4, "{full}");
    let down = cluster.urls()[2].clone();
    let port = down.rsplit(':').next().unwrap_or_default().to_owned();
    let node2 = lines
        .iter()
        .find(|l| l.contains(&format!(":{port}")))
        .unwrap_or_else(|| panic!("no line for node 2 ({port}): {full}"));
    assert!(
        node2.contains("failed: ")
            || node2.contains("timed out")
            || node2.contains("not waited for"),
        "{node2}"
    );
    held.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_set_names_every_resource_sorted() {
    let cluster = support::proxied(3).await;
    let a = support::client(cluster.urls(), Duration::from_millis(500), false).await;
    let b = support::client(cluster.urls(), Duration::from_millis(500), false).await;
    let held = a.try_lock("stock:2", TTL).await.expect("free");
    let e = b
        .try_lock_many(["stock:2", "stock:1"], TTL)
        .await
        .expect_err("one of the set is held");
    assert!(
        e.to_string()
            .starts_with("\"stock:1\", \"stock:2\" is held by another owner: "),
        "{e}"
    );
    assert_eq!(
        e.votes().map(|v| v.resources().to_vec()),
        Some(vec!["stock:1".to_owned(), "stock:2".to_owned()])
    );
    held.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lost_signal_yields_lost_naming_the_resource() {
    let cluster = support::proxied(3).await;
    let a = support::client(cluster.urls(), Duration::from_millis(500), false).await;
    let lock = a
        .try_lock("cron:nightly", Duration::from_millis(600))
        .await
        .expect("free");
    let kept = lock
        .keep_alive(Watchdog::new().max_extensions(0))
        .expect("a watchdog policy that fits the TTL");
    let lost = tokio::time::timeout(Duration::from_secs(5), kept.lost())
        .await
        .expect("the signal fires within the TTL");
    // The signal's output is a `Lost`: its reason and resources without a match.
    assert_eq!(lost.reason(), LostReason::MaxExtensions, "{lost}");
    assert_eq!(lost.resources(), ["cron:nightly"]);
    assert!(
        lost.to_string()
            .starts_with("lock on \"cron:nightly\" lost: "),
        "{lost}"
    );
    let released = kept.release().await.expect_err("reported lost");
    assert!(
        released
            .to_string()
            .starts_with("lock on \"cron:nightly\" lost: "),
        "{released}"
    );
}
