//! TLS for `NBD_OPT_STARTTLS`: the mode, the certificates and the
//! `rustls` server configuration built from them.
//!
//! Owns [`Tls`] (a mode and a `rustls::ServerConfig` on the `ring`
//! provider) and [`TlsError`]. The certificate directory has nbdkit's
//! layout: `server-cert.pem` (the server's certificate, then its chain),
//! `server-key.pem` (its private key) and `ca-cert.pem` (the CA that signs
//! client certificates, read only when peers are verified).
//! Invariants: a [`Tls`] is complete (a certificate chain whose first
//! certificate matches the key, checked when it is built), so every
//! connection's TLS session can be made from it; TLS 1.2 and 1.3 only
//! (rustls' safe defaults, as the NBD protocol asks).

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig, ServerConnection};

/// Whether clients may, or must, upgrade to TLS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsMode {
    /// `NBD_OPT_STARTTLS` is offered; clients may stay in clear text (the
    /// protocol's SELECTIVETLS with no TLS-only export).
    On,
    /// Every option but `NBD_OPT_STARTTLS` and `NBD_OPT_ABORT` is refused
    /// with `NBD_REP_ERR_TLS_REQD` until TLS is up (FORCEDTLS).
    Require,
}

/// A TLS mode with the server's certificate and key.
#[derive(Debug)]
pub struct Tls {
    mode: TlsMode,
    config: Arc<ServerConfig>,
}

/// Why certificates could not be loaded.
#[derive(Debug)]
pub enum TlsError {
    /// A file could not be read or holds no usable PEM item.
    File {
        /// The file.
        path: PathBuf,
        /// What was wrong with it.
        reason: String,
    },
    /// rustls refused the certificates or key (e.g. the key does not match
    /// the certificate).
    Rustls(rustls::Error),
    /// The client CA could not make a verifier.
    Verifier(String),
}

impl fmt::Display for TlsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::File { path, reason } => write!(f, "{}: {reason}", path.display()),
            Self::Rustls(e) => write!(f, "TLS configuration: {e}"),
            Self::Verifier(e) => write!(f, "client certificate verifier: {e}"),
        }
    }
}

impl std::error::Error for TlsError {}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn file_error(path: &Path, reason: impl fmt::Display) -> TlsError {
    TlsError::File {
        path: path.to_path_buf(),
        reason: reason.to_string(),
    }
}

/// Every certificate of a PEM file, in order.
fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let iter = CertificateDer::pem_file_iter(path).map_err(|e| file_error(path, e))?;
    let certs = iter
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_error(path, e))?;
    if certs.is_empty() {
        return Err(file_error(path, "no CERTIFICATE in the file"));
    }
    Ok(certs)
}

impl Tls {
    /// Load nbdkit's layout from `dir`: `server-cert.pem`,
    /// `server-key.pem`, and with `verify_peer` also `ca-cert.pem`, whose
    /// CA must then have signed every client's certificate.
    ///
    /// # Errors
    /// [`TlsError::File`] for a missing or unreadable file,
    /// [`TlsError::Rustls`] when the key does not fit the certificate.
    pub fn from_dir(dir: &Path, mode: TlsMode, verify_peer: bool) -> Result<Self, TlsError> {
        let chain = certificates(&dir.join("server-cert.pem"))?;
        let key_path = dir.join("server-key.pem");
        let key = PrivateKeyDer::from_pem_file(&key_path).map_err(|e| file_error(&key_path, e))?;
        let client_ca = if verify_peer {
            Some(certificates(&dir.join("ca-cert.pem"))?)
        } else {
            None
        };
        Self::new(mode, chain, key, client_ca)
    }

    /// A configuration from parsed certificates: the server's chain and
    /// key, and the CAs that sign client certificates (`None`: clients
    /// present none).
    ///
    /// # Errors
    /// [`TlsError::Rustls`] when the key does not fit the certificate,
    /// [`TlsError::Verifier`] when no client CA is usable.
    pub fn new(
        mode: TlsMode,
        chain: Vec<CertificateDer<'static>>,
        key: PrivateKeyDer<'static>,
        client_ca: Option<Vec<CertificateDer<'static>>>,
    ) -> Result<Self, TlsError> {
        let builder = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(TlsError::Rustls)?;
        let builder = match client_ca {
            None => builder.with_no_client_auth(),
            Some(cas) => {
                let mut roots = RootCertStore::empty();
                for ca in cas {
                    roots.add(ca).map_err(TlsError::Rustls)?;
                }
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
                        .build()
                        .map_err(|e| TlsError::Verifier(e.to_string()))?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let config = builder
            .with_single_cert(chain, key)
            .map_err(TlsError::Rustls)?;
        Ok(Self {
            mode,
            config: Arc::new(config),
        })
    }

    /// The mode.
    pub fn mode(&self) -> TlsMode {
        self.mode
    }

    /// Whether clients must upgrade before any other option.
    pub fn required(&self) -> bool {
        self.mode == TlsMode::Require
    }

    /// A new server session (one per `NBD_OPT_STARTTLS`).
    ///
    /// # Errors
    /// As `rustls::ServerConnection::new` (mapped to `io::Error`).
    pub(crate) fn session(&self) -> io::Result<ServerConnection> {
        let mut s = ServerConnection::new(self.config.clone()).map_err(io::Error::other)?;
        // The transmission phase encrypts one reply buffer at a time and
        // sends it at once, so no limit is needed on what waits here (see
        // `config::TLS_OVERHEAD`).
        s.set_buffer_limit(None);
        Ok(s)
    }
}
