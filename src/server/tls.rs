//! HTTPS for `/metrics` (`--metrics-secure`): the certificate, and the accept loop.
//!
//! The certificate is either a self-signed one made at start (Prometheus then scrapes with
//! `insecureSkipVerify`: the connection is encrypted and the bearer token cannot be
//! read on the wire, but the scraper does not know it talks to the operator), or
//! `tls.crt`/`tls.key` from `--metrics-cert-dir` (a mounted `kubernetes.io/tls` Secret,
//! e.g. from cert-manager), re-read when those files change so a rotated certificate is
//! served without a restart.

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::{CertifiedKey, SingleCertAndKey};
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;
use tracing::{debug, info, warn};

/// A client has this long to finish the TLS handshake, and then to send its request
/// headers: a connection that sends nothing does not hold a task forever.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The names a self-signed certificate is made for. Nobody can verify it anyway (no CA
/// vouches for it); they only keep clients that check names but not the issuer happy
/// on a loopback test.
const SELF_SIGNED_NAMES: [&str; 2] = ["localhost", "127.0.0.1"];

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The server's TLS settings: self-signed (`cert_dir` None) or from `cert_dir`.
pub fn server_config(cert_dir: Option<&Path>) -> Result<Arc<rustls::ServerConfig>, String> {
    let resolver: Arc<dyn ResolvesServerCert> = match cert_dir {
        None => Arc::new(SingleCertAndKey::from(self_signed()?)),
        Some(dir) => Arc::new(CertDir::load(dir)?),
    };
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("metrics TLS settings: {e}"))?
        .with_no_client_auth()
        .with_cert_resolver(resolver);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

fn self_signed() -> Result<CertifiedKey, String> {
    let names: Vec<String> = SELF_SIGNED_NAMES.iter().map(|s| (*s).to_owned()).collect();
    let made = rcgen::generate_simple_self_signed(names)
        .map_err(|e| format!("making a self-signed certificate for /metrics: {e}"))?;
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(made.key_pair.serialize_der()));
    certified(vec![made.cert.der().clone()], key)
        .map_err(|e| format!("using the self-signed certificate for /metrics: {e}"))
}

fn certified(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Result<CertifiedKey, rustls::Error> {
    CertifiedKey::from_der(chain, key, &provider())
}

/// `tls.crt` and `tls.key` in a folder, re-read when either file's modification time
/// changes (a Secret update swaps both at once through the mount's symlink).
#[derive(Debug)]
struct CertDir {
    cert: PathBuf,
    key: PathBuf,
    current: Mutex<(Stamp, Arc<CertifiedKey>)>,
}

type Stamp = (Option<SystemTime>, Option<SystemTime>);

impl CertDir {
    fn load(dir: &Path) -> Result<CertDir, String> {
        let cert = dir.join("tls.crt");
        let key = dir.join("tls.key");
        let stamp = stamp(&cert, &key);
        let loaded = read_pair(&cert, &key).map_err(|e| {
            format!("--metrics-cert-dir {}: {e}; mount a kubernetes.io/tls Secret there, or leave the flag out for a self-signed certificate", dir.display())
        })?;
        info!(cert = %cert.display(), "serving /metrics with the certificate from --metrics-cert-dir");
        Ok(CertDir {
            cert,
            key,
            current: Mutex::new((stamp, Arc::new(loaded))),
        })
    }

    fn get(&self) -> Option<Arc<CertifiedKey>> {
        let mut current = self.current.lock().ok()?;
        let now = stamp(&self.cert, &self.key);
        if now != current.0 {
            match read_pair(&self.cert, &self.key) {
                Ok(loaded) => {
                    info!(cert = %self.cert.display(), "the metrics certificate changed: serving the new one");
                    *current = (now, Arc::new(loaded));
                }
                // Half-written during a rotation, say: keep serving the one that worked,
                // and look again on the next connection.
                Err(e) => warn!(
                    "metrics certificate: re-reading {} failed: {e}; still serving the previous one",
                    self.cert.display()
                ),
            }
        }
        Some(current.1.clone())
    }
}

impl ResolvesServerCert for CertDir {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.get()
    }
}

fn stamp(cert: &Path, key: &Path) -> Stamp {
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    (modified(cert), modified(key))
}

fn read_pair(cert: &Path, key: &Path) -> Result<CertifiedKey, String> {
    let chain = CertificateDer::pem_file_iter(cert)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("reading {}: {e}", cert.display()))?;
    if chain.is_empty() {
        return Err(format!("{} holds no certificate", cert.display()));
    }
    let key_der =
        PrivateKeyDer::from_pem_file(key).map_err(|e| format!("reading {}: {e}", key.display()))?;
    certified(chain, key_der).map_err(|e| {
        format!(
            "{} and {} do not make a usable pair: {e}",
            cert.display(),
            key.display()
        )
    })
}

/// Binds `addr` and serves `router` over HTTPS until `shutdown` resolves; then it stops
/// accepting and drops the connections still open (a scrape is retried by the next one).
pub async fn serve(
    addr: SocketAddr,
    router: Router,
    tls: Arc<rustls::ServerConfig>,
    shutdown: impl Future<Output = ()> + Send + 'static,
    bound: impl FnOnce(SocketAddr),
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("binding the HTTPS metrics server to {addr}: {e}"))?;
    let local = listener.local_addr()?;
    info!(address = %local, "serving /metrics over HTTPS, to bearer tokens allowed get /metrics");
    bound(local);
    let acceptor = TlsAcceptor::from(tls);
    let mut connections = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((tcp, peer)) => {
                    connections.spawn(connection(tcp, peer, acceptor.clone(), router.clone()));
                }
                Err(e) => {
                    // Out of file descriptors and the like: wait instead of spinning.
                    warn!("metrics server: accepting a connection failed: {e}; trying again in 50ms");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    connections.shutdown().await;
    Ok(())
}

async fn connection(
    tcp: tokio::net::TcpStream,
    peer: SocketAddr,
    acceptor: TlsAcceptor,
    router: Router,
) {
    let stream = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
        Ok(Ok(stream)) => stream,
        // A port scan, a plain-HTTP client, a client that does not trust the
        // certificate: its problem, said at debug level so it cannot flood the log.
        Ok(Err(e)) => {
            debug!(%peer, "metrics server: TLS handshake failed: {e}");
            return;
        }
        Err(_) => {
            debug!(%peer, "metrics server: TLS handshake timed out");
            return;
        }
    };
    let served = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HANDSHAKE_TIMEOUT)
        .serve_connection(TokioIo::new(stream), TowerToHyperService::new(router))
        .await;
    if let Err(e) = served {
        debug!(%peer, "metrics server: connection ended: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cert_dir_without_the_files_is_refused_saying_what_to_do() {
        let dir = std::env::temp_dir().join(format!("gpujob-no-certs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let err = server_config(Some(&dir)).unwrap_err();
        assert!(err.contains("tls.crt"), "{err}");
        assert!(err.contains("kubernetes.io/tls Secret"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_self_signed_certificate_is_made_at_start() {
        let key = self_signed().unwrap();
        assert_eq!(key.cert.len(), 1);
        assert!(server_config(None).is_ok());
    }
}
