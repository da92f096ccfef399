//! TLS (`rediss://`) against real redis-server processes serving TLS, with a CA and server
//! certificates made by the test.
#![cfg(all(feature = "testkit", feature = "tls-rustls"))]

use std::path::PathBuf;
use std::time::Duration;

use quorumlock::Redlock;
use quorumlock::testkit::LocalCluster;

const TTL: Duration = Duration::from_secs(10);

/// A certificate authority and a server certificate it signed, for `127.0.0.1`.
struct Pki {
    dir: tempfile::TempDir,
    ca_pem: String,
}

impl Pki {
    fn new() -> Pki {
        let dir = tempfile::tempdir().expect("temp dir");
        let ca_key = rcgen::KeyPair::generate().expect("CA key");
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "quorumlock test CA");
        let ca_cert = ca_params.self_signed(&ca_key).expect("CA cert");
        let ca = rcgen::Issuer::new(ca_params, ca_key);
        let key = rcgen::KeyPair::generate().expect("server key");
        let params =
            rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
                .expect("server params");
        let cert = params.signed_by(&key, &ca).expect("server cert");
        let ca_pem = ca_cert.pem();
        std::fs::write(dir.path().join("ca.pem"), &ca_pem).expect("write");
        std::fs::write(dir.path().join("server.pem"), cert.pem()).expect("write");
        std::fs::write(dir.path().join("server.key"), key.serialize_pem()).expect("write");
        Pki { dir, ca_pem }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    async fn cluster(&self, nodes: usize) -> LocalCluster {
        LocalCluster::builder(nodes)
            .tls(self.path("server.pem"), self.path("server.key"), self.path("ca.pem"))
            .launch()
            .await
            .expect("start TLS redis-server nodes (is redis-server installed? run scripts/install-deps.sh)")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t10_rediss_lock_and_release() {
    let pki = Pki::new();
    let c = pki.cluster(3).await;
    let urls = c.urls();
    assert!(urls.iter().all(|u| u.starts_with("rediss://")), "{urls:?}");
    let locks = Redlock::builder(&urls)
        .node_timeout(Duration::from_millis(500))
        .build()
        .await
        .expect("build");
    let lock = locks.try_lock("tls:1", TTL).await.expect("lock over TLS");
    lock.release().await.expect("release");
    let _ = &pki.ca_pem;
}
