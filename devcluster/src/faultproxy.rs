//! A fault-injecting HTTPS proxy in front of kube-apiserver.
//!
//! Fault tests put it between ONE client (say, one operator replica) and the API server
//! while every other client keeps talking to the API server directly. The proxy serves
//! TLS with the control plane's own serving certificate (valid for 127.0.0.1), so a
//! kubeconfig that trusts the control plane's CA trusts the proxy too; it forwards every
//! request unchanged (method, path and query, headers including `Authorization`, body)
//! to kube-apiserver and streams the answer back frame by frame, so watches stay live.
//!
//! Faults are set at run time through [`FaultProxy::set`] (or a cloneable
//! [`FaultHandle`]): a list of [`Rule`]s, each a [`Fault`] with a probability and a
//! [`Matcher`], and an optional [`Partition`]. Every request is checked against the
//! rules in order; each rule that matches rolls its probability with a PRNG seeded by
//! [`Faults::seed`]. [`Fault::Latency`] adds its delay and [`Fault::Hold`] its wait for
//! [`FaultHandle::release_held`], and the check goes on; the first other rule that fires
//! decides what happens to the request. No rule fired: the request is forwarded as is.
//!
//! [`FaultProxy::counts`] tells what the proxy did, so a test can assert that a fault
//! really happened before it asserts how the client coped.
//!
//! ```no_run
//! # async fn t() -> Result<(), Box<dyn std::error::Error>> {
//! use devcluster::faultproxy::{Fault, FaultProxy, Faults, Rule};
//! use devcluster::{ControlPlane, Identity};
//!
//! let cluster = ControlPlane::for_tests(&[]).await?;
//! let proxy = FaultProxy::start(&cluster)?;
//! // Replica 1 goes through the proxy; everyone else talks to kube-apiserver directly.
//! let replica_1 = kube::Client::try_from(proxy.config(&cluster, Identity::Replica(1)).await?)?;
//! proxy.set(
//!     Faults::new()
//!         .seed(7)
//!         .rule(Rule::new(Fault::Status { code: 503, retry_after: Some(1) }).probability(0.2))
//!         .rule(Rule::new(Fault::ResetAfter).methods([http::Method::POST]).resources(["jobs"])),
//! );
//! // ... run replica 1 with `replica_1`, then:
//! assert!(proxy.count("status_503") > 0);
//! # let _ = replica_1; Ok(()) }
//! ```
//!
//! The proxy runs on a runtime of its own (two threads), so a test that blocks its own
//! runtime's thread (a `std::process::Command`, a `std::thread::sleep`) does not stall
//! the proxy too. Dropping the proxy shuts that runtime down: every connection through
//! it closes.
//!
//! Not supported: HTTP/2 (the proxy offers only `http/1.1` in ALPN, which every
//! Kubernetes client accepts) and protocol upgrades (exec, attach, port-forward).

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode, Uri, header};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use kube::config::Kubeconfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, watch};
use tokio_rustls::TlsAcceptor;

use crate::pki::Pki;
use crate::{ControlPlane, Error, Identity};

/// The `message` of every Status the proxy makes up.
pub const INJECTED_MESSAGE: &str = "injected by devcluster's fault proxy";

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type ProxyBody = UnsyncBoxBody<Bytes, BoxError>;
type Upstream = Client<HttpsConnector<HttpConnector>, Incoming>;

/// What to do to a request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Fault {
    /// Wait `fixed` plus a uniformly random part of `jitter` before going on. Delays of
    /// several rules that fire add up; the request then meets the next rules.
    Latency { fixed: Duration, jitter: Duration },
    /// Wait until the test calls [`FaultHandle::release_held`], however long that takes,
    /// then go on (after any latency) to what the next rules decided when the request
    /// arrived. So a test lands a write late at the moment its scenario needs, not after
    /// a guessed time. Changing the faults does not release a held request.
    Hold,
    /// Never answer: hold the request until the client gives up (or the proxy is
    /// dropped). Nothing is forwarded.
    Hang,
    /// Answer at once, without forwarding, with this HTTP status and a Kubernetes
    /// `Status` body (reason after the code: 429 `TooManyRequests`, 500
    /// `InternalError`, 503 `ServiceUnavailable`, 504 `Timeout`, …), plus `Retry-After`
    /// (and `details.retryAfterSeconds`) when given. A code outside 100..=999 answers 500.
    Status { code: u16, retry_after: Option<u64> },
    /// Close the connection (TCP reset) without forwarding: the write did not happen.
    ResetBefore,
    /// Forward, wait for kube-apiserver's response head, then close the connection
    /// (TCP reset) without answering: the write happened, its answer is lost.
    ResetAfter,
    /// Watches only: forward, stream the answer, and close the connection (TCP reset)
    /// after a random duration in (0, `max`].
    CutWatchAfter { max: Duration },
    /// Watches only: answer `410 Gone` with a Status of reason `Expired`, as
    /// kube-apiserver does for a resourceVersion that is too old; the client must relist.
    Gone,
    /// Watches only: answer `200` with a single watch event of type `ERROR` carrying the
    /// same `410 Expired` Status, then end the stream. This is how kube-apiserver 1.20
    /// reports a too-old resourceVersion from its watch cache, and it takes a different
    /// path in clients than [`Fault::Gone`].
    ExpiredEvent,
}

impl Fault {
    fn watch_only(&self) -> bool {
        matches!(
            self,
            Fault::CutWatchAfter { .. } | Fault::Gone | Fault::ExpiredEvent
        )
    }
}

/// Which requests a rule applies to. Empty lists and `None` match everything; the
/// default matches every request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Matcher {
    /// HTTP methods (`GET`, `POST`, `PUT`, `PATCH`, `DELETE`).
    pub methods: Vec<Method>,
    /// Resource names as in the path (`jobs`, `gpujobs`, `leases`, `events`,
    /// `configmaps`), or `resource/subresource` (`gpujobs/status`) to match only that
    /// subresource. A plain resource name matches its subresources too.
    pub resources: Vec<String>,
    /// `Some(true)`: watches only (`watch=true` or `watch=1` in the query, or the old
    /// `/watch/` path prefix); `Some(false)`: everything but watches.
    pub watch: Option<bool>,
    /// Only requests for one object whose name contains this (`-member-`: a sharded
    /// replica's heartbeat Lease); lists and creates (no name in the path) do not match.
    pub name_contains: Option<String>,
}

impl Matcher {
    fn matches(&self, info: &RequestInfo) -> bool {
        let method = self.methods.is_empty() || self.methods.contains(&info.method);
        let resource =
            self.resources.is_empty() || self.resources.iter().any(|want| info.is_resource(want));
        let watch = self.watch.is_none_or(|w| w == info.watch);
        let name = self
            .name_contains
            .as_deref()
            .is_none_or(|want| info.name.as_deref().is_some_and(|n| n.contains(want)));
        method && resource && watch && name
    }
}

/// A fault, how often it fires and for which requests.
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    pub fault: Fault,
    /// Chance in 0.0..=1.0 that the fault fires for a matching request.
    pub probability: f64,
    pub matcher: Matcher,
}

impl Rule {
    /// `fault` for every request, always.
    pub fn new(fault: Fault) -> Rule {
        Rule {
            fault,
            probability: 1.0,
            matcher: Matcher::default(),
        }
    }

    /// Fires with this chance (clamped to 0.0..=1.0).
    pub fn probability(mut self, probability: f64) -> Rule {
        self.probability = probability.clamp(0.0, 1.0);
        self
    }

    /// Only for these HTTP methods.
    pub fn methods(mut self, methods: impl IntoIterator<Item = Method>) -> Rule {
        self.matcher.methods = methods.into_iter().collect();
        self
    }

    /// Only for these resources (see [`Matcher::resources`]).
    pub fn resources<S: Into<String>>(mut self, resources: impl IntoIterator<Item = S>) -> Rule {
        self.matcher.resources = resources.into_iter().map(Into::into).collect();
        self
    }

    /// Only for objects whose name contains `part` (see [`Matcher::name_contains`]).
    pub fn name_contains(mut self, part: &str) -> Rule {
        self.matcher.name_contains = Some(part.to_owned());
        self
    }

    /// Only for watches (`true`) or only for everything else (`false`).
    pub fn watch(mut self, watch: bool) -> Rule {
        self.matcher.watch = Some(watch);
        self
    }

    fn applies(&self, info: &RequestInfo) -> bool {
        (info.watch || !self.fault.watch_only()) && self.matcher.matches(info)
    }
}

/// A network partition between the client and the proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Partition {
    /// Every request is held and never answered; so are streams already flowing (a
    /// watch stops delivering events). When the partition is cleared, what was held is
    /// closed, not forwarded late.
    Hang,
    /// Every new connection is closed at once, before TLS; connections already open are
    /// closed too.
    Refuse,
}

/// Everything the proxy does to requests. The default does nothing.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Faults {
    /// Seeds the PRNG that decides, request by request, whether a rule fires.
    pub seed: u64,
    /// Checked in order for every request; see the module documentation.
    pub rules: Vec<Rule>,
    pub partition: Option<Partition>,
}

impl Faults {
    /// No faults (the same as `Faults::default()`).
    pub fn new() -> Faults {
        Faults::default()
    }

    /// With this PRNG seed.
    pub fn seed(mut self, seed: u64) -> Faults {
        self.seed = seed;
        self
    }

    /// With one more rule, checked after those already there.
    pub fn rule(mut self, rule: Rule) -> Faults {
        self.rules.push(rule);
        self
    }

    /// With this partition.
    pub fn partition(mut self, partition: Partition) -> Faults {
        self.partition = Some(partition);
        self
    }
}

/// Sets faults and reads counters of a running [`FaultProxy`]; cheap to clone and to
/// move into other tasks. Once the proxy is dropped it changes nothing.
#[derive(Debug, Clone)]
pub struct FaultHandle {
    inner: Arc<Inner>,
}

impl FaultHandle {
    /// Replaces all faults (and the partition) and reseeds the PRNG with `faults.seed`.
    /// Applies to every request that arrives from now on; [`Partition`]s also to
    /// requests and streams already in flight.
    pub fn set(&self, faults: Faults) {
        *lock(&self.inner.rng) = SplitMix64::new(faults.seed);
        self.inner.faults.send_replace(Arc::new(faults));
    }

    /// No faults and no partition: every request is forwarded again.
    pub fn clear(&self) {
        self.set(Faults::default());
    }

    /// Starts (`Some`) or ends (`None`) a partition; the rules stay as they are.
    pub fn set_partition(&self, partition: Option<Partition>) {
        self.inner
            .faults
            .send_modify(|f| Arc::make_mut(f).partition = partition);
    }

    /// Ends the partition ([`FaultHandle::set_partition`] with `None`).
    pub fn heal(&self) {
        self.set_partition(None);
    }

    /// The faults in force.
    pub fn faults(&self) -> Faults {
        Faults::clone(&self.inner.faults.borrow())
    }

    /// What the proxy did so far: `requests` (all), `forwarded` (sent to kube-apiserver,
    /// including those of `ResetAfter` and `CutWatchAfter`), `latency`, `held` (requests
    /// that began to wait for [`FaultHandle::release_held`]), `held_answered` (held ones
    /// let go, forwarded and answered by kube-apiserver, whatever the status: a held
    /// write has landed or been refused), `hang`,
    /// `status_<code>`, `reset_before`, `reset_after`, `watch_cut`, `gone`,
    /// `expired_event`, `partition_hang` (requests held), `partition_refuse`
    /// (connections closed) and `upstream_error` (kube-apiserver could not be reached;
    /// the client's connection is closed). Missing keys are zero.
    pub fn counts(&self) -> BTreeMap<String, u64> {
        lock(&self.inner.counts).clone()
    }

    /// One counter of [`FaultHandle::counts`].
    pub fn count(&self, what: &str) -> u64 {
        lock(&self.inner.counts).get(what).copied().unwrap_or(0)
    }

    /// Sets every counter back to zero.
    pub fn reset_counts(&self) {
        lock(&self.inner.counts).clear();
    }

    /// Waits until the counter `what` ([`FaultHandle::counts`]) is at least `at_least`,
    /// for at most `within`: the sign a test waits for that a fault has happened.
    pub async fn wait_count(
        &self,
        what: &str,
        at_least: u64,
        within: Duration,
    ) -> Result<(), Error> {
        crate::wait::until(
            &format!("the fault proxy's {what} to reach {at_least}"),
            within,
            Duration::from_millis(20),
            || std::future::ready((self.count(what) >= at_least).then_some(())),
        )
        .await
    }

    /// Lets every request held by [`Fault::Hold`] go on. One that arrived before this call
    /// is let go too, even if it reaches its hold after (a latency first, say); one that
    /// arrives after is held by the rules then in force (clear them first to hold no
    /// more).
    pub fn release_held(&self) {
        self.inner.releases.send_modify(|n| *n += 1);
    }
}

/// A running proxy; see the module documentation.
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    handle: FaultHandle,
    /// Runs the proxy; `None` once shut down.
    runtime: Option<tokio::runtime::Runtime>,
    kubeconfigs: Mutex<Vec<PathBuf>>,
}

impl FaultProxy {
    /// Starts a proxy in front of `cluster`'s kube-apiserver on a free loopback port.
    /// Runs until dropped, on a runtime of its own: callable from any context.
    pub fn start(cluster: &ControlPlane) -> Result<FaultProxy, Error> {
        let info = cluster.info();
        let pki = Pki::at(&info.state_dir.join("pki"));
        FaultProxy::start_for(
            &info.server,
            &info.ca_file,
            &pki.serving_cert,
            &pki.serving_key,
        )
    }

    /// Starts a proxy in front of any HTTPS server: `upstream` (`https://host:port`) is
    /// trusted through the CA in `upstream_ca`; clients are served with `cert` and `key`
    /// (PEM files).
    pub fn start_for(
        upstream: &str,
        upstream_ca: &Path,
        cert: &Path,
        key: &Path,
    ) -> Result<FaultProxy, Error> {
        crate::install_crypto_provider();
        let base = upstream.trim_end_matches('/').to_owned();
        base.parse::<Uri>()
            .map_err(|e| Error::invalid(format!("upstream URL {upstream}"), e))?;
        let acceptor = TlsAcceptor::from(server_tls(cert, key)?);
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(client_tls(upstream_ca)?)
            .https_only()
            .enable_http1()
            .build();
        let client = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(https);
        let listener = std::net::TcpListener::bind("127.0.0.1:0")
            .map_err(Error::io("binding the fault proxy to 127.0.0.1"))?;
        let addr = listener
            .local_addr()
            .map_err(Error::io("reading the fault proxy's address"))?;
        listener
            .set_nonblocking(true)
            .map_err(Error::io("setting up the fault proxy's listener"))?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("devcluster-faultproxy")
            .enable_all()
            .build()
            .map_err(Error::io("starting the fault proxy's runtime"))?;
        let listener = {
            let _in_runtime = runtime.enter();
            TcpListener::from_std(listener)
                .map_err(Error::io("setting up the fault proxy's listener"))?
        };
        let inner = Arc::new(Inner::new());
        let target = Arc::new(Target { base, client });
        runtime.spawn(accept_loop(listener, acceptor, inner.clone(), target));
        Ok(FaultProxy {
            addr,
            handle: FaultHandle { inner },
            runtime: Some(runtime),
            kubeconfigs: Mutex::new(Vec::new()),
        })
    }

    /// `https://127.0.0.1:<port>`
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// A handle for setting faults and reading counters from elsewhere.
    pub fn handle(&self) -> FaultHandle {
        self.handle.clone()
    }

    /// See [`FaultHandle::set`].
    pub fn set(&self, faults: Faults) {
        self.handle.set(faults);
    }

    /// See [`FaultHandle::clear`].
    pub fn clear(&self) {
        self.handle.clear();
    }

    /// See [`FaultHandle::set_partition`].
    pub fn set_partition(&self, partition: Option<Partition>) {
        self.handle.set_partition(partition);
    }

    /// See [`FaultHandle::heal`].
    pub fn heal(&self) {
        self.handle.heal();
    }

    /// See [`FaultHandle::faults`].
    pub fn faults(&self) -> Faults {
        self.handle.faults()
    }

    /// See [`FaultHandle::counts`].
    pub fn counts(&self) -> BTreeMap<String, u64> {
        self.handle.counts()
    }

    /// See [`FaultHandle::count`].
    pub fn count(&self, what: &str) -> u64 {
        self.handle.count(what)
    }

    /// See [`FaultHandle::reset_counts`].
    pub fn reset_counts(&self) {
        self.handle.reset_counts();
    }

    /// See [`FaultHandle::wait_count`].
    pub async fn wait_count(
        &self,
        what: &str,
        at_least: u64,
        within: Duration,
    ) -> Result<(), Error> {
        self.handle.wait_count(what, at_least, within).await
    }

    /// See [`FaultHandle::release_held`].
    pub fn release_held(&self) {
        self.handle.release_held();
    }

    /// Writes a kubeconfig for `who` that points at this proxy (same CA, same token as
    /// `cluster.kubeconfig(who)`), as `<state>/kubeconfig/<who>-via-proxy-<port>.kubeconfig`.
    /// It is removed when the proxy is dropped.
    pub fn kubeconfig(&self, cluster: &ControlPlane, who: Identity) -> Result<PathBuf, Error> {
        let source = cluster.kubeconfig(who);
        let mut kc = Kubeconfig::read_from(&source)
            .map_err(|e| Error::invalid(format!("reading {}", source.display()), e))?;
        for named in &mut kc.clusters {
            if let Some(c) = named.cluster.as_mut() {
                c.server = Some(self.url());
            }
        }
        let text = serde_saphyr::to_string(&kc)
            .map_err(|e| Error::invalid(format!("writing a kubeconfig for {who}"), e))?;
        let path = cluster.info().state_dir.join("kubeconfig").join(format!(
            "{}-via-proxy-{}.kubeconfig",
            who.file_stem(),
            self.addr.port()
        ));
        std::fs::write(&path, text).map_err(Error::io(format!("writing {}", path.display())))?;
        let mut written = lock(&self.kubeconfigs);
        if !written.contains(&path) {
            written.push(path.clone());
        }
        Ok(path)
    }

    /// A client config for `who` through this proxy, with the User-Agent
    /// `devcluster-test/<who>-via-proxy`.
    pub async fn config(
        &self,
        cluster: &ControlPlane,
        who: Identity,
    ) -> Result<kube::Config, Error> {
        let path = self.kubeconfig(cluster, who)?;
        cluster
            .config_for(
                &path,
                &format!("devcluster-test/{}-via-proxy", who.file_stem()),
            )
            .await
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        // Drops every task, so every connection, without waiting (allowed in async code).
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
        for path in lock(&self.kubeconfigs).drain(..) {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// State shared by the proxy's tasks and the handles.
#[derive(Debug)]
struct Inner {
    faults: watch::Sender<Arc<Faults>>,
    rng: Mutex<SplitMix64>,
    counts: Mutex<BTreeMap<String, u64>>,
    /// How many times [`FaultHandle::release_held`] was called: a request held
    /// ([`Fault::Hold`]) goes on once this passes what it read before it read the faults.
    releases: watch::Sender<u64>,
}

impl Inner {
    /// No faults, nothing counted or released yet.
    fn new() -> Inner {
        Inner {
            faults: watch::Sender::new(Arc::new(Faults::default())),
            rng: Mutex::new(SplitMix64::new(0)),
            counts: Mutex::new(BTreeMap::new()),
            releases: watch::Sender::new(0),
        }
    }

    fn bump(&self, what: &str) {
        *lock(&self.counts).entry(what.to_owned()).or_default() += 1;
    }

    fn partition(&self) -> Option<Partition> {
        self.faults.borrow().partition
    }

    /// Rolls the rules for one request.
    fn decide(&self, faults: &Faults, info: &RequestInfo) -> Decision {
        let mut rng = lock(&self.rng);
        let mut decision = Decision {
            delay: Duration::ZERO,
            latency_rules: 0,
            hold: false,
            action: Action::Forward,
        };
        for rule in &faults.rules {
            if !rule.applies(info) {
                continue;
            }
            // Written so that a NaN probability never fires.
            let fires = rng.unit() < rule.probability;
            if !fires {
                continue;
            }
            decision.action = match rule.fault {
                Fault::Latency { fixed, jitter } => {
                    let delay = fixed.saturating_add(jitter.mul_f64(rng.unit()));
                    decision.delay = decision.delay.saturating_add(delay);
                    decision.latency_rules += 1;
                    continue;
                }
                Fault::Hold => {
                    decision.hold = true;
                    continue;
                }
                Fault::Hang => Action::Hang,
                Fault::Status { code, retry_after } => Action::Status { code, retry_after },
                Fault::ResetBefore => Action::ResetBefore,
                Fault::ResetAfter => Action::ResetAfter,
                // (0, max]: 1 - unit is in (0, 1].
                Fault::CutWatchAfter { max } => Action::Cut(max.mul_f64(1.0 - rng.unit())),
                Fault::Gone => Action::Gone,
                Fault::ExpiredEvent => Action::ExpiredEvent,
            };
            break;
        }
        decision
    }
}

#[derive(Debug, PartialEq)]
struct Decision {
    delay: Duration,
    latency_rules: u32,
    /// Wait for [`FaultHandle::release_held`] ([`Fault::Hold`]).
    hold: bool,
    action: Action,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Action {
    Forward,
    Hang,
    Status { code: u16, retry_after: Option<u64> },
    ResetBefore,
    ResetAfter,
    Cut(Duration),
    Gone,
    ExpiredEvent,
}

/// A poisoned lock only means another thread panicked while counting; the data is
/// still fine for a test's purposes.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// splitmix64 (Steele, Lea, Flood 2014): tiny, fast, and good enough to decide faults
/// (and, for tests, a whole fault schedule from one seed).
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// What the rules look at: method, resource and whether it is a watch, parsed from the
/// path as kube-apiserver does (`/api/v1/...`, `/apis/<group>/<version>/...`).
#[derive(Debug, Clone, PartialEq, Eq)]
struct RequestInfo {
    method: Method,
    resource: Option<String>,
    /// The object's name, for a request about one object.
    name: Option<String>,
    subresource: Option<String>,
    watch: bool,
}

impl RequestInfo {
    fn parse(method: &Method, uri: &Uri) -> RequestInfo {
        let segments: Vec<&str> = uri.path().split('/').filter(|s| !s.is_empty()).collect();
        let prefix = match segments.first() {
            Some(&"api") => 2,
            Some(&"apis") => 3,
            _ => segments.len(),
        };
        let mut rest = segments.get(prefix..).unwrap_or_default();
        let mut watch = false;
        if rest.first() == Some(&"watch") {
            watch = true;
            rest = &rest[1..];
        }
        // namespaces/<ns>/<resource>/<name>/<subresource>, or <resource>/<name>/<subresource>
        // (which covers namespaces/<name> itself).
        let (resource, name, subresource) = if rest.len() >= 3 && rest[0] == "namespaces" {
            (rest.get(2), rest.get(3), rest.get(4))
        } else {
            (rest.first(), rest.get(1), rest.get(2))
        };
        watch |= uri.query().is_some_and(|q| {
            q.split('&')
                .any(|pair| matches!(pair.split_once('='), Some(("watch", "true" | "1"))))
        });
        RequestInfo {
            method: method.clone(),
            resource: resource.map(|s| (*s).to_owned()),
            name: name.map(|s| (*s).to_owned()),
            subresource: subresource.map(|s| (*s).to_owned()),
            watch,
        }
    }

    /// `want` is `resource` or `resource/subresource`.
    fn is_resource(&self, want: &str) -> bool {
        let Some(resource) = self.resource.as_deref() else {
            return false;
        };
        match want.split_once('/') {
            Some((r, sub)) => r == resource && self.subresource.as_deref() == Some(sub),
            None => want == resource,
        }
    }
}

fn server_tls(cert: &Path, key: &Path) -> Result<Arc<rustls::ServerConfig>, Error> {
    let certs = CertificateDer::pem_file_iter(cert)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| Error::invalid(format!("reading {}", cert.display()), e))?;
    let key_der = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| Error::invalid(format!("reading {}", key.display()), e))?;
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| Error::invalid("fault proxy TLS", e))?
    .with_no_client_auth()
    .with_single_cert(certs, key_der)
    .map_err(|e| Error::invalid(format!("fault proxy TLS with {}", cert.display()), e))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

fn client_tls(ca: &Path) -> Result<rustls::ClientConfig, Error> {
    let mut roots = rustls::RootCertStore::empty();
    let certs = CertificateDer::pem_file_iter(ca)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| Error::invalid(format!("reading {}", ca.display()), e))?;
    for c in certs {
        roots
            .add(c)
            .map_err(|e| Error::invalid(format!("trusting {}", ca.display()), e))?;
    }
    Ok(rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| Error::invalid("fault proxy upstream TLS", e))?
    .with_root_certificates(roots)
    .with_no_client_auth())
}

/// Where requests go.
#[derive(Debug)]
struct Target {
    /// `https://127.0.0.1:<port>`, no trailing slash.
    base: String,
    client: Upstream,
}

async fn accept_loop(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    inner: Arc<Inner>,
    target: Arc<Target>,
) {
    loop {
        match listener.accept().await {
            Ok((tcp, _peer)) => {
                tokio::spawn(serve_connection(
                    tcp,
                    acceptor.clone(),
                    inner.clone(),
                    target.clone(),
                ));
            }
            Err(e) => {
                // Out of file descriptors and the like: wait instead of spinning.
                tracing::warn!("fault proxy: accepting a connection: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Lets a request handler or a response stream close its connection.
#[derive(Debug, Default)]
struct ConnControl {
    kill: Notify,
    /// Close with a TCP reset (SO_LINGER 0) rather than a FIN.
    reset: AtomicBool,
}

impl ConnControl {
    fn abort(&self) {
        self.reset.store(true, Ordering::SeqCst);
        self.kill.notify_one();
    }
}

/// Closes the connection of the calling request (see [`serve_connection`]); never returns.
async fn abort_connection<T>(ctl: &ConnControl) -> T {
    ctl.abort();
    std::future::pending().await
}

/// Holds the caller while the partition is `Hang`, then closes its connection.
async fn hold_until_healed<T>(inner: &Inner, ctl: &ConnControl) -> T {
    let mut faults = inner.faults.subscribe();
    loop {
        if faults.borrow_and_update().partition != Some(Partition::Hang) {
            break;
        }
        if faults.changed().await.is_err() {
            break;
        }
    }
    abort_connection(ctl).await
}

/// Returns at once when there is no partition; otherwise holds (`Hang`) or closes
/// (`Refuse`) the caller's connection and never returns.
async fn obey_partition(inner: &Inner, ctl: &ConnControl) {
    match inner.partition() {
        Some(Partition::Hang) => {
            inner.bump("partition_hang");
            hold_until_healed(inner, ctl).await
        }
        Some(Partition::Refuse) => {
            inner.bump("partition_refuse");
            abort_connection(ctl).await
        }
        None => {}
    }
}

/// Returns once the partition is `Refuse`, having counted the connection and marked it
/// for a reset. (Done here rather than in a `select!` arm: `select!` drops the other
/// futures, so the connection, before it runs the arm.)
async fn until_refused(
    faults: &mut watch::Receiver<Arc<Faults>>,
    inner: &Inner,
    ctl: &ConnControl,
) {
    loop {
        if faults.borrow_and_update().partition == Some(Partition::Refuse) {
            inner.bump("partition_refuse");
            ctl.reset.store(true, Ordering::SeqCst);
            return;
        }
        if faults.changed().await.is_err() {
            return std::future::pending().await;
        }
    }
}

async fn serve_connection(
    tcp: TcpStream,
    acceptor: TlsAcceptor,
    inner: Arc<Inner>,
    target: Arc<Target>,
) {
    let mut faults = inner.faults.subscribe();
    if faults.borrow_and_update().partition == Some(Partition::Refuse) {
        inner.bump("partition_refuse");
        let _ = tcp.set_zero_linger();
        return;
    }
    let _ = tcp.set_nodelay(true);
    let ctl = Arc::new(ConnControl::default());
    let socket = Socket {
        tcp,
        ctl: ctl.clone(),
    };
    let tls = tokio::select! {
        tls = acceptor.accept(socket) => match tls {
            Ok(tls) => tls,
            Err(e) => {
                tracing::debug!("fault proxy: TLS handshake: {e}");
                return;
            }
        },
        () = until_refused(&mut faults, &inner, &ctl) => return,
    };
    let service = {
        let (inner, ctl) = (inner.clone(), ctl.clone());
        service_fn(move |req| handle(req, inner.clone(), target.clone(), ctl.clone()))
    };
    let connection = http1::Builder::new().serve_connection(TokioIo::new(tls), service);
    tokio::select! {
        served = connection => {
            if let Err(e) = served {
                tracing::debug!("fault proxy: connection: {e}");
            }
        }
        () = ctl.kill.notified() => {}
        () = until_refused(&mut faults, &inner, &ctl) => {}
    }
    // Dropping the connection here closes the socket, with a reset when asked for.
}

async fn handle(
    req: Request<Incoming>,
    inner: Arc<Inner>,
    target: Arc<Target>,
    ctl: Arc<ConnControl>,
) -> Result<Response<ProxyBody>, Infallible> {
    inner.bump("requests");
    obey_partition(&inner, &ctl).await;
    // Read before the faults: a release after a rule to hold this request was read
    // lets it go.
    let releases = *inner.releases.borrow();
    let faults = inner.faults.borrow().clone();
    let info = RequestInfo::parse(req.method(), req.uri());
    let decision = inner.decide(&faults, &info);
    drop(faults);
    for _ in 0..decision.latency_rules {
        inner.bump("latency");
    }
    if !decision.delay.is_zero() {
        tokio::time::sleep(decision.delay).await;
        obey_partition(&inner, &ctl).await;
    }
    if decision.hold {
        inner.bump("held");
        let mut released = inner.releases.subscribe();
        // The sender lives as long as `inner`, which this request holds.
        let _ = released.wait_for(|n| *n > releases).await;
        obey_partition(&inner, &ctl).await;
    }
    match decision.action {
        Action::Forward if decision.hold => {
            let answered = relay(req, &inner, &target, &ctl, None).await;
            inner.bump("held_answered");
            answered
        }
        Action::Forward => relay(req, &inner, &target, &ctl, None).await,
        Action::Cut(after) => relay(req, &inner, &target, &ctl, Some(after)).await,
        Action::Hang => {
            inner.bump("hang");
            std::future::pending().await
        }
        Action::Status { code, retry_after } => {
            let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            inner.bump(&format!("status_{}", status.as_u16()));
            Ok(status_response(status, reason(status), retry_after))
        }
        Action::ResetBefore => {
            inner.bump("reset_before");
            abort_connection(&ctl).await
        }
        Action::ResetAfter => {
            // The answer, or the upstream error, is thrown away alike.
            let _answer = forward(req, &inner, &target).await;
            inner.bump("reset_after");
            abort_connection(&ctl).await
        }
        Action::Gone => {
            inner.bump("gone");
            Ok(status_response(StatusCode::GONE, "Expired", None))
        }
        Action::ExpiredEvent => {
            inner.bump("expired_event");
            let event = serde_json::json!({
                "type": "ERROR",
                "object": status_json(StatusCode::GONE, "Expired", None),
            });
            let mut resp = Response::new(full(format!("{event}\n")));
            resp.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            Ok(resp)
        }
    }
}

/// Sends the request to kube-apiserver; `None` when it could not be reached.
async fn forward(
    req: Request<Incoming>,
    inner: &Inner,
    target: &Target,
) -> Option<Response<Incoming>> {
    let (mut parts, body) = req.into_parts();
    let path = parts.uri.path_and_query().map_or("/", |pq| pq.as_str());
    let uri = match format!("{}{path}", target.base).parse::<Uri>() {
        Ok(uri) => uri,
        Err(e) => {
            tracing::warn!("fault proxy: cannot forward {path}: {e}");
            inner.bump("upstream_error");
            return None;
        }
    };
    parts.uri = uri;
    parts.version = http::Version::HTTP_11;
    parts.extensions = http::Extensions::new();
    strip_hop_by_hop(&mut parts.headers);
    // The client sets Host from the URI.
    parts.headers.remove(header::HOST);
    inner.bump("forwarded");
    match target
        .client
        .request(Request::from_parts(parts, body))
        .await
    {
        Ok(resp) => Some(resp),
        Err(e) => {
            tracing::warn!("fault proxy: forwarding to {}: {e}", target.base);
            inner.bump("upstream_error");
            None
        }
    }
}

/// Forwards and streams the answer back, cutting it after `cut` if given.
async fn relay(
    req: Request<Incoming>,
    inner: &Arc<Inner>,
    target: &Target,
    ctl: &Arc<ConnControl>,
    cut: Option<Duration>,
) -> Result<Response<ProxyBody>, Infallible> {
    let Some(resp) = forward(req, inner, target).await else {
        // What a client of a kube-apiserver that went away sees.
        return abort_connection(ctl).await;
    };
    obey_partition(inner, ctl).await;
    let (mut parts, body) = resp.into_parts();
    parts.extensions = http::Extensions::new();
    strip_hop_by_hop(&mut parts.headers);
    let relayed = Relayed {
        body,
        cut: cut.map(|after| Box::pin(tokio::time::sleep(after))),
        faults: inner.faults.subscribe(),
        inner: inner.clone(),
        ctl: ctl.clone(),
    };
    Ok(Response::from_parts(parts, relay_body(relayed)))
}

/// A response body on its way from kube-apiserver to the client.
struct Relayed {
    body: Incoming,
    cut: Option<Pin<Box<tokio::time::Sleep>>>,
    faults: watch::Receiver<Arc<Faults>>,
    inner: Arc<Inner>,
    ctl: Arc<ConnControl>,
}

/// Frame by frame, never buffering: a watch is a response that lasts minutes.
fn relay_body(relayed: Relayed) -> ProxyBody {
    let frames = futures::stream::unfold(relayed, |mut r| async move {
        loop {
            let partition = r.faults.borrow_and_update().partition;
            match partition {
                Some(Partition::Hang) => return hold_until_healed(&r.inner, &r.ctl).await,
                Some(Partition::Refuse) => return abort_connection(&r.ctl).await,
                None => {}
            }
            tokio::select! {
                frame = r.body.frame() => {
                    return match frame {
                        Some(Ok(frame)) => Some((Ok::<Frame<Bytes>, BoxError>(frame), r)),
                        // hyper closes the client's connection on a body error.
                        Some(Err(e)) => Some((Err(e.into()), r)),
                        None => None,
                    };
                }
                () = sleep_or_never(&mut r.cut) => {
                    r.inner.bump("watch_cut");
                    return abort_connection(&r.ctl).await;
                }
                // A partition may have started: look again.
                _ = r.faults.changed() => {}
            }
        }
    });
    StreamBody::new(frames).boxed_unsync()
}

async fn sleep_or_never(sleep: &mut Option<Pin<Box<tokio::time::Sleep>>>) {
    match sleep {
        Some(sleep) => sleep.as_mut().await,
        None => std::future::pending().await,
    }
}

fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // Headers named in Connection are hop-by-hop too.
    let named: Vec<String> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|name| name.trim().to_ascii_lowercase())
        .filter(|name| !name.is_empty())
        .collect();
    for name in named {
        headers.remove(name.as_str());
    }
    for name in [
        header::CONNECTION,
        header::PROXY_AUTHENTICATE,
        header::PROXY_AUTHORIZATION,
        header::TE,
        header::TRAILER,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
    ] {
        headers.remove(name);
    }
    headers.remove("keep-alive");
    headers.remove("proxy-connection");
}

fn full(text: String) -> ProxyBody {
    Full::new(Bytes::from(text))
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// The `reason` kube-apiserver gives with this code.
fn reason(code: StatusCode) -> &'static str {
    match code.as_u16() {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        405 => "MethodNotAllowed",
        406 => "NotAcceptable",
        409 => "Conflict",
        410 => "Gone",
        413 => "RequestEntityTooLarge",
        415 => "UnsupportedMediaType",
        422 => "Invalid",
        429 => "TooManyRequests",
        500 => "InternalError",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "",
    }
}

fn status_json(code: StatusCode, reason: &str, retry_after: Option<u64>) -> serde_json::Value {
    let mut status = serde_json::json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": INJECTED_MESSAGE,
        "reason": reason,
        "code": code.as_u16(),
    });
    if let Some(seconds) = retry_after {
        status["details"] = serde_json::json!({ "retryAfterSeconds": seconds });
    }
    status
}

fn status_response(
    code: StatusCode,
    reason: &str,
    retry_after: Option<u64>,
) -> Response<ProxyBody> {
    let body = status_json(code, reason, retry_after).to_string();
    let mut resp = Response::new(full(body));
    *resp.status_mut() = code;
    let headers = resp.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if let Some(seconds) = retry_after {
        headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
    }
    resp
}

/// The client's TCP stream, closed with a reset (SO_LINGER 0) when its connection was
/// aborted on purpose, so the client sees "connection reset" as from a real failure.
struct Socket {
    tcp: TcpStream,
    ctl: Arc<ConnControl>,
}

impl Drop for Socket {
    fn drop(&mut self) {
        if self.ctl.reset.load(Ordering::SeqCst) {
            let _ = self.tcp.set_zero_linger();
        }
    }
}

impl AsyncRead for Socket {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_read(cx, buf)
    }
}

impl AsyncWrite for Socket {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().tcp).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().tcp).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_shutdown(cx)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // test code: a panic is the failure report
mod tests {
    use super::*;

    fn info(method: Method, uri: &str) -> RequestInfo {
        RequestInfo::parse(&method, &uri.parse().unwrap())
    }

    #[test]
    fn paths_parse_like_kube_apiserver() {
        let i = info(Method::GET, "/api/v1/namespaces/ns/configmaps/cm");
        assert_eq!(i.resource.as_deref(), Some("configmaps"));
        assert_eq!(i.subresource, None);
        assert!(!i.watch);

        let i = info(
            Method::PUT,
            "/apis/gpujob.dev/v1/namespaces/ns/gpujobs/a/status",
        );
        assert_eq!(i.resource.as_deref(), Some("gpujobs"));
        assert_eq!(i.subresource.as_deref(), Some("status"));
        assert!(i.is_resource("gpujobs"));
        assert!(i.is_resource("gpujobs/status"));
        assert!(!i.is_resource("jobs"));

        let i = info(
            Method::GET,
            "/apis/coordination.k8s.io/v1/namespaces/ns/leases?watch=1&resourceVersion=5",
        );
        assert_eq!(i.resource.as_deref(), Some("leases"));
        assert!(i.watch);

        let i = info(Method::GET, "/apis/batch/v1/jobs?watch=true");
        assert_eq!(i.resource.as_deref(), Some("jobs"));
        assert!(i.watch);
        assert!(!info(Method::GET, "/apis/batch/v1/jobs?watch=false").watch);
        assert!(!info(Method::GET, "/apis/batch/v1/jobs?allowWatchBookmarks=true").watch);

        let i = info(Method::GET, "/api/v1/watch/namespaces/ns/events");
        assert_eq!(i.resource.as_deref(), Some("events"));
        assert!(i.watch);

        assert_eq!(
            info(Method::GET, "/api/v1/namespaces").resource.as_deref(),
            Some("namespaces")
        );
        assert_eq!(
            info(Method::DELETE, "/api/v1/namespaces/ns")
                .resource
                .as_deref(),
            Some("namespaces")
        );
        assert_eq!(info(Method::GET, "/version").resource, None);
        assert_eq!(info(Method::GET, "/apis/batch").resource, None);
        assert_eq!(info(Method::GET, "/api/v1").resource, None);
    }

    #[test]
    fn matchers_select_requests() {
        let post_jobs = Rule::new(Fault::ResetAfter)
            .methods([Method::POST])
            .resources(["jobs"]);
        assert!(post_jobs.applies(&info(Method::POST, "/apis/batch/v1/namespaces/n/jobs")));
        assert!(!post_jobs.applies(&info(Method::GET, "/apis/batch/v1/namespaces/n/jobs")));
        assert!(!post_jobs.applies(&info(Method::POST, "/api/v1/namespaces/n/events")));

        // Watch-only faults never apply to anything else, whatever the matcher says.
        let gone = Rule::new(Fault::Gone);
        assert!(!gone.applies(&info(Method::GET, "/api/v1/configmaps")));
        assert!(gone.applies(&info(Method::GET, "/api/v1/configmaps?watch=1")));

        let not_watches = Rule::new(Fault::Hang).watch(false);
        assert!(not_watches.applies(&info(Method::GET, "/api/v1/configmaps")));
        assert!(!not_watches.applies(&info(Method::GET, "/api/v1/configmaps?watch=1")));
        // By name: one object's requests, not lists or creates.
        let member = Rule::new(Fault::Hang)
            .resources(["leases"])
            .name_contains("-member-");
        let leases = "/apis/coordination.k8s.io/v1/namespaces/n/leases";
        assert!(member.applies(&info(Method::PUT, &format!("{leases}/op-member-r1"))));
        assert!(member.applies(&info(Method::GET, &format!("{leases}/op-member-r1"))));
        assert!(!member.applies(&info(Method::PUT, &format!("{leases}/op-shard-0"))));
        assert!(!member.applies(&info(Method::GET, leases)));
        assert!(!member.applies(&info(Method::POST, leases)));
        assert_eq!(
            info(Method::GET, "/api/v1/namespaces/ns").name.as_deref(),
            Some("ns")
        );
    }

    #[test]
    fn decisions_follow_the_seed_and_the_probability() {
        let inner = Inner::new();
        let faults = Faults::new()
            .seed(42)
            .rule(Rule::new(Fault::Latency {
                fixed: Duration::from_millis(10),
                jitter: Duration::from_millis(10),
            }))
            .rule(
                Rule::new(Fault::Status {
                    code: 503,
                    retry_after: None,
                })
                .probability(0.25),
            );
        let get = info(Method::GET, "/api/v1/namespaces");
        let run = || {
            *lock(&inner.rng) = SplitMix64::new(faults.seed);
            (0..4000)
                .map(|_| inner.decide(&faults, &get))
                .collect::<Vec<_>>()
        };
        let first = run();
        assert_eq!(first, run(), "same seed, same decisions");
        let failed = first
            .iter()
            .filter(|d| matches!(d.action, Action::Status { code: 503, .. }))
            .count();
        assert!((800..1200).contains(&failed), "{failed} of 4000 at 0.25");
        assert!(first.iter().all(|d| d.latency_rules == 1
            && d.delay >= Duration::from_millis(10)
            && d.delay < Duration::from_millis(20)));

        let cut = Faults::new().rule(Rule::new(Fault::CutWatchAfter {
            max: Duration::from_millis(500),
        }));
        let watch = info(Method::GET, "/api/v1/namespaces/n/configmaps?watch=true");
        for _ in 0..1000 {
            match inner.decide(&cut, &watch).action {
                Action::Cut(after) => {
                    assert!(after > Duration::ZERO && after <= Duration::from_millis(500))
                }
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(inner.decide(&cut, &get).action, Action::Forward);

        // A hold, like a latency, lets the next rule decide.
        let held = Faults::new()
            .rule(Rule::new(Fault::Hold).methods([Method::GET]))
            .rule(Rule::new(Fault::Status {
                code: 500,
                retry_after: None,
            }));
        let d = inner.decide(&held, &get);
        assert!(d.hold);
        assert!(matches!(d.action, Action::Status { code: 500, .. }));
        let post = info(Method::POST, "/api/v1/namespaces");
        assert!(!inner.decide(&held, &post).hold);
    }

    #[test]
    fn injected_statuses_look_like_kube_apiserver_s() {
        let v = status_json(StatusCode::TOO_MANY_REQUESTS, "TooManyRequests", Some(2));
        assert_eq!(v["kind"], "Status");
        assert_eq!(v["status"], "Failure");
        assert_eq!(v["code"], 429);
        assert_eq!(v["reason"], "TooManyRequests");
        assert_eq!(v["message"], INJECTED_MESSAGE);
        assert_eq!(v["details"]["retryAfterSeconds"], 2);
        let resp = status_response(
            StatusCode::SERVICE_UNAVAILABLE,
            "ServiceUnavailable",
            Some(1),
        );
        assert_eq!(resp.status(), 503);
        assert_eq!(resp.headers()[header::RETRY_AFTER], "1");
    }

    #[test]
    fn hop_by_hop_headers_are_not_forwarded() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, x-hop"),
        );
        h.insert("x-hop", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer t"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1);
        assert_eq!(h[header::AUTHORIZATION], "Bearer t");
    }
}
