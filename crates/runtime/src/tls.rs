//! TLS for a listener (rustls, the `ring` provider, TLS 1.2 and 1.3, ALPN `http/1.1`): a
//! certificate chain and its private key, given as PEM bytes (the caller reads the files),
//! checked to belong together when loaded.

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::sync::Arc;
use tokio_rustls::rustls;
use tokio_rustls::TlsAcceptor;

/// Why a certificate and key do not make a TLS setup.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The certificate PEM holds no certificate, or one that does not parse.
    #[error("the certificate file holds no readable PEM certificate: {0}")]
    Certificate(String),
    /// The key PEM holds no private key, or one that does not parse.
    #[error("the key file holds no readable PEM private key (PKCS#8, PKCS#1 or SEC1): {0}")]
    Key(String),
    /// rustls refused them (a key that does not match the certificate, an unsupported key
    /// type).
    #[error("the certificate and key were refused: {0}")]
    Refused(String),
}

/// A listener's TLS setup.
#[derive(Clone)]
pub struct Tls {
    acceptor: TlsAcceptor,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tls")
    }
}

impl Tls {
    /// The setup for the certificate chain `cert_pem` (leaf first) and its private key
    /// `key_pem`.
    pub fn from_pem(cert_pem: &[u8], key_pem: &[u8]) -> Result<Self, TlsError> {
        let certs = CertificateDer::pem_slice_iter(cert_pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| TlsError::Certificate(e.to_string()))?;
        if certs.is_empty() {
            return Err(TlsError::Certificate("no CERTIFICATE section".into()));
        }
        let key =
            PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| TlsError::Key(e.to_string()))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Refused(e.to_string()))?
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .map_err(|e| TlsError::Refused(e.to_string()))?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Self {
            acceptor: TlsAcceptor::from(Arc::new(config)),
        })
    }

    /// The acceptor that runs a connection's handshake.
    pub(crate) fn acceptor(&self) -> &TlsAcceptor {
        &self.acceptor
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn self_signed() -> (String, String) {
        let c = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        (c.cert.pem(), c.key_pair.serialize_pem())
    }

    #[test]
    fn a_certificate_and_its_key_load_and_mismatches_are_refused() {
        let (cert, key) = self_signed();
        assert!(Tls::from_pem(cert.as_bytes(), key.as_bytes()).is_ok());
        let (_, other_key) = self_signed();
        assert!(matches!(
            Tls::from_pem(cert.as_bytes(), other_key.as_bytes()),
            Err(TlsError::Refused(_))
        ));
        assert!(matches!(
            Tls::from_pem(b"not a pem", key.as_bytes()),
            Err(TlsError::Certificate(_))
        ));
        assert!(matches!(
            Tls::from_pem(cert.as_bytes(), cert.as_bytes()),
            Err(TlsError::Key(_))
        ));
    }
}
