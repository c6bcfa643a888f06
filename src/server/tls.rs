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
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime};

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use prometheus::IntGauge;
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
    Ok(webhook_tls(cert_dir)?.0)
}

/// The conversion webhook's TLS settings and the certificate folder they serve from
/// (whose expiry the operator exports: [`Certificates::export_expiry`]).
pub fn webhook_tls(
    cert_dir: &Path,
) -> Result<(Arc<rustls::ServerConfig>, Arc<Certificates>), String> {
    let certs = Arc::new(CertDir::load(cert_dir, WEBHOOK)?);
    Ok((config_with(certs.clone(), WEBHOOK)?, certs))
}

/// A certificate folder being served, seen from outside: when its certificate expires.
pub type Certificates = CertDir;

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
pub struct CertDir {
    cert: PathBuf,
    key: PathBuf,
    purpose: Purpose,
    current: Mutex<Loaded>,
    /// Set to the served certificate's notAfter (Unix seconds) whenever it is read.
    expiry: OnceLock<IntGauge>,
}

/// What a folder last served: the files' stamp, the pair, and the leaf's notAfter.
#[derive(Debug)]
struct Loaded {
    stamp: Stamp,
    key: Arc<CertifiedKey>,
    not_after: Option<i64>,
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
        let not_after = leaf_not_after(&loaded);
        warn_if_expiring(purpose, &cert, not_after);
        info!(cert = %cert.display(), "{}: serving the certificate from {}", purpose.what, purpose.flag);
        Ok(CertDir {
            cert,
            key,
            purpose,
            current: Mutex::new(Loaded {
                stamp,
                key: Arc::new(loaded),
                not_after,
            }),
            expiry: OnceLock::new(),
        })
    }

    /// From now on, `gauge` holds the served certificate's notAfter (Unix seconds; 0
    /// when it cannot be read), and a task started here looks at the folder every
    /// `every`, so a renewed Secret shows even when no client connects.
    pub fn export_expiry(self: &Arc<Self>, gauge: IntGauge, every: Duration) {
        let _ = self.expiry.set(gauge);
        let _ = self.get();
        let me = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                match me.upgrade() {
                    Some(certs) => {
                        let _ = certs.get();
                    }
                    None => return,
                }
            }
        });
    }

    /// The served certificate's notAfter, in Unix seconds.
    pub fn not_after(&self) -> Option<i64> {
        self.current.lock().ok()?.not_after
    }

    fn get(&self) -> Option<Arc<CertifiedKey>> {
        let mut current = self.current.lock().ok()?;
        let now = stamp(&self.cert, &self.key);
        if now != current.stamp {
            match read_pair(&self.cert, &self.key) {
                Ok(loaded) => {
                    info!(cert = %self.cert.display(), "the {} certificate changed: serving the new one", self.purpose.what);
                    let not_after = leaf_not_after(&loaded);
                    warn_if_expiring(self.purpose, &self.cert, not_after);
                    *current = Loaded {
                        stamp: now,
                        key: Arc::new(loaded),
                        not_after,
                    };
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
        if let Some(gauge) = self.expiry.get() {
            gauge.set(current.not_after.unwrap_or(0));
        }
        Some(current.key.clone())
    }
}

/// A certificate that is already past, or within a week of, its notAfter is still
/// served (the API server decides), but said loudly at every load.
const EXPIRY_WARNING: i64 = 7 * 24 * 3600;

fn warn_if_expiring(purpose: Purpose, cert: &Path, not_after: Option<i64>) {
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0);
    match not_after {
        Some(t) if t <= now => {
            warn!(cert = %cert.display(), not_after = t, "the {} certificate has expired: clients refuse it; renew the Secret", purpose.what)
        }
        Some(t) if t - now < EXPIRY_WARNING => {
            warn!(cert = %cert.display(), not_after = t, "the {} certificate expires in {} hours: renew the Secret", purpose.what, (t - now) / 3600)
        }
        Some(_) => {}
        None => {
            warn!(cert = %cert.display(), "the {} certificate's expiry could not be read", purpose.what)
        }
    }
}

fn leaf_not_after(key: &CertifiedKey) -> Option<i64> {
    key.cert.first().and_then(|der| not_after(der))
}

/// The notAfter of a DER X.509 certificate, in seconds since the Unix epoch: the second
/// time of `tbsCertificate.validity` (RFC 5280, 4.1), read with the few DER rules that
/// path needs.
pub fn not_after(der: &[u8]) -> Option<i64> {
    let (tag, certificate, _) = tlv(der)?;
    if tag != 0x30 {
        return None;
    }
    let (tag, mut tbs, _) = tlv(certificate)?;
    if tag != 0x30 {
        return None;
    }
    // [0] version (explicit, optional), serialNumber, signature, issuer, then validity.
    if tbs.first() == Some(&0xa0) {
        tbs = tlv(tbs)?.2;
    }
    for _ in 0..3 {
        tbs = tlv(tbs)?.2;
    }
    let (tag, validity, _) = tlv(tbs)?;
    if tag != 0x30 {
        return None;
    }
    let (_, _, rest) = tlv(validity)?;
    let (tag, time, _) = tlv(rest)?;
    let text = std::str::from_utf8(time).ok()?;
    match tag {
        // UTCTime YYMMDDHHMMSSZ: years 50-99 are 19xx (RFC 5280, 4.1.2.5.1).
        0x17 if text.len() == 13 => {
            let yy: i64 = text.get(0..2)?.parse().ok()?;
            let year = if yy >= 50 { 1900 + yy } else { 2000 + yy };
            seconds(year, text.get(2..12)?, text.get(12..)?)
        }
        // GeneralizedTime YYYYMMDDHHMMSSZ.
        0x18 if text.len() == 15 => seconds(
            text.get(0..4)?.parse().ok()?,
            text.get(4..14)?,
            text.get(14..)?,
        ),
        _ => None,
    }
}

/// One DER element: (tag, contents, what follows). Single-byte tags, definite lengths.
fn tlv(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n]
            .iter()
            .fold(0usize, |acc, b| (acc << 8) | usize::from(*b));
        (len, &rest[n..])
    };
    if rest.len() < len {
        return None;
    }
    Some((tag, &rest[..len], &rest[len..]))
}

/// Unix seconds of `year` and "MMDDHHMMSS" in UTC ("Z").
fn seconds(year: i64, mdhms: &str, zone: &str) -> Option<i64> {
    if zone != "Z" || !mdhms.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let part = |i: usize| -> Option<i64> { mdhms.get(i..i + 2)?.parse().ok() };
    let (month, day, hour, minute, second) = (part(0)?, part(2)?, part(4)?, part(6)?, part(8)?);
    if !(1..=12).contains(&month)
        || !(1..=31).contains(&day)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return None;
    }
    // Days from 1970-01-01 of a proleptic Gregorian date (H. Hinnant's days_from_civil).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days * 86_400 + hour * 3600 + minute * 60 + second)
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

/// Serves `router` over HTTPS on `listener` until `shutdown` resolves; then it stops
/// accepting and drops the connections still open (a scrape is retried by the next one,
/// a conversion by the API server's client). `what`: what it serves, for the log.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    tls: Arc<rustls::ServerConfig>,
    what: &'static str,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    info!(address = %listener.local_addr()?, "serving {what} over HTTPS");
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
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(serve(listener, Router::new(), config, "a test", async {
            let _ = stopped.await;
        }));
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

    /// A certificate valid until `not_after` (y, m, d, h, min, s), self-signed.
    fn valid_until(y: i32, m: u8, d: u8, h: u8, min: u8, sec: u8) -> Vec<u8> {
        let mut params = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()]).unwrap();
        params.not_after = rcgen::date_time_ymd(y, m, d)
            + Duration::from_secs(u64::from(h) * 3600 + u64::from(min) * 60 + u64::from(sec));
        let key = rcgen::KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().der().to_vec()
    }

    #[test]
    fn not_after_is_read_from_the_certificate() {
        // Checked against `date -u -d ... +%s`; 2049 is the last UTCTime year, 2050 the
        // first GeneralizedTime one, 2100 crosses a non-leap century.
        for ((y, m, d, h, min, sec), unix) in [
            ((2026, 12, 2, 16, 40, 0), 1_796_229_600),
            ((2049, 12, 31, 23, 59, 59), 2_524_607_999),
            ((2050, 1, 1, 0, 0, 0), 2_524_608_000),
            ((2100, 3, 1, 12, 0, 0), 4_107_585_600),
        ] {
            assert_eq!(
                not_after(&valid_until(y, m, d, h, min, sec)),
                Some(unix),
                "{y}-{m}-{d}"
            );
        }
        assert_eq!(not_after(b"not a certificate"), None);
        assert_eq!(not_after(&[]), None);
        let whole = valid_until(2030, 1, 1, 0, 0, 0);
        assert_eq!(
            not_after(&whole[..whole.len() / 2]),
            None,
            "a truncated certificate"
        );
    }

    #[tokio::test]
    async fn the_served_certificates_expiry_is_exported_and_follows_a_renewal() {
        let dir =
            std::env::temp_dir().join(format!("gpujob-webhook-expiry-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ca = Ca::new();
        let pair = |y: i32| {
            let mut params = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()]).unwrap();
            params.not_after = rcgen::date_time_ymd(y, 1, 1);
            let key = rcgen::KeyPair::generate().unwrap();
            let cert = params.signed_by(&key, &ca.cert, &ca.key).unwrap();
            (cert.pem(), key.serialize_pem())
        };
        write_pair(&dir, &pair(2031), 0);
        let (_config, certs) = webhook_tls(&dir).unwrap();
        let gauge = IntGauge::new("expiry", "test").unwrap();
        certs.export_expiry(gauge.clone(), Duration::from_millis(20));
        assert_eq!(gauge.get(), 1_924_992_000, "2031-01-01");
        // Renewed, and no client connects: the folder is looked at anyway.
        write_pair(&dir, &pair(2032), 60);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while gauge.get() != 1_956_528_000 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "still {}",
                gauge.get()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(certs.not_after(), Some(1_956_528_000), "2032-01-01");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_self_signed_certificate_is_made_at_start() {
        let key = self_signed().unwrap();
        assert_eq!(key.cert.len(), 1);
        assert!(server_config(None).is_ok());
    }
}
