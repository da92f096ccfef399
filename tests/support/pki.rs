//! Test certificates: a certificate authority with a server certificate, and client
//! certificates it signs, made with rcgen; TLS redis-server nodes that use them.

use std::path::PathBuf;

use quorumlock_testkit::LocalCluster;

/// A certificate authority and a server certificate it signed (for `127.0.0.1` and
/// `localhost` unless said otherwise), as PEM files in a temporary directory.
pub struct Pki {
    dir: tempfile::TempDir,
    /// The CA's certificate, PEM.
    pub ca_pem: String,
    ca: rcgen::Issuer<'static, rcgen::KeyPair>,
}

/// A client certificate and its private key, as PEM.
pub struct ClientCert {
    /// The certificate, PEM.
    pub cert_pem: String,
    /// Its private key, PEM.
    pub key_pem: String,
}

impl ClientCert {
    /// Pieces of the key's PEM body that must never be shown: every base64 line.
    pub fn secrets(&self) -> Vec<&str> {
        let lines: Vec<&str> = self
            .key_pem
            .lines()
            .filter(|l| !l.starts_with("-----") && l.len() >= 16)
            .collect();
        assert!(!lines.is_empty(), "the key has a body");
        lines
    }
}

impl Pki {
    pub fn new(name: &str) -> Pki {
        Pki::for_names(name, &["127.0.0.1", "localhost"])
    }

    pub fn for_names(name: &str, names: &[&str]) -> Pki {
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
        Pki { dir, ca_pem, ca }
    }

    /// A client certificate signed by this PKI's CA.
    pub fn client_cert(&self, name: &str) -> ClientCert {
        let key = rcgen::KeyPair::generate().expect("client key");
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("client");
        params.distinguished_name.push(
            rcgen::DnType::CommonName,
            format!("quorumlock client {name}"),
        );
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        let cert = params
            .signed_by(&key, &self.ca)
            .expect("client certificate");
        ClientCert {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }

    /// Writes a client certificate and key to `<name>.pem` and `<name>.key` in this PKI's
    /// directory; returns their paths.
    pub fn write_client(&self, client: &ClientCert, name: &str) -> (PathBuf, PathBuf) {
        let cert = self.path(&format!("{name}.pem"));
        let key = self.path(&format!("{name}.key"));
        std::fs::write(&cert, &client.cert_pem).expect("write client certificate");
        std::fs::write(&key, &client.key_pem).expect("write client key");
        (cert, key)
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `nodes` redis-server processes serving TLS with this PKI's server certificate.
    pub async fn cluster(&self, nodes: usize) -> LocalCluster {
        LocalCluster::builder(nodes)
            .tls(self.path("server.pem"), self.path("server.key"), self.path("ca.pem"))
            .launch()
            .await
            .expect("start TLS redis-server nodes (is redis-server installed? run scripts/install-deps.sh)")
    }

    /// As [`Pki::cluster`], with servers that require a client certificate signed by this
    /// PKI's CA (`--tls-auth-clients yes`).
    pub async fn cluster_requiring_client_certs(&self, nodes: usize) -> LocalCluster {
        LocalCluster::builder(nodes)
            .tls(
                self.path("server.pem"),
                self.path("server.key"),
                self.path("ca.pem"),
            )
            .tls_auth_clients(true)
            .launch()
            .await
            .expect("start TLS redis-server nodes requiring client certificates")
    }
}
