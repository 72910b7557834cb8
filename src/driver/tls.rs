//! TLS for broker connections, with rustls: the client configuration built once per
//! cluster from [`TlsConfig`], the handshake, and rustls errors turned into
//! [`TlsFailure`]s that name what to change.

use std::io;
use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::{CertificateError, DigitallySignedStruct, RootCertStore, SignatureScheme};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use crate::error::{Error, TlsFailure};
use crate::security::{Pem, TlsConfig, TrustRoots};

/// Opens TLS sessions to brokers with one shared rustls configuration.
#[derive(Clone)]
pub(crate) struct TlsConnector {
    connector: tokio_rustls::TlsConnector,
}

impl std::fmt::Debug for TlsConnector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TlsConnector")
    }
}

impl TlsConnector {
    /// Loads the roots, the client certificate and key, and builds the rustls
    /// configuration. A file that is missing or holds nothing usable is an error naming
    /// the setting.
    pub(crate) fn new(config: &TlsConfig) -> Result<Self, Error> {
        let bad = |setting: &'static str, message: String| Error::Config { setting, message };
        let provider = match &config.provider {
            Some(p) => p.clone(),
            None => default_provider().ok_or_else(|| {
                bad(
                    "tls",
                    "no rustls CryptoProvider: enable the `tls` feature (ring), install one with CryptoProvider::install_default, or pass one with TlsConfig::crypto_provider".into(),
                )
            })?,
        };
        let roots = Arc::new(load_roots(&config.roots)?);
        let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| bad("tls", e.to_string()))?;
        let builder = if config.skip_hostname_verification {
            let inner = WebPkiServerVerifier::builder_with_provider(roots, provider)
                .build()
                .map_err(|e| bad("ssl.ca.location", e.to_string()))?;
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(ChainOnly(inner)))
        } else {
            builder.with_root_certificates(roots)
        };
        let client = match (&config.certificate, &config.key) {
            (Some(cert), Some(key)) => {
                let chain = load_certs(cert, "ssl.certificate.location")?;
                let key = load_key(key)?;
                builder.with_client_auth_cert(chain, key).map_err(|e| {
                    bad(
                        "ssl.key.location",
                        format!("the key does not fit the certificate: {e}"),
                    )
                })?
            }
            (None, None) => builder.with_no_client_auth(),
            (Some(_), None) => {
                return Err(bad(
                    "ssl.key.location",
                    "a client certificate needs its private key".into(),
                ));
            }
            (None, Some(_)) => {
                return Err(bad(
                    "ssl.certificate.location",
                    "a client key needs its certificate".into(),
                ));
            }
        };
        Ok(Self {
            connector: tokio_rustls::TlsConnector::from(Arc::new(client)),
        })
    }

    /// The handshake with `host` (the broker's advertised host: its certificate must
    /// name it, and it goes out as SNI unless it is an IP address).
    pub(crate) async fn connect(
        &self,
        host: &str,
        tcp: TcpStream,
    ) -> Result<TlsStream<TcpStream>, TlsFailure> {
        let name = ServerName::try_from(host.to_string())
            .map_err(|_| TlsFailure::Config(format!("{host:?} is not a valid server name")))?;
        self.connector.connect(name, tcp).await.map_err(|e| {
            classify_io(&e, host).unwrap_or_else(|| TlsFailure::Protocol(e.to_string()))
        })
    }
}

/// The TLS failure inside an I/O error from a TLS stream, if it is one. A server that
/// refuses the client's certificate says so with an alert that, in TLS 1.3, arrives
/// after the client's side of the handshake is done: on the first read.
pub(crate) fn classify_io(e: &io::Error, host: &str) -> Option<TlsFailure> {
    let inner = e.get_ref()?.downcast_ref::<rustls::Error>()?;
    Some(classify(inner, host))
}

fn classify(e: &rustls::Error, host: &str) -> TlsFailure {
    match e {
        rustls::Error::InvalidCertificate(c) => match c {
            CertificateError::UnknownIssuer => TlsFailure::UnknownIssuer,
            CertificateError::Expired | CertificateError::ExpiredContext { .. } => {
                TlsFailure::Expired
            }
            CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => {
                TlsFailure::NotYetValid
            }
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => {
                TlsFailure::NameMismatch {
                    host: host.to_string(),
                }
            }
            CertificateError::Revoked => TlsFailure::Revoked,
            other => TlsFailure::BadCertificate(format!("{other:?}")),
        },
        rustls::Error::AlertReceived(alert) => {
            TlsFailure::HandshakeRefused(format!("{alert:?} alert"))
        }
        other => TlsFailure::Protocol(other.to_string()),
    }
}

fn default_provider() -> Option<Arc<CryptoProvider>> {
    if let Some(p) = CryptoProvider::get_default() {
        return Some(p.clone());
    }
    #[cfg(feature = "tls")]
    {
        Some(Arc::new(rustls::crypto::ring::default_provider()))
    }
    #[cfg(not(feature = "tls"))]
    {
        None
    }
}

fn read_pem(pem: &Pem, setting: &'static str) -> Result<Vec<u8>, Error> {
    match pem {
        Pem::Inline(text) => Ok(text.expose().as_bytes().to_vec()),
        Pem::File(path) => std::fs::read(path).map_err(|e| Error::Config {
            setting,
            message: format!("cannot read {}: {e}", path.display()),
        }),
    }
}

fn load_certs(pem: &Pem, setting: &'static str) -> Result<Vec<CertificateDer<'static>>, Error> {
    let bytes = read_pem(pem, setting)?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| Error::Config {
            setting,
            message: format!("not PEM: {e}"),
        })?;
    if certs.is_empty() {
        return Err(Error::Config {
            setting,
            message: "no CERTIFICATE block in it".into(),
        });
    }
    Ok(certs)
}

fn load_key(pem: &Pem) -> Result<PrivateKeyDer<'static>, Error> {
    let setting = "ssl.key.location";
    let bytes = read_pem(pem, setting)?;
    if bytes
        .windows(b"ENCRYPTED PRIVATE KEY".len())
        .any(|w| w == b"ENCRYPTED PRIVATE KEY")
    {
        return Err(Error::Config {
            setting,
            message: "the key is encrypted; ottla reads unencrypted PKCS#8, PKCS#1 (RSA) or SEC1 (EC) keys (openssl pkcs8 -topk8 -nocrypt)".into(),
        });
    }
    // The error never quotes the bytes: they are a secret.
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|_| Error::Config {
        setting,
        message: "no PRIVATE KEY, RSA PRIVATE KEY or EC PRIVATE KEY block in it".into(),
    })
}

fn load_roots(roots: &TrustRoots) -> Result<RootCertStore, Error> {
    let mut store = RootCertStore::empty();
    match roots {
        TrustRoots::Pem(pem) => {
            let certs = load_certs(pem, "ssl.ca.location")?;
            let (_, unusable) = store.add_parsable_certificates(certs);
            if store.is_empty() {
                return Err(Error::Config {
                    setting: "ssl.ca.location",
                    message: format!("none of its {unusable} certificates can be used as a root"),
                });
            }
        }
        TrustRoots::Platform => {
            let found = rustls_native_certs::load_native_certs();
            store.add_parsable_certificates(found.certs);
            if store.is_empty() {
                let why = found
                    .errors
                    .first()
                    .map(|e| format!(" ({e})"))
                    .unwrap_or_default();
                return Err(Error::Config {
                    setting: "ssl.ca.location",
                    message: format!(
                        "no trusted roots found on this platform{why}; give a CA bundle, or enable `tls-webpki-roots`"
                    ),
                });
            }
        }
        TrustRoots::WebpkiRoots => {
            #[cfg(feature = "tls-webpki-roots")]
            store.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
            #[cfg(not(feature = "tls-webpki-roots"))]
            return Err(Error::Config {
                setting: "ssl.ca.location",
                message: "TrustRoots::WebpkiRoots needs the `tls-webpki-roots` feature".into(),
            });
        }
    }
    Ok(store)
}

/// Verifies the chain and the validity period, but not the names
/// (`ssl.endpoint.identification.algorithm=none`). webpki checks the chain before the
/// name, so a name mismatch is reported only for an otherwise valid certificate.
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}
