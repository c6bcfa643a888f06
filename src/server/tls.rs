//! HTTPS for `/metrics` (`--metrics-secure`) and for the conversion webhook
//! (`--conversion-cert-dir`): the certificate, and the accept loop.
//!
//! The certificate is either a self-signed one made at start (Prometheus then scrapes with
//! `insecureSkipVerify`: the connection is encrypted and the bearer token cannot be
//! read on the wire, but the scraper does not know it talks to the operator), or
//! `tls.crt`/`tls.key` from `--metrics-cert-dir` (a mounted `kubernetes.io/tls` Secret,
//! e.g. from cert-manager), re-read when those files change so a rotated certificate is
//! served without a restart. The conversion webhook always takes its certificate from a
//! folder: the API server verifies it against the CRD's `caBundle`.

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

/// What a certificate folder serves, for its log lines and errors.
#[derive(Debug, Clone, Copy)]
pub struct Purpose {
    /// `metrics`, `conversion webhook`.
    pub what: &'static str,
    /// The flag naming the folder.
    pub flag: &'static str,
    /// What else to do when the folder is unusable.
    pub otherwise: &'static str,
}

pub const METRICS: Purpose = Purpose {
    what: "metrics",
    flag: "--metrics-cert-dir",
    otherwise: "or leave the flag out for a self-signed certificate",
};

pub const WEBHOOK: Purpose = Purpose {
    what: "conversion webhook",
    flag: "--conversion-cert-dir",
    otherwise: "or leave the flag out to run without the conversion webhook (then only gpujob.dev/v1, the stored version, can be read)",
};

/// The metrics server's TLS settings: self-signed (`cert_dir` None) or from `cert_dir`.
pub fn server_config(cert_dir: Option<&Path>) -> Result<Arc<rustls::ServerConfig>, String> {
    let resolver: Arc<dyn ResolvesServerCert> = match cert_dir {
        None => Arc::new(SingleCertAndKey::from(self_signed()?)),
        Some(dir) => Arc::new(CertDir::load(dir, METRICS)?),
    };
    config_with(resolver, METRICS)
}

/// The conversion webhook's TLS settings: `tls.crt` and `tls.key` from `cert_dir`,
/// re-read when they change.
pub fn webhook_config(cert_dir: &Path) -> Result<Arc<rustls::ServerConfig>, String> {
    config_with(Arc::new(CertDir::load(cert_dir, WEBHOOK)?), WEBHOOK)
}

fn config_with(
    resolver: Arc<dyn ResolvesServerCert>,
    purpose: Purpose,
) -> Result<Arc<rustls::ServerConfig>, String> {
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("{} TLS settings: {e}", purpose.what))?
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
    purpose: Purpose,
    current: Mutex<(Stamp, Arc<CertifiedKey>)>,
}

type Stamp = (Option<SystemTime>, Option<SystemTime>);

impl CertDir {
    fn load(dir: &Path, purpose: Purpose) -> Result<CertDir, String> {
        let cert = dir.join("tls.crt");
        let key = dir.join("tls.key");
        let stamp = stamp(&cert, &key);
        let loaded = read_pair(&cert, &key).map_err(|e| {
            format!(
                "{} {}: {e}; mount a kubernetes.io/tls Secret there, {}",
                purpose.flag,
                dir.display(),
                purpose.otherwise
            )
        })?;
        info!(cert = %cert.display(), "{}: serving the certificate from {}", purpose.what, purpose.flag);
        Ok(CertDir {
            cert,
            key,
            purpose,
            current: Mutex::new((stamp, Arc::new(loaded))),
        })
    }

    fn get(&self) -> Option<Arc<CertifiedKey>> {
        let mut current = self.current.lock().ok()?;
        let now = stamp(&self.cert, &self.key);
        if now != current.0 {
            match read_pair(&self.cert, &self.key) {
                Ok(loaded) => {
                    info!(cert = %self.cert.display(), "the {} certificate changed: serving the new one", self.purpose.what);
                    *current = (now, Arc::new(loaded));
                }
                // Half-written during a rotation, say: keep serving the one that worked,
                // and look again on the next connection.
                Err(e) => warn!(
                    "{} certificate: re-reading {} failed: {e}; still serving the previous one, and trying again on the next connection",
                    self.purpose.what,
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
/// accepting and drops the connections still open (a scrape is retried by the next one,
/// a conversion by the API server's client). `what`: what it serves, for the log.
pub async fn serve(
    addr: SocketAddr,
    router: Router,
    tls: Arc<rustls::ServerConfig>,
    what: &'static str,
    shutdown: impl Future<Output = ()> + Send + 'static,
    bound: impl FnOnce(SocketAddr),
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("binding the HTTPS server of {what} to {addr}: {e}"))?;
    let local = listener.local_addr()?;
    info!(address = %local, "serving {what} over HTTPS");
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
                    warn!("HTTPS server of {what}: accepting a connection failed: {e}; trying again in 50ms");
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
            debug!(%peer, "HTTPS server: TLS handshake failed: {e}");
            return;
        }
        Err(_) => {
            debug!(%peer, "HTTPS server: TLS handshake timed out");
            return;
        }
    };
    let served = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HANDSHAKE_TIMEOUT)
        .serve_connection(TokioIo::new(stream), TowerToHyperService::new(router))
        .await;
    if let Err(e) = served {
        debug!(%peer, "HTTPS server: connection ended: {e}");
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

    /// A CA, and serving certificates for 127.0.0.1 it signs.
    struct Ca {
        cert: rcgen::Certificate,
        key: rcgen::KeyPair,
    }

    impl Ca {
        fn new() -> Ca {
            let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
            params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
            let key = rcgen::KeyPair::generate().unwrap();
            let cert = params.self_signed(&key).unwrap();
            Ca { cert, key }
        }

        /// (PEM certificate, PEM key) for 127.0.0.1.
        fn leaf(&self) -> (String, String) {
            let params = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()]).unwrap();
            let key = rcgen::KeyPair::generate().unwrap();
            let cert = params.signed_by(&key, &self.cert, &self.key).unwrap();
            (cert.pem(), key.serialize_pem())
        }
    }

    /// Writes the pair as a Secret update does: new files renamed into place, with a
    /// modification time of their own (`bump` seconds after the epoch of the test).
    fn write_pair(dir: &Path, (cert, key): &(String, String), bump: u64) {
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + bump);
        for (name, text) in [("tls.crt", cert), ("tls.key", key)] {
            let tmp = dir.join(format!(".{name}.tmp"));
            std::fs::write(&tmp, text).unwrap();
            std::fs::File::options()
                .write(true)
                .open(&tmp)
                .unwrap()
                .set_modified(at)
                .unwrap();
            std::fs::rename(&tmp, dir.join(name)).unwrap();
        }
    }

    /// The leaf certificate a new TLS handshake with `addr` sees (verified against `ca`).
    async fn served_cert(addr: SocketAddr, ca: &Ca) -> Vec<u8> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca.cert.der().clone()).unwrap();
        let client = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let connector = tokio_rustls::TlsConnector::from(Arc::new(client));
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
        let stream = connector.connect(name, tcp).await.unwrap();
        stream.get_ref().1.peer_certificates().unwrap()[0].to_vec()
    }

    fn der_of(pem: &str) -> Vec<u8> {
        CertificateDer::from_pem_slice(pem.as_bytes())
            .unwrap()
            .to_vec()
    }

    #[tokio::test]
    async fn a_replaced_certificate_is_served_to_the_next_handshake_without_a_restart() {
        let dir = std::env::temp_dir().join(format!("gpujob-webhook-certs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ca = Ca::new();
        let first = ca.leaf();
        write_pair(&dir, &first, 0);
        let config = webhook_config(&dir).unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(
            "127.0.0.1:0".parse().unwrap(),
            Router::new(),
            config,
            "a test",
            async {
                let _ = stopped.await;
            },
            move |a| {
                let _ = tx.send(a);
            },
        ));
        let addr = rx.await.unwrap();
        assert_eq!(served_cert(addr, &ca).await, der_of(&first.0));

        let second = ca.leaf();
        write_pair(&dir, &second, 60);
        assert_eq!(
            served_cert(addr, &ca).await,
            der_of(&second.0),
            "the new certificate, at the next handshake"
        );

        // Half-written (a key that does not match): the last good pair stays served.
        let third = ca.leaf();
        write_pair(&dir, &(third.0.clone(), first.1.clone()), 120);
        assert_eq!(served_cert(addr, &ca).await, der_of(&second.0));
        write_pair(&dir, &third, 180);
        assert_eq!(served_cert(addr, &ca).await, der_of(&third.0));

        stop.send(()).unwrap();
        server.await.unwrap().unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_webhook_needs_its_files_and_says_how_to_run_without_it() {
        let dir =
            std::env::temp_dir().join(format!("gpujob-no-webhook-certs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let err = webhook_config(&dir).unwrap_err();
        assert!(err.contains("--conversion-cert-dir"), "{err}");
        assert!(err.contains("tls.crt"), "{err}");
        assert!(err.contains("without the conversion webhook"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_self_signed_certificate_is_made_at_start() {
        let key = self_signed().unwrap();
        assert_eq!(key.cert.len(), 1);
        assert!(server_config(None).is_ok());
    }
}
