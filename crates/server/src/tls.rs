//! TLS for `capstan serve` (`docs/deploy.md`, "TLS"): rustls with its safe defaults (TLS 1.2
//! and 1.3, forward-secret AEAD suites only), HTTP/2 and HTTP/1.1 chosen by ALPN. The
//! certificate chain and key are read again when either file changes, so a rotated certificate
//! is served from the next connection on without a restart; connections already open keep the
//! one they began with. A file that cannot be read or parsed keeps the previous certificate in
//! service and says so in the log.
//!
//! With a client CA (`--tls-client-ca`), every client must present a certificate that CA signed;
//! the verified certificate rides on each of its connection's requests ([`ClientCertificate`]),
//! and a credential naming it authenticates the request (`auth::CERTIFIED_PRINCIPAL`).

use axum::extract::ConnectInfo;
use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};
use tower::ServiceExt as _;

/// How often the certificate files are looked at for a change.
pub const RELOAD_CHECK: Duration = Duration::from_secs(2);
/// A client that has not finished its handshake by then is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long open connections may finish their requests at shutdown.
const DRAIN: Duration = Duration::from_secs(30);

/// Where the server's certificate chain and private key are (PEM files).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsSettings {
    pub cert_path: PathBuf,
    pub key_path: PathBuf,
    /// CAs whose client certificates are required (PEM); `None`: no client certificate asked.
    pub client_ca_path: Option<PathBuf>,
}

/// The verified certificate the client presented, on every request of its connection.
#[derive(Clone, Debug)]
pub struct ClientCertificate(pub Arc<CertificateDer<'static>>);

/// The verifier that requires a client certificate one of `path`'s CAs signed.
fn client_verifier(
    path: &Path,
    provider: Arc<rustls::crypto::CryptoProvider>,
) -> Result<Arc<dyn rustls::server::danger::ClientCertVerifier>, String> {
    let mut roots = rustls::RootCertStore::empty();
    let certificates = CertificateDer::pem_file_iter(path)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("--tls-client-ca {}: {e}", path.display()))?;
    for certificate in certificates {
        roots
            .add(certificate)
            .map_err(|e| format!("--tls-client-ca {}: {e}", path.display()))?;
    }
    if roots.is_empty() {
        return Err(format!("--tls-client-ca {}: no PEM certificate in it", path.display()));
    }
    rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
        .build()
        .map_err(|e| format!("--tls-client-ca {}: {e}", path.display()))
}

/// The rustls configuration `settings` names, or why it cannot be made (naming the file).
fn load(settings: &TlsSettings) -> Result<Arc<rustls::ServerConfig>, String> {
    let cert_path = &settings.cert_path;
    let certificates = CertificateDer::pem_file_iter(cert_path)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("--tls-cert {}: {e}", cert_path.display()))?;
    if certificates.is_empty() {
        return Err(format!("--tls-cert {}: no PEM certificate in it", cert_path.display()));
    }
    let key = PrivateKeyDer::from_pem_file(&settings.key_path)
        .map_err(|e| format!("--tls-key {}: no PEM private key in it ({e})", settings.key_path.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let builder = match &settings.client_ca_path {
        Some(path) => builder.with_client_cert_verifier(client_verifier(path, provider)?),
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_single_cert(certificates, key).map_err(|e| {
        format!(
            "--tls-cert {} with --tls-key {}: {e}",
            cert_path.display(),
            settings.key_path.display()
        )
    })?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The configuration new connections get, replaced when the files change.
#[derive(Debug)]
pub struct Certificates {
    settings: TlsSettings,
    current: RwLock<Arc<rustls::ServerConfig>>,
}

/// What identifies a file's content cheaply: its modification time and length.
type Stamp = Option<(SystemTime, u64)>;

fn stamp(path: &Path) -> Stamp {
    let metadata = std::fs::metadata(path).ok()?;
    Some((metadata.modified().ok()?, metadata.len()))
}

impl Certificates {
    pub fn load(settings: TlsSettings) -> Result<Arc<Self>, String> {
        let config = load(&settings)?;
        Ok(Arc::new(Self {
            settings,
            current: RwLock::new(config),
        }))
    }

    fn current(&self) -> Arc<rustls::ServerConfig> {
        self.current.read().expect("the certificate lock is never poisoned").clone()
    }

    /// Reads the files again whenever they change; a change that does not load is logged and
    /// the previous certificate kept.
    pub async fn follow(self: Arc<Self>) {
        let client_ca = self.settings.client_ca_path.as_deref();
        let stamps = || {
            let ca = client_ca.map(stamp);
            (stamp(&self.settings.cert_path), stamp(&self.settings.key_path), ca)
        };
        let mut seen = stamps();
        loop {
            tokio::time::sleep(RELOAD_CHECK).await;
            let now = stamps();
            if now == seen {
                continue;
            }
            seen = now;
            match load(&self.settings) {
                Ok(config) => {
                    *self.current.write().expect("the certificate lock is never poisoned") = config;
                    tracing::info!(cert = %self.settings.cert_path.display(), "TLS certificate reloaded");
                }
                Err(error) => tracing::error!(%error, "TLS certificate not reloaded; still serving the previous one"),
            }
        }
    }
}

/// Serves `router` over TLS on `listener` until `shutdown`, then lets open connections finish
/// their requests (at most [`DRAIN`]).
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    certificates: Arc<Certificates>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let builder = auto::Builder::new(TokioExecutor::new());
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of descriptors and the like: keep serving the connections there are.
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let acceptor = tokio_rustls::TlsAcceptor::from(certificates.current());
        let router = router.clone();
        let builder = builder.clone();
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                Ok(Ok(tls)) => tls,
                Ok(Err(error)) => return tracing::debug!(%peer, %error, "TLS handshake refused"),
                Err(_) => return tracing::debug!(%peer, "TLS handshake timed out"),
            };
            let presented = tls.get_ref().1.peer_certificates().and_then(|chain| chain.first());
            let certificate = presented.map(|c| ClientCertificate(Arc::new(c.clone().into_owned())));
            let service = router.map_request(move |mut request: axum::extract::Request<hyper::body::Incoming>| {
                request.extensions_mut().insert(ConnectInfo(peer));
                if let Some(certificate) = &certificate {
                    request.extensions_mut().insert(certificate.clone());
                }
                request
            });
            let connection = builder.serve_connection(TokioIo::new(tls), TowerToHyperService::new(service));
            if let Err(error) = watcher.watch(connection.into_owned()).await {
                tracing::debug!(%peer, %error, "connection ended with an error");
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(DRAIN, graceful.shutdown()).await.is_err() {
        tracing::warn!("connections still open after {DRAIN:?}: closing them");
    }
    Ok(())
}
