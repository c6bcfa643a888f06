//! A fake external quota service (docs/quota-api.md) for tests: it grants, refuses,
//! fails or hangs on command, and records every call and every live reservation, so
//! tests count effects, not calls.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::put;
use gpujob_operator::quota::{HttpProvider, HttpSettings, Provider};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Ok,
    /// Reserve: 409 for lack of quota.
    Refuse,
    /// 503.
    Fail,
    /// Never answers.
    Hang,
}

#[derive(Debug, Clone)]
pub struct Call {
    pub op: &'static str,
    pub uid: String,
    pub code: u16,
}

#[derive(Debug)]
struct Inner {
    reserve: Mode,
    release: Mode,
    live: BTreeMap<String, String>,
    /// Every id ever granted per uid (more than one would be a doubled reservation).
    granted: BTreeMap<String, BTreeSet<String>>,
    calls: Vec<Call>,
    next_id: u32,
}

pub const TOKEN: &str = "test-token";

#[derive(Clone)]
pub struct FakeQuota {
    pub url: String,
    inner: Arc<Mutex<Inner>>,
}

impl FakeQuota {
    pub async fn start() -> FakeQuota {
        let inner = Arc::new(Mutex::new(Inner {
            reserve: Mode::Ok,
            release: Mode::Ok,
            live: BTreeMap::new(),
            granted: BTreeMap::new(),
            calls: Vec::new(),
            next_id: 1,
        }));
        let app = Router::new()
            .route("/v1/reservations/{uid}", put(reserve).delete(release))
            .with_state(inner.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        FakeQuota {
            url: format!("http://{addr}"),
            inner,
        }
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

fn authorized(headers: &HeaderMap) -> bool {
    headers.get("authorization").and_then(|v| v.to_str().ok()) == Some(&format!("Bearer {TOKEN}"))
}

async fn reserve(
    State(s): State<Shared>,
    Path(uid): Path<String>,
    headers: HeaderMap,
    body: String,
) -> Response {
    let mode = s.lock().unwrap().reserve;
    if mode == Mode::Hang {
        tokio::time::sleep(Duration::from_secs(3600)).await;
    }
    let body: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
    let mut inner = s.lock().unwrap();
    let (code, reply) = if !authorized(&headers) {
        (
            StatusCode::UNAUTHORIZED,
            serde_json::json!({"reason": "Unauthorized", "message": "bad token"}),
        )
    } else if body["gpus"].as_i64().is_none() || body["namespace"].as_str().is_none() {
        (
            StatusCode::BAD_REQUEST,
            serde_json::json!({"reason": "BadRequest", "message": "gpus and namespace required"}),
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
                        id
                    }
                };
                inner
                    .granted
                    .entry(uid.clone())
                    .or_default()
                    .insert(id.clone());
                (
                    StatusCode::OK,
                    serde_json::json!({"id": id, "gpus": body["gpus"]}),
                )
            }
        }
    };
    inner.calls.push(Call {
        op: "reserve",
        uid,
        code: code.as_u16(),
    });
    (code, reply.to_string()).into_response()
}

async fn release(State(s): State<Shared>, Path(uid): Path<String>, headers: HeaderMap) -> Response {
    let mode = s.lock().unwrap().release;
    if mode == Mode::Hang {
        tokio::time::sleep(Duration::from_secs(3600)).await;
    }
    let mut inner = s.lock().unwrap();
    let code = if !authorized(&headers) {
        StatusCode::UNAUTHORIZED
    } else if mode == Mode::Fail {
        StatusCode::SERVICE_UNAVAILABLE
    } else if inner.live.remove(&uid).is_some() {
        StatusCode::NO_CONTENT
    } else {
        StatusCode::NOT_FOUND
    };
    inner.calls.push(Call {
        op: "release",
        uid,
        code: code.as_u16(),
    });
    code.into_response()
}
