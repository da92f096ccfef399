//! TLS (`rediss://`) against real redis-server processes serving TLS, with a certificate
//! authority and server certificates the test makes itself.
#![cfg(all(feature = "testkit", feature = "tls-rustls"))]

mod support;

use std::path::PathBuf;
use std::time::Duration;

use quorumlock::testkit::LocalCluster;
use quorumlock::{Error, NodeOutcome, Redlock};
use support::*;

const TTL: Duration = Duration::from_secs(10);

/// How a node's failure reads when the server's certificate does not verify.
const REJECTED: &str = "TLS handshake failed, server certificate rejected (see tls_root_ca): invalid peer certificate: ";

/// A certificate authority and a server certificate it signed (for `127.0.0.1` and
/// `localhost` unless said otherwise), as PEM files in a temporary directory.
struct Pki {
    dir: tempfile::TempDir,
    ca_pem: String,
}

impl Pki {
    fn new(name: &str) -> Pki {
        Pki::for_names(name, &["127.0.0.1", "localhost"])
    }

    fn for_names(name: &str, names: &[&str]) -> Pki {
        let dir = tempfile::tempdir().expect("temp dir");
        let ca_key = rcgen::KeyPair::generate().expect("CA key");
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA");
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params.distinguished_name.push(
            rcgen::DnType::CommonName,
            format!("quorumlock test CA {name}"),
        );
        let ca_cert = ca_params.self_signed(&ca_key).expect("CA certificate");
        let ca = rcgen::Issuer::new(ca_params, ca_key);
        let key = rcgen::KeyPair::generate().expect("server key");
        // "127.0.0.1" becomes an IP address subject alternative name.
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        let params = rcgen::CertificateParams::new(names).expect("server params");
        let cert = params.signed_by(&key, &ca).expect("server certificate");
        let ca_pem = ca_cert.pem();
        std::fs::write(dir.path().join("ca.pem"), &ca_pem).expect("write ca.pem");
        std::fs::write(dir.path().join("server.pem"), cert.pem()).expect("write server.pem");
        std::fs::write(dir.path().join("server.key"), key.serialize_pem()).expect("write key");
        Pki { dir, ca_pem }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `nodes` redis-server processes serving TLS with this PKI's server certificate.
    async fn cluster(&self, nodes: usize) -> LocalCluster {
        LocalCluster::builder(nodes)
            .tls(self.path("server.pem"), self.path("server.key"), self.path("ca.pem"))
            .launch()
            .await
            .expect("start TLS redis-server nodes (is redis-server installed? run scripts/install-deps.sh)")
    }
}

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
    let tls_port = c.tls_port(0).expect("node 0").expect("TLS port");
    let laddr = format!("laddr=127.0.0.1:{tls_port} ");
    assert!(
        eventually(Duration::from_secs(5), || async {
            client_list(&c, 0)
                .await
                .lines()
                .any(|l| l.contains(&laddr) && l.contains(" sub=1 "))
        })
        .await,
        "the waiter's subscription is on the TLS port: {}",
        client_list(&c, 0).await
    );
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
            t.starts_with(REJECTED) && t.contains("UnknownIssuer"),
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
            t.starts_with(REJECTED) && t.to_lowercase().contains("not valid for"),
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
            t.starts_with(REJECTED) && t.contains("UnknownIssuer"),
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
