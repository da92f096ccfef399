//! TLS set-up: the trusted certificate authorities and the crypto provider.

use std::fmt;
use std::sync::Arc;

use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;

use crate::base::error::Error;

/// Certificate authorities (PEM) trusted for `rediss://` nodes, as the user gave them.
/// `Debug` shows only their size.
#[derive(Clone)]
pub(crate) struct RootCa(Arc<[u8]>);

impl fmt::Debug for RootCa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "<{} bytes of PEM>", self.0.len())
    }
}

impl RootCa {
    pub(crate) fn new(pem: Vec<u8>) -> RootCa {
        RootCa(pem.into())
    }

    pub(crate) fn pem(&self) -> &[u8] {
        &self.0
    }

    /// Checks that the PEM holds at least one certificate and that each is usable as a
    /// trust anchor.
    pub(crate) fn validate(&self) -> Result<(), Error> {
        let field = "tls_root_ca";
        let certs = CertificateDer::pem_slice_iter(&self.0)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| Error::config(field, format!("not a valid PEM certificate: {e}")))?;
        if certs.is_empty() {
            return Err(Error::config(
                field,
                "no certificate in the PEM (expected one or more \
                 -----BEGIN CERTIFICATE----- blocks)",
            ));
        }
        let mut store = rustls::RootCertStore::empty();
        for (i, cert) in certs.iter().enumerate() {
            store.add(cert.clone()).map_err(|e| {
                Error::config(
                    field,
                    format!(
                        "certificate #{} is not a usable certificate authority: {e}",
                        i + 1
                    ),
                )
            })?;
        }
        Ok(())
    }
}

/// A client certificate (chain) and its private key (PEM), shown to `rediss://` servers
/// that ask for one (`tls-auth-clients yes`). `Debug` shows the certificate's size and
/// never the key.
#[derive(Clone)]
pub(crate) struct ClientAuth {
    cert: Arc<[u8]>,
    key: Arc<[u8]>,
}

impl fmt::Debug for ClientAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "<certificate: {} bytes of PEM, private key: redacted>",
            self.cert.len()
        )
    }
}

impl ClientAuth {
    pub(crate) fn new(cert: Vec<u8>, key: Vec<u8>) -> ClientAuth {
        ClientAuth {
            cert: cert.into(),
            key: key.into(),
        }
    }

    /// Checks that the certificate PEM holds at least one certificate, the key PEM a
    /// private key of a kind rustls signs with, and that the key is the first
    /// certificate's. No error text quotes the key PEM, nor any detail parsed from it.
    pub(crate) fn validate(&self) -> Result<(), Error> {
        let field = "tls_client_auth";
        let certs = CertificateDer::pem_slice_iter(&self.cert)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| Error::config(field, format!("the certificate is not valid PEM: {e}")))?;
        if certs.is_empty() {
            return Err(Error::config(
                field,
                "no certificate in the certificate PEM (expected one or more \
                 -----BEGIN CERTIFICATE----- blocks, the client's own first)",
            ));
        }
        let key = PrivateKeyDer::from_pem_slice(&self.key).map_err(|e| match e {
            pem::Error::NoItemsFound => Error::config(
                field,
                "no private key in the key PEM (expected a PKCS#8, RSA or EC private key \
                 block)",
            ),
            // The parser's own text may quote a line of the key: never shown.
            _ => Error::config(field, "the private key is not valid PEM"),
        })?;
        let provider = rustls::crypto::aws_lc_rs::default_provider();
        match CertifiedKey::from_der(certs, key, &provider) {
            Ok(_) => Ok(()),
            Err(rustls::Error::InconsistentKeys(_)) => Err(Error::config(
                field,
                "the private key does not belong to the certificate (the first \
                 certificate of the PEM must be the client's own)",
            )),
            Err(rustls::Error::InvalidCertificate(e)) => Err(Error::config(
                field,
                format!("the certificate does not parse: {e:?}"),
            )),
            Err(_) => Err(Error::config(
                field,
                "the private key is not usable (an RSA, ECDSA or Ed25519 key is expected)",
            )),
        }
    }

    /// The certificate and key as redis-rs takes them.
    pub(crate) fn config(&self) -> redis::ClientTlsConfig {
        redis::ClientTlsConfig {
            client_cert: self.cert.to_vec(),
            client_key: self.key.to_vec(),
        }
    }
}

/// The redis-rs TLS settings for these options, `None` when neither is set (redis-rs's
/// defaults: the system's trust store, no client certificate). Both must be validated.
pub(crate) fn certificates(
    root_ca: Option<&RootCa>,
    client: Option<&ClientAuth>,
) -> Option<redis::TlsCertificates> {
    if root_ca.is_none() && client.is_none() {
        return None;
    }
    Some(redis::TlsCertificates {
        client_tls: client.map(ClientAuth::config),
        root_cert: root_ca.map(|ca| ca.pem().to_vec()),
    })
}

/// The text of a failed TLS handshake, when `e` is one: rustls's reason, said to be a
/// TLS failure, with a hint for a rejected server certificate or a refused client
/// certificate. `None` for other errors.
pub(crate) fn failure(e: &redis::RedisError) -> Option<String> {
    let t = rustls_error(e)?;
    Some(match t {
        // The hint comes first: a long reason may be cut at the end.
        rustls::Error::InvalidCertificate(_) => format!(
            "TLS handshake failed, server certificate rejected \
             (see tls_root_ca): {t}"
        ),
        rustls::Error::AlertReceived(alert) if client_refused(*alert) => format!(
            "TLS handshake failed, client certificate refused by the server \
             (see tls_client_auth): {t}"
        ),
        _ => format!("TLS handshake failed: {t}"),
    })
}

/// Whether `e` is a TLS handshake that failed over the certificates configured: the
/// server's was not trusted (another CA, another host name, a bad signature), or the
/// server refused ours. A certificate not valid *yet* is left out (a client whose clock
/// runs behind a renewal: it passes), and so is a failure that is not about certificates
/// (a plaintext port, a dropped connection).
pub(crate) fn refused_certificates(e: &redis::RedisError) -> bool {
    use rustls::CertificateError as C;
    match rustls_error(e) {
        Some(rustls::Error::InvalidCertificate(c)) => {
            !matches!(c, C::NotValidYet | C::NotValidYetContext { .. })
        }
        Some(rustls::Error::AlertReceived(alert)) => client_refused(*alert),
        _ => false,
    }
}

/// The rustls error inside `e`, if any.
fn rustls_error(e: &redis::RedisError) -> Option<&rustls::Error> {
    use std::error::Error as StdError;
    type Shared = Arc<dyn StdError + Send + Sync>;
    // redis-rs keeps an I/O error behind an `Arc`; tokio-rustls puts the rustls error
    // inside the I/O error. Walk that chain, a bounded number of steps.
    let mut cur: Option<&(dyn StdError + 'static)> = StdError::source(e);
    for _ in 0..8 {
        let err = cur?;
        if let Some(t) = err.downcast_ref::<rustls::Error>() {
            return Some(t);
        }
        cur = if let Some(shared) = err.downcast_ref::<Shared>() {
            Some(&**shared as &(dyn StdError + 'static))
        } else if let Some(io) = err.downcast_ref::<std::io::Error>() {
            match io.get_ref() {
                Some(inner) => Some(inner as &(dyn StdError + 'static)),
                None => return None,
            }
        } else {
            err.source()
        };
    }
    None
}

/// Whether a TLS alert from the server says it did not accept our client certificate
/// (none given, or not signed by a certificate authority it trusts).
fn client_refused(alert: rustls::AlertDescription) -> bool {
    use rustls::AlertDescription as A;
    matches!(
        alert,
        A::CertificateRequired
            | A::BadCertificate
            | A::UnknownCA
            | A::CertificateUnknown
            | A::UnsupportedCertificate
            | A::CertificateExpired
            | A::CertificateRevoked
            | A::AccessDenied
    )
}

/// Makes sure rustls has a process-level crypto provider, so that opening a TLS
/// connection never panics: installs rustls's `aws-lc-rs` provider unless the application
/// (or another library) installed one first, which is then kept.
pub(crate) fn ensure_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // An error means another thread installed a provider meanwhile: that one is used.
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A rustls error as redis-rs hands a failed handshake on: inside an I/O error.
    fn handshake(e: rustls::Error) -> redis::RedisError {
        redis::RedisError::from(std::io::Error::new(std::io::ErrorKind::InvalidData, e))
    }

    #[test]
    fn only_certificate_failures_are_refused_credentials() {
        use rustls::CertificateError as C;
        let refused = |e| refused_certificates(&handshake(e));
        assert!(refused(rustls::Error::InvalidCertificate(C::UnknownIssuer)));
        assert!(refused(rustls::Error::InvalidCertificate(
            C::NotValidForName
        )));
        assert!(refused(rustls::Error::InvalidCertificate(C::BadSignature)));
        assert!(refused(rustls::Error::AlertReceived(
            rustls::AlertDescription::CertificateRequired
        )));
        // A clock behind a renewal, a plaintext port, another alert: not a refusal.
        assert!(!refused(rustls::Error::InvalidCertificate(C::NotValidYet)));
        assert!(!refused(rustls::Error::InvalidMessage(
            rustls::InvalidMessage::InvalidContentType
        )));
        assert!(!refused(rustls::Error::AlertReceived(
            rustls::AlertDescription::HandshakeFailure
        )));
        // Not a TLS error at all.
        let io = redis::RedisError::from(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "refused",
        ));
        assert!(!refused_certificates(&io));
        // The text still names each failure as one of TLS.
        assert!(
            failure(&handshake(rustls::Error::InvalidCertificate(
                C::NotValidYet
            )))
            .is_some_and(|t| t.contains("server certificate rejected"))
        );
    }
}
