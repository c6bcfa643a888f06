//! A fake external quota service (docs/quota-api.md) for tests: it grants, refuses,
//! fails or hangs on command, applies a call but loses its answer, or answers a timeout
//! and applies the call later (when the test says), honours fencing tokens (a call with
//! a token older than the newest seen for its reservation is refused with 412), can hold
//! a reserve in flight until the test lets it go, and records every call and every live
//! reservation, so tests count effects, not calls.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::put;
use gpujob_operator::quota::{HttpProvider, HttpSettings, Provider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Ok,
    /// Reserve: 409 for lack of quota.
    Refuse,
    /// 503.
    Fail,
    /// Never answers.
    Hang,
    /// Applies the call as `Ok` would, then the answer is lost: the caller gets 504 (a
    /// gateway that gave up waiting), as after a timeout or a reset connection.
    AnswerLost,
    /// Answers 504 at once and applies the call later, when the test calls
    /// [`FakeQuota::apply_late`]: a request stuck in a queue or a slow network that
    /// reaches the service after its caller gave up. Fencing tokens are checked when it
    /// is applied, against the newest token seen by then.
    ApplyLate,
}

/// A call answered with a timeout and not applied yet ([`Mode::ApplyLate`]).
#[derive(Debug)]
enum Late {
    Reserve {
        uid: String,
        headers: HeaderMap,
        body: String,
    },
    Release {
        uid: String,
        headers: HeaderMap,
    },
}

#[derive(Debug, Clone)]
pub struct Call {
    pub op: &'static str,
    pub uid: String,
    pub code: u16,
    /// The `Gpujob-Fencing-Token` it carried.
    pub token: Option<String>,
    /// When it was processed.
    pub at: jiff::Timestamp,
}

#[derive(Debug)]
struct Inner {
    reserve: Mode,
    release: Mode,
    live: BTreeMap<String, String>,
    /// The GPUs each live reservation holds (what its first PUT asked: a repeated PUT
    /// returns the reservation as it is, as the contract's idempotency says).
    gpus: BTreeMap<String, i64>,
    /// Every id ever granted per uid (more than one would be a doubled reservation).
    granted: BTreeMap<String, BTreeSet<String>>,
    calls: Vec<Call>,
    next_id: u32,
    /// The newest fencing token seen per uid: (lease name, number). Kept after a
    /// release, so a late call from a deposed holder is still refused.
    newest: BTreeMap<String, (String, u64)>,
    /// The next reserve waits for this before it is processed.
    hold_next: Option<tokio::sync::oneshot::Receiver<()>>,
    held: usize,
    /// Calls answered with a timeout, to be applied by [`FakeQuota::apply_late`].
    late: Vec<Late>,
}

pub const TOKEN: &str = "test-token";

#[derive(Clone)]
pub struct FakeQuota {
    pub url: String,
    inner: Arc<Mutex<Inner>>,
}

impl FakeQuota {
    /// Over plain HTTP.
    pub async fn start() -> FakeQuota {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        Self::serve(listener, format!("http://{addr}"))
    }

    /// Over HTTPS, with the serving certificate (for 127.0.0.1) of `pki`.
    pub async fn start_tls(pki: &devcluster::pki::Pki) -> FakeQuota {
        let certs = CertificateDer::pem_file_iter(&pki.serving_cert)
            .unwrap()
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let key = PrivateKeyDer::from_pem_file(&pki.serving_key).unwrap();
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
        let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = tcp.local_addr().unwrap();
        let listener = TlsListener {
            tcp,
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
        };
        Self::serve(listener, format!("https://127.0.0.1:{}", addr.port()))
    }

    fn serve<L: axum::serve::Listener>(listener: L, url: String) -> FakeQuota
    where
        L::Addr: std::fmt::Debug,
    {
        let inner = Arc::new(Mutex::new(Inner {
            reserve: Mode::Ok,
            release: Mode::Ok,
            live: BTreeMap::new(),
            gpus: BTreeMap::new(),
            granted: BTreeMap::new(),
            calls: Vec::new(),
            next_id: 1,
            newest: BTreeMap::new(),
            hold_next: None,
            held: 0,
            late: Vec::new(),
        }));
        let app = Router::new()
            .route("/v1/reservations/{uid}", put(reserve).delete(release))
            .with_state(inner.clone());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        FakeQuota { url, inner }
    }

    /// A provider for an in-process operator, with the test token and a short timeout.
    pub fn provider(&self, token_file: &std::path::Path) -> Provider {
        std::fs::write(token_file, TOKEN).unwrap();
        Provider::Http(
            HttpProvider::new(HttpSettings {
                base_url: self.url.clone(),
                token_file: Some(token_file.to_path_buf()),
                ca_file: None,
                timeout: Duration::from_secs(2),
                user_agent: "gpujob-operator-test".into(),
            })
            .unwrap(),
        )
    }

    /// The flags that point the real binary at this service, with the test token
    /// written to a file named after `ns`.
    pub fn flags(&self, ns: &str) -> Vec<String> {
        let token = super::namespace_temp(super::QUOTA_TOKEN, ns);
        std::fs::write(&token, TOKEN).unwrap();
        [
            "--quota-provider",
            "http",
            "--quota-url",
            &self.url,
            "--quota-token-file",
            &token.to_string_lossy(),
        ]
        .map(str::to_owned)
        .to_vec()
    }

    /// The next reserve is held (received, not processed) until the returned sender is
    /// used or dropped; then it is processed as it would have been on arrival, whether or
    /// not its caller still waits: a request in flight on a slow network.
    pub fn hold_next_reserve(&self) -> tokio::sync::oneshot::Sender<()> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.inner.lock().unwrap().hold_next = Some(rx);
        tx
    }

    /// Calls answered with a timeout ([`Mode::ApplyLate`]) and not applied yet.
    pub fn late(&self) -> usize {
        self.inner.lock().unwrap().late.len()
    }

    /// Applies the calls of [`Mode::ApplyLate`] now, in the order they arrived, as
    /// `Ok` would have on arrival (the fencing token is checked now).
    pub fn apply_late(&self) {
        let late = std::mem::take(&mut self.inner.lock().unwrap().late);
        for call in late {
            match call {
                Late::Reserve { uid, headers, body } => {
                    process_reserve(&self.inner, Mode::Ok, uid, &headers, &body);
                }
                Late::Release { uid, headers } => {
                    process_release(&self.inner, Mode::Ok, uid, &headers);
                }
            }
        }
    }

    /// Reserves received and held, not yet processed.
    pub fn held(&self) -> usize {
        self.inner.lock().unwrap().held
    }

    pub fn set_reserve(&self, mode: Mode) {
        self.inner.lock().unwrap().reserve = mode;
    }

    pub fn set_release(&self, mode: Mode) {
        self.inner.lock().unwrap().release = mode;
    }

    /// Live reservations: uid → id.
    pub fn live(&self) -> BTreeMap<String, String> {
        self.inner.lock().unwrap().live.clone()
    }

    /// The GPUs the live reservation of `uid` holds, if it has one.
    pub fn live_gpus(&self, uid: &str) -> Option<i64> {
        self.inner.lock().unwrap().gpus.get(uid).copied()
    }

    /// Distinct ids ever granted for `uid`.
    pub fn granted(&self, uid: &str) -> BTreeSet<String> {
        self.inner
            .lock()
            .unwrap()
            .granted
            .get(uid)
            .cloned()
            .unwrap_or_default()
    }

    pub fn calls(&self, op: &str, uid: &str) -> Vec<Call> {
        self.inner
            .lock()
            .unwrap()
            .calls
            .iter()
            .filter(|c| c.op == op && c.uid == uid)
            .cloned()
            .collect()
    }
}

type Shared = Arc<Mutex<Inner>>;

/// TCP with a TLS handshake on accept; a failed handshake (a client that does not
/// trust the certificate) drops that connection and the listener goes on.
struct TlsListener {
    tcp: tokio::net::TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
}

impl axum::serve::Listener for TlsListener {
    type Io = tokio_rustls::server::TlsStream<tokio::net::TcpStream>;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let Ok((tcp, addr)) = self.tcp.accept().await else {
                continue;
            };
            if let Ok(tls) = self.acceptor.accept(tcp).await {
                return (tls, addr);
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.tcp.local_addr()
    }
}

fn authorized(headers: &HeaderMap) -> bool {
    headers.get("authorization").and_then(|v| v.to_str().ok()) == Some(&format!("Bearer {TOKEN}"))
}

fn fencing_token(headers: &HeaderMap) -> Option<String> {
    headers
        .get(gpujob_operator::quota::FENCING_TOKEN_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

/// A provider that honours fencing tokens as docs/quota-api.md says: per uid, a token
/// `<name>/<n>` with the same name as the newest seen and a smaller number is stale
/// (the operator's name part is the uid itself; another name, from an operator before
/// per-GpuJob tokens, replaces it). Calls without a token are let through.
fn stale(inner: &mut Inner, uid: &str, token: Option<&str>) -> bool {
    let Some((lease, n)) = token
        .and_then(|t| t.rsplit_once('/'))
        .and_then(|(l, n)| Some((l.to_owned(), n.parse::<u64>().ok()?)))
    else {
        return false;
    };
    match inner.newest.get(uid) {
        Some((l, newest)) if *l == lease && n < *newest => true,
        _ => {
            inner.newest.insert(uid.to_owned(), (lease, n));
            false
        }
    }
}

async fn reserve(
    State(s): State<Shared>,
    Path(uid): Path<String>,
    headers: HeaderMap,
    body: String,
) -> Response {
    let (mode, hold) = {
        let mut inner = s.lock().unwrap();
        let hold = inner.hold_next.take();
        if hold.is_some() {
            inner.held += 1;
        }
        (inner.reserve, hold)
    };
    if mode == Mode::Hang {
        tokio::time::sleep(Duration::from_secs(3600)).await;
    }
    if mode == Mode::ApplyLate {
        s.lock()
            .unwrap()
            .late
            .push(Late::Reserve { uid, headers, body });
        return StatusCode::GATEWAY_TIMEOUT.into_response();
    }
    // Processed in a task of its own: a held request goes on when let go even if its
    // caller has given up (the connection closed).
    let (tx, rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        if let Some(hold) = hold {
            let _ = hold.await;
            s.lock().unwrap().held -= 1;
        }
        let _ = tx.send(process_reserve(&s, mode, uid, &headers, &body));
    });
    match rx.await {
        Ok(_) if mode == Mode::AnswerLost => StatusCode::GATEWAY_TIMEOUT.into_response(),
        Ok((code, reply)) => (code, reply.to_string()).into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

fn process_reserve(
    s: &Shared,
    mode: Mode,
    uid: String,
    headers: &HeaderMap,
    body: &str,
) -> (StatusCode, serde_json::Value) {
    let body: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
    let token = fencing_token(headers);
    let mut inner = s.lock().unwrap();
    let (code, reply) = if !authorized(headers) {
        (
            StatusCode::UNAUTHORIZED,
            serde_json::json!({"reason": "Unauthorized", "message": "bad token"}),
        )
    } else if body["gpus"].as_i64().is_none() || body["namespace"].as_str().is_none() {
        (
            StatusCode::BAD_REQUEST,
            serde_json::json!({"reason": "BadRequest", "message": "gpus and namespace required"}),
        )
    } else if stale(&mut inner, &uid, token.as_deref()) {
        (
            StatusCode::PRECONDITION_FAILED,
            serde_json::json!({"reason": "StaleFencingToken", "message": "a later call for this reservation has arrived"}),
        )
    } else {
        match mode {
            Mode::Refuse if !inner.live.contains_key(&uid) => (
                StatusCode::CONFLICT,
                serde_json::json!({"reason": "InsufficientQuota", "message": format!("{} GPUs requested, 0 free", body["gpus"])}),
            ),
            Mode::Fail => (
                StatusCode::SERVICE_UNAVAILABLE,
                serde_json::json!({"message": "down"}),
            ),
            _ => {
                let id = match inner.live.get(&uid) {
                    Some(id) => id.clone(),
                    None => {
                        let id = format!("r-{}", inner.next_id);
                        inner.next_id += 1;
                        inner.live.insert(uid.clone(), id.clone());
                        inner
                            .gpus
                            .insert(uid.clone(), body["gpus"].as_i64().unwrap_or_default());
                        id
                    }
                };
                let held = inner.gpus.get(&uid).copied().unwrap_or_default();
                inner
                    .granted
                    .entry(uid.clone())
                    .or_default()
                    .insert(id.clone());
                (StatusCode::OK, serde_json::json!({"id": id, "gpus": held}))
            }
        }
    };
    inner.calls.push(Call {
        op: "reserve",
        uid,
        code: code.as_u16(),
        token,
        at: jiff::Timestamp::now(),
    });
    (code, reply)
}

async fn release(State(s): State<Shared>, Path(uid): Path<String>, headers: HeaderMap) -> Response {
    let mode = s.lock().unwrap().release;
    match mode {
        Mode::Hang => {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            StatusCode::GATEWAY_TIMEOUT.into_response()
        }
        Mode::ApplyLate => {
            s.lock().unwrap().late.push(Late::Release { uid, headers });
            StatusCode::GATEWAY_TIMEOUT.into_response()
        }
        Mode::AnswerLost => {
            process_release(&s, mode, uid, &headers);
            StatusCode::GATEWAY_TIMEOUT.into_response()
        }
        _ => process_release(&s, mode, uid, &headers).into_response(),
    }
}

fn process_release(s: &Shared, mode: Mode, uid: String, headers: &HeaderMap) -> StatusCode {
    let token = fencing_token(headers);
    let mut inner = s.lock().unwrap();
    let code = if !authorized(headers) {
        StatusCode::UNAUTHORIZED
    } else if stale(&mut inner, &uid, token.as_deref()) {
        StatusCode::PRECONDITION_FAILED
    } else if mode == Mode::Fail {
        StatusCode::SERVICE_UNAVAILABLE
    } else if inner.live.remove(&uid).is_some() {
        inner.gpus.remove(&uid);
        StatusCode::NO_CONTENT
    } else {
        StatusCode::NOT_FOUND
    };
    inner.calls.push(Call {
        op: "release",
        uid,
        code: code.as_u16(),
        token,
        at: jiff::Timestamp::now(),
    });
    code
}
