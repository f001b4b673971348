//! TLS for NBD (`NBD_OPT_STARTTLS`, as nbdkit and qemu-nbd do it): with
//! `--tls-cert` and `--tls-key` every connection must upgrade to TLS
//! before it may do anything but abort; with `--tls-client-ca` as well,
//! a client must present a certificate signed by that CA (the access
//! control: whoever holds no such certificate cannot even list exports).
//! rustls with its ring provider; certificates and keys in PEM.

use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{RootCertStore, ServerConfig, crypto};

/// Where the server's TLS material is (`forkfs-nbd serve --tls-*`).
#[derive(Clone, Debug, Default)]
pub struct TlsFiles {
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    pub client_ca: Option<PathBuf>,
}

/// The TLS side of the server, when configured.
#[derive(Clone)]
pub struct Tls {
    pub acceptor: TlsAcceptor,
    /// Clients must present a certificate signed by the client CA.
    pub verifies_clients: bool,
}

impl TlsFiles {
    /// The acceptor these files make; `None` without a certificate.
    pub fn load(&self) -> Result<Option<Tls>> {
        let (cert, key) = match (&self.cert, &self.key) {
            (None, None) if self.client_ca.is_some() => {
                bail!("--tls-client-ca needs --tls-cert and --tls-key")
            }
            (None, None) => return Ok(None),
            (Some(c), Some(k)) => (c, k),
            _ => bail!("--tls-cert and --tls-key go together"),
        };
        let chain = certs(cert)?;
        let private = PrivateKeyDer::from_pem_file(key)
            .map_err(|e| anyhow::anyhow!("{}: no private key read: {e}", key.display()))?;
        let provider = Arc::new(crypto::ring::default_provider());
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .context("TLS protocol versions")?;
        let builder = match &self.client_ca {
            None => builder.with_no_client_auth(),
            Some(ca) => {
                let mut roots = RootCertStore::empty();
                for c in certs(ca)? {
                    roots
                        .add(c)
                        .with_context(|| format!("{}: not a CA certificate", ca.display()))?;
                }
                let verifier = WebPkiClientVerifier::builder_with_provider(roots.into(), provider)
                    .build()
                    .with_context(|| format!("{}: unusable as the client CA", ca.display()))?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let config = builder
            .with_single_cert(chain, private)
            .with_context(|| format!("{}: does not fit {}", cert.display(), key.display()))?;
        Ok(Some(Tls {
            acceptor: TlsAcceptor::from(Arc::new(config)),
            verifies_clients: self.client_ca.is_some(),
        }))
    }
}

/// The certificates of a PEM file (at least one).
fn certs(path: &Path) -> Result<Vec<CertificateDer<'static>>> {
    let found: Vec<_> = CertificateDer::pem_file_iter(path)
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?
        .collect::<Result<_, _>>()
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    if found.is_empty() {
        bail!("{}: no certificate in it", path.display());
    }
    Ok(found)
}
