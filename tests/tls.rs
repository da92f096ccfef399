//! TLS (`rediss://`) against real redis-server processes serving TLS, with a certificate
//! authority and server certificates the test makes itself.
#![cfg(feature = "tls-rustls")]

#[path = "support/logs.rs"]
mod logs;
mod support;

use std::time::Duration;

use quorumlock::{Error, NodeOutcome, Redlock};
use quorumlock_testkit::LocalCluster;
use support::pki::{ClientCert, Pki};
use support::*;

const TTL: Duration = Duration::from_secs(10);

/// How a node's failure reads when the server's certificate does not verify.
const REJECTED: &str = "TLS handshake failed, server certificate rejected (see tls_root_ca): invalid peer certificate: ";

/// A client with a generous per-node timeout: a TLS handshake on a loaded 2-core machine
/// in a debug build is slow, and these tests are about outcomes.
fn builder(urls: &[String]) -> quorumlock::RedlockBuilder {
    Redlock::builder(urls)
        .node_timeout(Duration::from_secs(1))
        .connect_timeout(Duration::from_secs(5))
}

/// `CLIENT LIST` of node `i`, read through its plain port.
async fn client_list(c: &LocalCluster, i: usize) -> String {
    let mut con = raw(c, i).await;
    redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(&mut con)
        .await
        .expect("CLIENT LIST")
}

/// Every per-node failure text of a vote, asserting there is no grant.
fn failures(e: &Error) -> Vec<String> {
    let votes = match e {
        Error::NoQuorum(v) => v,
        other => panic!("expected NoQuorum, got {other:?}"),
    };
    assert_eq!(votes.granted(), 0, "{votes:#}");
    assert!(votes.failed() >= votes.quorum(), "{votes:#}");
    votes
        .iter()
        .filter_map(|v| match &v.outcome {
            NodeOutcome::Failed(text) => Some(text.clone()),
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t10_rediss_lock_wait_and_release() {
    let pki = Pki::new("A");
    let c = pki.cluster(3).await;
    let urls = c.urls();
    assert!(
        urls.iter().all(|u| u.starts_with("rediss://127.0.0.1:")),
        "{urls:?}"
    );
    let a = builder(&urls)
        .tls_root_ca(pki.ca_pem.clone())
        .build()
        .await
        .expect("build a");
    let b = builder(&urls)
        .tls_root_ca(pki.ca_pem.as_bytes())
        .build()
        .await
        .expect("build b");
    assert!(a.nodes()[0].to_string().starts_with("rediss://"), "{a:?}");
    let shown = format!("{a:?}");
    assert!(
        shown.contains("bytes of PEM") && !shown.contains("BEGIN CERTIFICATE"),
        "Debug shows the CA's size, not its contents: {shown}"
    );

    let lock = a.try_lock("tls:orders", TTL).await.expect("lock over TLS");
    let key = lock_key("tls:orders");
    assert!(
        eventually(Duration::from_secs(5), || async {
            count_key(&c, 0..3, &key).await == 3
        })
        .await,
        "the key is on every node"
    );
    assert_eq!(get(&c, 0, &key).await.as_deref(), Some(lock.token()));

    // A waiter subscribes to release announcements over TLS too.
    let waiter = tokio::spawn(async move { b.lock("tls:orders", TTL).await });
    let tls_port = subscribed_on_tls_port(&c).await;
    let laddr = format!("laddr=127.0.0.1:{tls_port} ");
    // Every client connection quorumlock opened is on the TLS port; the plain port only
    // carries this test's own inspection.
    let list = client_list(&c, 0).await;
    assert!(
        list.lines().filter(|l| l.contains(&laddr)).count() >= 3,
        "{list}"
    );

    lock.release().await.expect("release over TLS");
    let next = tokio::time::timeout(Duration::from_secs(15), waiter)
        .await
        .expect("waiter finished")
        .expect("waiter task")
        .expect("waiter got the lock after the release");
    next.release().await.expect("release");
    assert!(
        eventually(Duration::from_secs(5), || async {
            count_key(&c, 0..3, &key).await == 0
        })
        .await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t20_wrong_ca_fails_with_a_certificate_error() {
    let server_pki = Pki::new("A");
    let other = Pki::new("B");
    let c = server_pki.cluster(3).await;
    let locks = builder(&c.urls())
        .tls_root_ca(other.ca_pem.clone())
        .build()
        .await
        .expect("build succeeds: unreachable nodes are retried on each request");
    let err = locks
        .try_lock("tls:wrong-ca", TTL)
        .await
        .expect_err("a server signed by an untrusted CA must not grant");
    let texts = failures(&err);
    assert!(!texts.is_empty());
    for t in &texts {
        assert!(
            t.contains(REJECTED) && t.contains("UnknownIssuer"),
            "a clear certificate error: {t}"
        );
    }
    // Waiting with retries gives up when the policy runs out, with the same reason in the
    // last vote, without a panic.
    let locks = builder(&c.urls())
        .tls_root_ca(other.ca_pem.clone())
        .retry(quorumlock::Retry::new().attempts(2))
        .build()
        .await
        .expect("build");
    let err = locks.lock("tls:wrong-ca", TTL).await.expect_err("no grant");
    let last = err.votes().expect("the last vote").to_string();
    assert!(matches!(err, Error::Timeout(_)), "{err:?}");
    assert!(
        format!("{:#}", err.votes().expect("votes")).contains("UnknownIssuer"),
        "{last}"
    );
    assert_eq!(count_key(&c, 0..3, &lock_key("tls:wrong-ca")).await, 0);
    // A strict build fails at once, naming a node and the certificate error.
    let text = strict_refusal(builder(&c.urls()).tls_root_ca(other.ca_pem.clone())).await;
    assert!(
        text.contains(REJECTED) && text.contains("UnknownIssuer"),
        "a clear certificate error: {text}"
    );
}

/// The configuration error a strict build of `b` fails with, asserting it names a node.
async fn strict_refusal(b: quorumlock::RedlockBuilder) -> String {
    match b.strict(true).build().await {
        Err(Error::Config(c)) => {
            let text = c.to_string();
            assert_eq!(c.field(), "nodes", "{text}");
            assert!(
                text.contains("refused this client's credentials at start"),
                "{text}"
            );
            assert!(text.contains("127.0.0.1:"), "names the node: {text}");
            text
        }
        Err(other) => panic!("expected a configuration error, got {other:?}"),
        Ok(_) => panic!("a strict build must fail"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t25_certificate_for_another_host_fails_with_a_certificate_error() {
    // Signed by the trusted CA, but for another name than the URL's host.
    let pki = Pki::for_names("A", &["redis.example.internal"]);
    let c = pki.cluster(1).await;
    let locks = builder(&c.urls())
        .tls_root_ca(pki.ca_pem.clone())
        .build()
        .await
        .expect("build");
    let err = locks.try_lock("tls:name", TTL).await.expect_err("no grant");
    for t in failures(&err) {
        assert!(
            t.contains(REJECTED) && t.to_lowercase().contains("not valid for"),
            "a clear certificate error: {t}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t30_without_tls_root_ca_the_system_roots_apply() {
    let pki = Pki::new("A");
    let c = pki.cluster(1).await;
    // The test CA is in no system trust store: the handshake fails, clearly, no panic.
    let locks = builder(&c.urls()).build().await.expect("build");
    let err = locks
        .try_lock("tls:system", TTL)
        .await
        .expect_err("no grant");
    for t in failures(&err) {
        assert!(
            t.contains(REJECTED) && t.contains("UnknownIssuer"),
            "a clear certificate error: {t}"
        );
    }
}

#[tokio::test]
async fn t40_malformed_root_ca_is_a_config_error_at_build() {
    let cert_block =
        |body: &str| format!("-----BEGIN CERTIFICATE-----\n{body}\n-----END CERTIFICATE-----\n");
    let key_only = rcgen::KeyPair::generate().expect("key").serialize_pem();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("empty", Vec::new()),
        ("not PEM", b"this is not a certificate".to_vec()),
        ("a private key, no certificate", key_only.into_bytes()),
        (
            "bad base64",
            cert_block("%%%% not base64 %%%%").into_bytes(),
        ),
        (
            "base64 that is not a certificate",
            cert_block("aGVsbG8gd29ybGQ=").into_bytes(),
        ),
    ];
    for (what, pem) in cases {
        let err = Redlock::builder(["rediss://127.0.0.1:1"])
            .tls_root_ca(pem)
            .build()
            .await
            .expect_err(what);
        match &err {
            Error::Config(c) => assert_eq!(c.field(), "tls_root_ca", "{what}: {err}"),
            other => panic!("{what}: expected a config error, got {other:?}"),
        }
        assert!(err.to_string().contains("tls_root_ca"), "{what}: {err}");
    }
}

#[tokio::test]
async fn t50_insecure_fragment_is_refused() {
    let err = Redlock::builder(["rediss://127.0.0.1:1/#insecure"])
        .build()
        .await
        .expect_err("#insecure");
    match &err {
        Error::Config(c) => {
            assert_eq!(c.field(), "nodes");
            assert!(err.to_string().contains("#insecure"), "{err}");
        }
        other => panic!("expected a config error, got {other:?}"),
    }
}

#[tokio::test]
async fn t60_testkit_tls_refuses_proxies_and_reports_bad_files() {
    let pki = Pki::new("A");
    let err = LocalCluster::builder(1)
        .tls(
            pki.path("server.pem"),
            pki.path("server.key"),
            pki.path("ca.pem"),
        )
        .proxies(true)
        .launch()
        .await
        .expect_err("TLS with proxies");
    assert_eq!(err.kind(), std::io::ErrorKind::Unsupported, "{err}");
    // A key file that does not exist: the server's own complaint, from its log.
    let err = LocalCluster::builder(1)
        .tls(
            pki.path("server.pem"),
            pki.path("missing.key"),
            pki.path("ca.pem"),
        )
        .launch()
        .await
        .expect_err("missing key file");
    assert!(err.to_string().contains("exited during start-up"), "{err}");
}

/// Asserts that no piece of `key` is in `shown` (`what` says where it comes from).
fn assert_no_key(shown: &str, key: &ClientCert, what: &str) {
    assert!(
        !shown.contains("PRIVATE KEY-----"),
        "{what} shows a key: {shown}"
    );
    for secret in key.secrets() {
        assert!(
            !shown.contains(secret),
            "{what} shows key material: {shown}"
        );
    }
}

/// Tries `res` until every node of `locks` has failed at least once (a vote ends as soon as
/// a quorum failed, so one attempt may leave a node not awaited), at most 10 attempts;
/// asserts no attempt is granted anywhere. Returns each node's failure text, by node.
async fn every_node_fails(
    locks: &Redlock,
    res: &str,
) -> std::collections::BTreeMap<String, String> {
    let mut failed = std::collections::BTreeMap::new();
    for _ in 0..10 {
        let err = locks.try_lock(res, TTL).await.expect_err("no grant");
        let votes = match &err {
            Error::NoQuorum(v) => v,
            other => panic!("expected NoQuorum, got {other:?}"),
        };
        assert_eq!(votes.granted(), 0, "{votes:#}");
        assert!(votes.failed() >= votes.quorum(), "{votes:#}");
        for v in votes.iter() {
            match &v.outcome {
                NodeOutcome::Failed(text) => {
                    failed.insert(v.node.to_string(), text.clone());
                }
                NodeOutcome::NotAwaited => {}
                other => panic!("node {}: {other:?} ({votes:#})", v.node),
            }
        }
        if failed.len() == locks.nodes().len() {
            break;
        }
    }
    failed
}

/// How a node's failure reads when the server refuses the client's certificate.
const CLIENT_REFUSED: &str =
    "TLS handshake failed, client certificate refused by the server (see tls_client_auth): ";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t70_client_certificate_locks_extends_and_releases() {
    logs::capture(tracing::Level::TRACE);
    let pki = Pki::new("A");
    let me = pki.client_cert("good");
    let c = pki.cluster_requiring_client_certs(3).await;
    let urls = c.urls();
    let a = builder(&urls)
        .tls_root_ca(pki.ca_pem.clone())
        .tls_client_auth(me.cert_pem.clone(), me.key_pem.clone());
    assert_no_key(&format!("{a:?}"), &me, "the builder's Debug");
    let a = a.build().await.expect("build a");
    let b = builder(&urls)
        .tls_root_ca(pki.ca_pem.as_bytes())
        .tls_client_auth(me.cert_pem.as_bytes(), me.key_pem.as_bytes())
        .build()
        .await
        .expect("build b");
    let shown = format!("{a:?}");
    assert!(shown.contains("private key: redacted"), "{shown}");
    assert_no_key(&shown, &me, "the client's Debug");

    let mut lock = a
        .try_lock("tls:mtls", TTL)
        .await
        .expect("lock with a client certificate");
    assert_no_key(&format!("{lock:?}"), &me, "the lock's Debug");
    let key = lock_key("tls:mtls");
    assert!(
        eventually(Duration::from_secs(5), || async {
            count_key(&c, 0..3, &key).await == 3
        })
        .await,
        "the key is on every node"
    );
    lock.extend(Duration::from_secs(60))
        .await
        .expect("extend with a client certificate");
    for i in 0..3 {
        let mut con = raw(&c, i).await;
        let pttl: i64 = redis::cmd("PTTL")
            .arg(&key)
            .query_async(&mut con)
            .await
            .expect("PTTL");
        assert!(
            pttl > TTL.as_millis() as i64,
            "node {i}: extended, PTTL {pttl}"
        );
    }

    // A waiter's release subscription shows the certificate too.
    let waiter = tokio::spawn(async move { b.lock("tls:mtls", TTL).await });
    subscribed_on_tls_port(&c).await;
    lock.release()
        .await
        .expect("release with a client certificate");
    let next = tokio::time::timeout(Duration::from_secs(15), waiter)
        .await
        .expect("waiter finished")
        .expect("waiter task")
        .expect("waiter got the lock after the release");
    next.release().await.expect("release");
    assert!(
        eventually(Duration::from_secs(5), || async {
            count_key(&c, 0..3, &key).await == 0
        })
        .await,
        "released on every node"
    );
    assert_no_key(&logs::text(), &me, "the log");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t71_missing_client_certificate_is_refused_by_every_node() {
    logs::capture(tracing::Level::TRACE);
    let pki = Pki::new("A");
    let c = pki.cluster_requiring_client_certs(3).await;
    let locks = builder(&c.urls())
        .tls_root_ca(pki.ca_pem.clone())
        .build()
        .await
        .expect("build succeeds: unreachable nodes are retried on each request");
    // A server that requires a client certificate and gets none must not grant.
    let failed = every_node_fails(&locks, "tls:no-cert").await;
    let urls = c.urls();
    assert_eq!(failed.len(), 3, "every node failed: {failed:#?}");
    for (node, text) in &failed {
        assert!(
            urls.iter().any(|u| u == node),
            "the vote names the node: {node}"
        );
        assert!(
            text.contains(CLIENT_REFUSED) && text.contains("CertificateRequired"),
            "a clear client certificate error for {node}: {text}"
        );
    }
    assert_eq!(count_key(&c, 0..3, &lock_key("tls:no-cert")).await, 0);
    let text = strict_refusal(builder(&c.urls()).tls_root_ca(pki.ca_pem.clone())).await;
    assert!(
        text.contains(CLIENT_REFUSED) && text.contains("CertificateRequired"),
        "a clear client certificate error: {text}"
    );
    // The log capture works: the start-up warning names the refusal.
    assert!(
        logs::text().contains("client certificate refused by the server"),
        "{}",
        logs::text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t72_client_certificate_from_another_ca_is_refused_by_every_node() {
    logs::capture(tracing::Level::TRACE);
    let pki = Pki::new("A");
    let other = Pki::new("B");
    let stranger = other.client_cert("stranger");
    let c = pki.cluster_requiring_client_certs(3).await;
    let locks = builder(&c.urls())
        .tls_root_ca(pki.ca_pem.clone())
        .tls_client_auth(stranger.cert_pem.clone(), stranger.key_pem.clone())
        .build()
        .await
        .expect("build");
    // A certificate from a CA the servers do not trust must not grant.
    let failed = every_node_fails(&locks, "tls:other-ca").await;
    assert_eq!(failed.len(), 3, "every node failed: {failed:#?}");
    for (node, text) in &failed {
        assert!(
            text.contains(CLIENT_REFUSED) && text.contains("UnknownCA"),
            "a clear client certificate error for {node}: {text}"
        );
    }
    let err = locks
        .try_lock("tls:other-ca", TTL)
        .await
        .expect_err("no grant");
    assert_no_key(&format!("{err:?} {err} {err:#}"), &stranger, "the error");
    assert_no_key(&format!("{locks:?}"), &stranger, "the client's Debug");
    assert_eq!(count_key(&c, 0..3, &lock_key("tls:other-ca")).await, 0);
    let shown = logs::text();
    assert!(shown.contains("UnknownCA"), "the log is captured: {shown}");
    assert_no_key(&shown, &stranger, "the log");
}

#[tokio::test]
async fn t73_bad_client_auth_is_a_config_error_that_never_shows_the_key() {
    logs::capture(tracing::Level::TRACE);
    let pki = Pki::new("A");
    let me = pki.client_cert("me");
    let someone = pki.client_cert("someone");
    // A key PEM whose body is distinctive: the base64 of a marker, repeated.
    let marker = "UVVPUlVNTE9DSy1TRUNSRVQtS0VZLU1BVEVSSUFMLTEyMzQ1Njc4OTA";
    let fake_key =
        format!("-----BEGIN PRIVATE KEY-----\n{marker}\n{marker}\n-----END PRIVATE KEY-----\n");
    let bad_base64 =
        format!("-----BEGIN PRIVATE KEY-----\n%%{marker}%%\n-----END PRIVATE KEY-----\n");
    let cases: Vec<(&str, String, String)> = vec![
        ("no certificate", String::new(), me.key_pem.clone()),
        ("no key", me.cert_pem.clone(), String::new()),
        (
            "certificate and key swapped",
            me.key_pem.clone(),
            me.cert_pem.clone(),
        ),
        (
            "another certificate's key",
            me.cert_pem.clone(),
            someone.key_pem.clone(),
        ),
        ("a key that is not a key", me.cert_pem.clone(), fake_key),
        ("a key that is not base64", me.cert_pem.clone(), bad_base64),
        (
            "a certificate that is not PEM",
            "not a certificate".to_owned(),
            me.key_pem.clone(),
        ),
    ];
    for (what, cert, key) in cases {
        let b = Redlock::builder(["rediss://127.0.0.1:1"])
            .tls_root_ca(pki.ca_pem.clone())
            .tls_client_auth(cert, key);
        let mut shown = format!("{b:?}");
        let err = b.build().await.expect_err(what);
        match &err {
            Error::Config(c) => assert_eq!(c.field(), "tls_client_auth", "{what}: {err}"),
            other => panic!("{what}: expected a config error, got {other:?}"),
        }
        assert!(err.to_string().contains("tls_client_auth"), "{what}: {err}");
        shown.push_str(&format!(" {err} {err:?} {err:#}"));
        assert!(!shown.contains(&marker[..24]), "{what}: {shown}");
        assert_no_key(&shown, &me, what);
        assert_no_key(&shown, &someone, what);
        println!("{what}: {err}");
    }
    let shown = logs::text();
    assert!(!shown.contains(&marker[..24]), "{shown}");
    assert_no_key(&shown, &me, "the log");
}

/// Waits (at most 5 s) until node 0 of `c` lists a subscribed client connection on its TLS
/// port, and returns that port.
async fn subscribed_on_tls_port(c: &LocalCluster) -> u16 {
    let tls_port = c.tls_port(0).expect("node 0").expect("TLS port");
    let laddr = format!("laddr=127.0.0.1:{tls_port} ");
    assert!(
        eventually(Duration::from_secs(5), || async {
            client_list(c, 0)
                .await
                .lines()
                .any(|l| l.contains(&laddr) && l.contains(" sub=1 "))
        })
        .await,
        "the waiter's subscription is on the TLS port: {}",
        client_list(c, 0).await
    );
    tls_port
}
