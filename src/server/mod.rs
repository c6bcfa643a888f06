//! The HTTP server of every replica, up before leadership is won and on standbys:
//! `GET /metrics` (Prometheus text), `GET /healthz` (liveness: the runtime answers and
//! the lease loop is not wedged), `GET /readyz` (caches synced; standbys are ready too;
//! see [`Status::readiness`] for the one exception).
//!
//! By default one plain HTTP server answers all three. With `--probe-address` the probes
//! get a server of their own; with `--metrics-secure` (which needs that, as the kubelet
//! probes without a token) `/metrics` is served over HTTPS to bearer tokens allowed to
//! `get` it (`auth.rs`, `tls.rs`).
//!
//! With `--conversion-cert-dir` the CRD conversion webhook (`POST /convert`,
//! `conversion.rs`) has an HTTPS server of its own, from process start until the end,
//! whether this replica leads or not.

pub mod auth;
pub mod conversion;
pub mod tls;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tracing::info;

use crate::health::Status;

/// All three endpoints, plain (the default: one server).
pub fn router(status: Arc<Status>) -> Router {
    metrics_router(status.clone()).merge(probes_router(status))
}

/// `/metrics` alone.
pub fn metrics_router(status: Arc<Status>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .with_state(status)
}

/// `/metrics` alone, answered only to bearer tokens `auth` allows.
pub fn secure_metrics_router(status: Arc<Status>, auth: Arc<auth::Authorizer>) -> Router {
    metrics_router(status).route_layer(axum::middleware::from_fn_with_state(
        auth,
        auth::require_metrics_reader,
    ))
}

/// `/healthz` and `/readyz`.
pub fn probes_router(status: Arc<Status>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(status)
}

async fn metrics(State(status): State<Arc<Status>>) -> Response {
    let body = status.render_metrics();
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        body,
    )
        .into_response()
}

async fn healthz(State(status): State<Arc<Status>>) -> Response {
    match status.check_health() {
        Ok(()) => (StatusCode::OK, "ok\n").into_response(),
        Err(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("unhealthy: {why}\n"),
        )
            .into_response(),
    }
}

async fn readyz(State(status): State<Arc<Status>>) -> Response {
    match status.readiness() {
        Ok("caches synced") => (StatusCode::OK, "ok\n").into_response(),
        Ok(why) => (StatusCode::OK, format!("ok: {why}\n")).into_response(),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")).into_response(),
    }
}

/// Where the servers listen and how (from the command line, checked).
#[derive(Debug, Clone)]
pub struct Listen {
    /// `/metrics`, and the probes too when `probes` is None.
    pub metrics: SocketAddr,
    /// A plain HTTP server of its own for `/healthz` and `/readyz`.
    pub probes: Option<SocketAddr>,
    /// Serve `/metrics` over HTTPS with these settings, to allowed bearer tokens only.
    /// Always with `probes` set (checked by the command line).
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// The conversion webhook, when it has a certificate (`--conversion-cert-dir`).
    pub conversion: Option<Webhook>,
}

/// Where the conversion webhook listens, and its TLS settings.
#[derive(Debug, Clone)]
pub struct Webhook {
    pub address: SocketAddr,
    pub tls: Arc<rustls::ServerConfig>,
    /// The folder `tls` serves from: its certificate's expiry is exported as
    /// `gpujob_conversion_certificate_expiration_timestamp_seconds`.
    pub certificates: Arc<tls::Certificates>,
}

/// How often the webhook's certificate folder is looked at for a renewal when no
/// client connects (a connection looks at it too), so the exported expiry is current.
const CERTIFICATE_CHECK: std::time::Duration = std::time::Duration::from_secs(60);

/// The servers' sockets, bound before the replica does anything else: an address in
/// use stops the process at start, naming the address, instead of leaving a replica
/// that works without its metrics, probes or webhook.
#[derive(Debug)]
pub struct Bound {
    listen: Listen,
    metrics: tokio::net::TcpListener,
    probes: Option<tokio::net::TcpListener>,
    conversion: Option<tokio::net::TcpListener>,
}

/// Binds every address `listen` names.
pub async fn bind(listen: Listen) -> anyhow::Result<Bound> {
    let metrics = bind_one(listen.metrics, "/metrics").await?;
    let probes = match listen.probes {
        Some(addr) => Some(bind_one(addr, "/healthz and /readyz").await?),
        None => None,
    };
    let conversion = match &listen.conversion {
        Some(webhook) => Some(bind_one(webhook.address, "the conversion webhook").await?),
        None => None,
    };
    Ok(Bound {
        listen,
        metrics,
        probes,
        conversion,
    })
}

async fn bind_one(addr: SocketAddr, what: &str) -> anyhow::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("binding the server of {what} to {addr}: {e}"))
}

impl Bound {
    /// Serves until `shutdown` resolves. `reviews`: the client that makes TokenReviews
    /// and SubjectAccessReviews, needed when `listen.tls` is set.
    pub async fn run(
        self,
        status: Arc<Status>,
        reviews: Option<kube::Client>,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        use futures::FutureExt;
        let Bound {
            listen,
            metrics,
            probes,
            conversion,
        } = self;
        let shutdown = shutdown.boxed().shared();
        let probes = async {
            match probes {
                Some(listener) => {
                    serve_plain(
                        listener,
                        probes_router(status.clone()),
                        "/healthz and /readyz",
                        shutdown.clone(),
                    )
                    .await
                }
                None => Ok(()),
            }
        };
        let metrics = async {
            match (listen.tls.clone(), listen.probes) {
                (Some(tls), _) => {
                    let client = reviews.clone().ok_or_else(|| {
                        anyhow::anyhow!("secure metrics need a client for TokenReviews")
                    })?;
                    let auth =
                        auth::Authorizer::new(auth::KubeReviewer::new(client), auth::CACHE_TTL);
                    tls::serve(
                        metrics,
                        secure_metrics_router(status.clone(), auth),
                        tls,
                        "/metrics, to bearer tokens allowed get /metrics",
                        shutdown.clone(),
                    )
                    .await
                }
                (None, Some(_)) => {
                    serve_plain(
                        metrics,
                        metrics_router(status.clone()),
                        "/metrics",
                        shutdown.clone(),
                    )
                    .await
                }
                (None, None) => serve(metrics, status.clone(), shutdown.clone()).await,
            }
        };
        let webhook = async {
            match (listen.conversion.clone(), conversion) {
                (Some(webhook), Some(listener)) => {
                    webhook.certificates.export_expiry(
                        status.metrics.conversion_certificate_expiry.clone(),
                        CERTIFICATE_CHECK,
                    );
                    status.set_serves_conversions();
                    tls::serve(
                        listener,
                        conversion::router(status.metrics.clone()),
                        webhook.tls,
                        "the conversion webhook (POST /convert)",
                        shutdown.clone(),
                    )
                    .await
                }
                _ => {
                    info!(
                        "conversion webhook off (no --conversion-cert-dir): only gpujob.dev/v1, the stored version, can be read and written while the CRD asks this operator to convert"
                    );
                    Ok(())
                }
            }
        };
        tokio::try_join!(probes, metrics, webhook)?;
        Ok(())
    }
}

/// Serves all three endpoints on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    status: Arc<Status>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    serve_plain(
        listener,
        router(status),
        "/metrics, /healthz and /readyz",
        shutdown,
    )
    .await
}

/// Serves `router` (`what` it answers, for the log) over plain HTTP on `listener`.
async fn serve_plain(
    listener: tokio::net::TcpListener,
    router: Router,
    what: &str,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    info!(address = %listener.local_addr()?, "serving {what}");
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown)
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Metrics;
    use axum::body::Body;
    use http::Request;
    use std::time::Duration;
    use tower::ServiceExt;

    async fn get_path(status: &Arc<Status>, path: &str) -> (StatusCode, String) {
        let res = router(status.clone())
            .oneshot(Request::get(path).body(Body::empty()).unwrap())
            .await
            .unwrap();
        let code = res.status();
        let bytes = axum::body::to_bytes(res.into_body(), 1 << 20)
            .await
            .unwrap();
        (code, String::from_utf8(bytes.to_vec()).unwrap())
    }

    #[tokio::test]
    async fn readyz_follows_the_caches() {
        let status = Status::new(Metrics::new());
        assert_eq!(
            get_path(&status, "/readyz").await.0,
            StatusCode::SERVICE_UNAVAILABLE
        );
        status.set_ready(true);
        assert_eq!(
            get_path(&status, "/readyz").await,
            (StatusCode::OK, "ok\n".into())
        );
    }

    #[tokio::test]
    async fn a_replica_serving_conversions_that_cannot_list_gpujobs_is_ready() {
        // Each half alone is not enough: a failed list without the webhook (nothing
        // depends on this replica's readiness), or the webhook while the list works.
        let status = Status::new(Metrics::new());
        status.set_serves_conversions();
        assert_eq!(
            get_path(&status, "/readyz").await.0,
            StatusCode::SERVICE_UNAVAILABLE
        );
        let other = Status::new(Metrics::new());
        other.gpujob_list_failed();
        assert_eq!(
            get_path(&other, "/readyz").await.0,
            StatusCode::SERVICE_UNAVAILABLE
        );
        status.gpujob_list_failed();
        let (code, body) = get_path(&status, "/readyz").await;
        assert_eq!(code, StatusCode::OK);
        assert!(body.contains("serving conversions"), "{body}");
    }

    #[tokio::test(start_paused = true)]
    async fn healthz_fails_when_the_lease_loop_is_wedged() {
        let status = Status::new(Metrics::new());
        assert_eq!(
            get_path(&status, "/healthz").await.0,
            StatusCode::OK,
            "no election: healthy"
        );
        status.beat(Duration::from_secs(30));
        tokio::time::advance(Duration::from_secs(29)).await;
        assert_eq!(get_path(&status, "/healthz").await.0, StatusCode::OK);
        tokio::time::advance(Duration::from_secs(2)).await;
        let (code, body) = get_path(&status, "/healthz").await;
        assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
        assert!(body.contains("lease loop silent"), "{body}");
    }

    #[tokio::test]
    async fn metrics_run_the_scrape_hooks_and_render_text() {
        let status = Status::new(Metrics::new());
        let m = status.metrics.clone();
        status.on_scrape(move || m.unconverged.set(7));
        let (code, body) = get_path(&status, "/metrics").await;
        assert_eq!(code, StatusCode::OK);
        assert!(body.contains("gpujob_unconverged 7"), "{body}");
        assert!(body.contains("# TYPE workqueue_depth gauge"));
    }

    #[tokio::test]
    async fn serves_over_a_real_socket() {
        let status = Status::new(Metrics::new());
        status.set_ready(true);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(serve(listener, status, async {
            let _ = stopped.await;
        }));
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        stream
            .write_all(b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut reply = String::new();
        stream.read_to_string(&mut reply).await.unwrap();
        assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
        stop.send(()).unwrap();
        server.await.unwrap().unwrap();
    }
}
