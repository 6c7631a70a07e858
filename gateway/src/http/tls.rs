//! HTTPS on the listening socket, as `vllm serve` sets it up through uvicorn's SSL context:
//! `--ssl-certfile` (the chain; it may hold the key too), `--ssl-keyfile`, `--ssl-ca-certs`
//! with `--ssl-cert-reqs` (client certificates: 0 none, 1 optional, 2 required) and
//! `--enable-ssl-refresh` (new connections get the files as they are now). rustls does the
//! protocol, with the ring provider that reqwest already builds.
//!
//! The files are read whole and parsed at start-up, so a missing or malformed one stops the
//! start with one line naming it, before the models load.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use rustls_pki_types::pem::{self, PemObject};
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use thiserror::Error;
use tokio_rustls::TlsAcceptor;

/// Why the TLS settings cannot serve. One line, naming the flag (and the file).
#[derive(Debug, Error)]
pub enum TlsError {
    /// A file that cannot be read or holds nothing usable.
    #[error("--{flag} {}: {why}", path.display())]
    File {
        flag: &'static str,
        path: PathBuf,
        why: String,
    },
    /// Flags that do not fit together.
    #[error("{0}")]
    Flags(String),
}

/// `--ssl-cert-reqs`, as Python's `ssl.VerifyMode` numbers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientCerts {
    /// 0: none asked for.
    None,
    /// 1: asked for; a client without one is served, one with a bad one is refused.
    Optional,
    /// 2: a client without a certificate the CAs vouch for is refused.
    Required,
}

/// The TLS flags, checked for fit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub certfile: PathBuf,
    /// `--ssl-keyfile`; without it the key is read from the certificate file.
    pub keyfile: Option<PathBuf>,
    pub ca_certs: Option<PathBuf>,
    pub client_certs: ClientCerts,
    pub refresh: bool,
}

impl TlsFiles {
    /// The TLS settings the flags ask for: `None` for plain HTTP. A flag that needs
    /// `--ssl-certfile` (or `--ssl-ca-certs`) without it is an error rather than ignored.
    pub fn from_flags(
        keyfile: Option<&Path>,
        certfile: Option<&Path>,
        ca_certs: Option<&Path>,
        cert_reqs: u8,
        refresh: bool,
    ) -> Result<Option<Self>, TlsError> {
        let client_certs = match cert_reqs {
            0 => ClientCerts::None,
            1 => ClientCerts::Optional,
            2 => ClientCerts::Required,
            other => {
                return Err(TlsError::Flags(format!(
                    "--ssl-cert-reqs {other}: must be 0 (none), 1 (optional) or 2 (required)"
                )))
            }
        };
        let Some(certfile) = certfile else {
            let needs = [
                (keyfile.is_some(), "--ssl-keyfile"),
                (ca_certs.is_some(), "--ssl-ca-certs"),
                (cert_reqs != 0, "--ssl-cert-reqs"),
                (refresh, "--enable-ssl-refresh"),
            ];
            return match needs.iter().find(|(given, _)| *given) {
                Some((_, flag)) => Err(TlsError::Flags(format!(
                    "{flag} needs --ssl-certfile (the server's certificate) to serve HTTPS"
                ))),
                None => Ok(None),
            };
        };
        if client_certs != ClientCerts::None && ca_certs.is_none() {
            return Err(TlsError::Flags(format!(
                "--ssl-cert-reqs {cert_reqs} needs --ssl-ca-certs: the CAs client certificates \
                 are checked against"
            )));
        }
        Ok(Some(Self {
            certfile: certfile.to_path_buf(),
            keyfile: keyfile.map(Path::to_path_buf),
            ca_certs: ca_certs.map(Path::to_path_buf),
            client_certs,
            refresh,
        }))
    }

    /// The files to read, with the flag each came from.
    fn files(&self) -> Vec<(&'static str, &Path)> {
        let mut files = vec![("ssl-certfile", self.certfile.as_path())];
        files.extend(self.keyfile.as_deref().map(|k| ("ssl-keyfile", k)));
        files.extend(self.ca_certs.as_deref().map(|c| ("ssl-ca-certs", c)));
        files
    }

    /// Every file's bytes, in the order of [`Self::files`].
    fn read(&self) -> Result<Vec<Vec<u8>>, TlsError> {
        self.files()
            .into_iter()
            .map(|(flag, path)| {
                std::fs::read(path).map_err(|e| TlsError::File {
                    flag,
                    path: path.to_path_buf(),
                    why: e.to_string(),
                })
            })
            .collect()
    }

    /// The rustls configuration of these files' contents (as [`Self::read`] returns them).
    fn config(&self, contents: &[Vec<u8>]) -> Result<Arc<ServerConfig>, TlsError> {
        let bad = |flag: &'static str, path: &Path, why: String| TlsError::File {
            flag,
            path: path.to_path_buf(),
            why,
        };
        let mut contents = contents.iter();
        let mut next = || contents.next().map(Vec::as_slice).unwrap_or_default();
        let cert_pem = next();
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
            .collect::<Result<_, _>>()
            .map_err(|e| bad("ssl-certfile", &self.certfile, pem_why(&e, "certificate")))?;
        if chain.is_empty() {
            return Err(bad(
                "ssl-certfile",
                &self.certfile,
                "no PEM certificate in it".into(),
            ));
        }
        let (key_flag, key_path, key_pem) = match &self.keyfile {
            Some(path) => ("ssl-keyfile", path.as_path(), next()),
            None => ("ssl-certfile", self.certfile.as_path(), cert_pem),
        };
        let key = PrivateKeyDer::from_pem_slice(key_pem)
            .map_err(|e| bad(key_flag, key_path, pem_why(&e, "private key")))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Flags(format!("TLS protocol versions: {e}")))?;
        let builder = match (&self.ca_certs, self.client_certs) {
            (Some(ca_path), ClientCerts::Optional | ClientCerts::Required) => {
                let roots = roots(next(), ca_path)?;
                let verifier = WebPkiClientVerifier::builder_with_provider(roots, provider);
                let verifier = if self.client_certs == ClientCerts::Optional {
                    verifier.allow_unauthenticated()
                } else {
                    verifier
                };
                let verifier = verifier
                    .build()
                    .map_err(|e| bad("ssl-ca-certs", ca_path, e.to_string()))?;
                builder.with_client_cert_verifier(verifier)
            }
            (Some(ca_path), ClientCerts::None) => {
                // Parsed all the same, so a bad file is found now rather than when it is used.
                roots(next(), ca_path)?;
                builder.with_no_client_auth()
            }
            (None, _) => builder.with_no_client_auth(),
        };
        let mut config = builder.with_single_cert(chain, key).map_err(|e| {
            bad(
                key_flag,
                key_path,
                format!("does not fit the certificate in --ssl-certfile: {e}"),
            )
        })?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}

/// The trust anchors of a `--ssl-ca-certs` file.
fn roots(pem: &[u8], path: &Path) -> Result<Arc<RootCertStore>, TlsError> {
    let bad = |why: String| TlsError::File {
        flag: "ssl-ca-certs",
        path: path.to_path_buf(),
        why,
    };
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(pem) {
        let cert = cert.map_err(|e| bad(pem_why(&e, "certificate")))?;
        roots
            .add(cert)
            .map_err(|e| bad(format!("not a CA certificate: {e}")))?;
    }
    if roots.is_empty() {
        return Err(bad("no PEM certificate in it".into()));
    }
    Ok(Arc::new(roots))
}

fn pem_why(e: &pem::Error, what: &str) -> String {
    match e {
        pem::Error::NoItemsFound => format!(
            "no PEM {what} in it{}",
            if what == "private key" {
                " (PKCS#8, PKCS#1 or SEC1; encrypted keys are not read)"
            } else {
                ""
            }
        ),
        other => format!("not a valid PEM file: {other}"),
    }
}

/// The TLS side of the listener: the configuration new connections get, reloaded when the
/// files change under `--enable-ssl-refresh`.
pub struct Tls {
    files: TlsFiles,
    current: RwLock<Arc<ServerConfig>>,
}

impl Tls {
    /// Read and check the files now.
    pub fn load(files: TlsFiles) -> Result<Self, TlsError> {
        let config = files.config(&files.read()?)?;
        Ok(Self {
            files,
            current: RwLock::new(config),
        })
    }

    /// An acceptor with the configuration in force now.
    pub fn acceptor(&self) -> TlsAcceptor {
        let config = match self.current.read() {
            Ok(config) => config.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        };
        TlsAcceptor::from(config)
    }

    /// Under `--enable-ssl-refresh`: check the files every `period` and, when their bytes
    /// change, load them for new connections. A change that does not load (a half-written
    /// file, a key that no longer fits) keeps the configuration in force and is logged;
    /// connections already open keep the one they started with.
    pub fn watch(self: Arc<Self>, period: Duration) {
        if !self.files.refresh {
            return;
        }
        tokio::spawn(async move {
            let mut seen = self.files.read().ok();
            let mut tick = tokio::time::interval(period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            loop {
                tick.tick().await;
                let files = self.files.clone();
                let Ok(Ok(now)) = tokio::task::spawn_blocking(move || files.read()).await else {
                    continue;
                };
                if seen.as_ref() == Some(&now) {
                    continue;
                }
                match self.files.config(&now) {
                    Ok(config) => {
                        match self.current.write() {
                            Ok(mut current) => *current = config,
                            Err(poisoned) => *poisoned.into_inner() = config,
                        }
                        tracing::info!("TLS files changed: new connections use them");
                    }
                    Err(e) => tracing::warn!(
                        "TLS files changed but do not load ({e}): keeping the ones in force"
                    ),
                }
                seen = Some(now);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(
        key: Option<&str>,
        cert: Option<&str>,
        ca: Option<&str>,
        reqs: u8,
        refresh: bool,
    ) -> Result<Option<TlsFiles>, TlsError> {
        TlsFiles::from_flags(
            key.map(Path::new),
            cert.map(Path::new),
            ca.map(Path::new),
            reqs,
            refresh,
        )
    }

    #[test]
    fn no_certificate_means_plain_http_and_its_companions_are_refused() {
        assert_eq!(flags(None, None, None, 0, false).ok(), Some(None));
        for (key, ca, reqs, refresh, named) in [
            (Some("k.pem"), None, 0, false, "--ssl-keyfile"),
            (None, Some("ca.pem"), 0, false, "--ssl-ca-certs"),
            (None, None, 2, false, "--ssl-cert-reqs"),
            (None, None, 0, true, "--enable-ssl-refresh"),
        ] {
            let err = flags(key, None, ca, reqs, refresh)
                .err()
                .map(|e| e.to_string());
            assert!(
                err.as_deref().is_some_and(|e| e.starts_with(named)),
                "{named}: {err:?}"
            );
        }
    }

    #[test]
    fn client_certificates_need_the_cas_and_a_known_mode() {
        let err = flags(None, Some("c.pem"), None, 2, false).err();
        assert!(err.is_some_and(|e| e.to_string().contains("--ssl-ca-certs")));
        let err = flags(None, Some("c.pem"), Some("ca.pem"), 3, false).err();
        assert!(err.is_some_and(|e| e.to_string().starts_with("--ssl-cert-reqs 3")));
        let ok = flags(None, Some("c.pem"), Some("ca.pem"), 1, false);
        assert!(ok.is_ok_and(|f| f.is_some_and(|f| f.client_certs == ClientCerts::Optional)));
    }

    #[test]
    fn a_missing_or_empty_file_is_named() {
        let files = TlsFiles {
            certfile: PathBuf::from("/nonexistent/cert.pem"),
            keyfile: None,
            ca_certs: None,
            client_certs: ClientCerts::None,
            refresh: false,
        };
        let err = Tls::load(files.clone()).err().map(|e| e.to_string());
        assert!(
            err.as_deref()
                .is_some_and(|e| e.starts_with("--ssl-certfile /nonexistent/cert.pem: ")),
            "{err:?}"
        );
        let err = files
            .config(&[b"not pem".to_vec()])
            .err()
            .map(|e| e.to_string());
        assert!(
            err.as_deref()
                .is_some_and(|e| e.contains("no PEM certificate")),
            "{err:?}"
        );
    }
}
