//! Tower layers of the API client: the write fence, the rate limit (with request
//! metrics) and a counting retry.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use kube::client::Body;
use tokio::time::Instant;
use tower::retry::Policy;
use tower::{BoxError, Layer, Service};

use tokio::sync::watch;

use crate::lease::Ownership;
use crate::metrics::Metrics;
use crate::ratelimit::TokenBucket;

/// Refuses writes (anything but GET) once ownership of the object's shard has lapsed
/// (the shard of the namespace in the request path). It sits as close to the wire as
/// this client can reach, after the rate limiter and the request buffer, so a write that
/// waited there (or in a process paused with SIGSTOP) is checked again just before it
/// is handed to the connection. What passed this check can still leave late (a pause
/// between here and the socket): docs/ha-and-sharding.md ("What is guaranteed") says
/// which writes are safe when late.
#[derive(Clone)]
pub struct FenceLayer {
    ownership: watch::Receiver<Ownership>,
}

impl FenceLayer {
    pub fn new(ownership: watch::Receiver<Ownership>) -> FenceLayer {
        FenceLayer { ownership }
    }
}

impl<S> Layer<S> for FenceLayer {
    type Service = Fenced<S>;

    fn layer(&self, inner: S) -> Fenced<S> {
        Fenced {
            inner,
            ownership: self.ownership.clone(),
        }
    }
}

pub struct Fenced<S> {
    inner: S,
    ownership: watch::Receiver<Ownership>,
}

/// The error a fenced write fails with.
#[derive(Debug, thiserror::Error)]
#[error("write refused locally: this replica's lease has lapsed")]
pub struct LeaseLapsed;

/// Was `e` a write this replica's fence refused before sending it (the object's shard is
/// no longer held, or the lease lapsed)?
pub fn fenced(e: &kube::Error) -> bool {
    refused_by_fence(e)
}

/// Is `e`, or one of its causes, the fence's refusal?
fn refused_by_fence(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut source = Some(e);
    while let Some(cause) = source {
        if cause.downcast_ref::<LeaseLapsed>().is_some() {
            return true;
        }
        source = cause.source();
    }
    false
}

impl<S, B> Service<Request<Body>> for Fenced<S>
where
    S: Service<Request<Body>, Response = Response<B>, Error = BoxError>,
    S::Future: Send + 'static,
{
    type Response = Response<B>;
    type Error = BoxError;
    type Future =
        futures::future::Either<S::Future, futures::future::Ready<Result<Response<B>, BoxError>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let write = req.method() != http::Method::GET;
        if write
            && !self
                .ownership
                .borrow()
                .may_write(namespace_of(req.uri().path()), Instant::now())
        {
            return futures::future::Either::Right(futures::future::ready(Err(Box::new(
                LeaseLapsed,
            ))));
        }
        futures::future::Either::Left(self.inner.call(req))
    }
}

/// The namespace of a namespaced API path (`/api/v1/namespaces/{ns}/...`,
/// `/apis/{group}/{version}/namespaces/{ns}/...`); `None` for anything else.
fn namespace_of(path: &str) -> Option<&str> {
    let mut parts = path.split('/').skip_while(|p| *p != "namespaces").skip(1);
    let ns = parts.next()?;
    // `POST /api/v1/namespaces/{name}`-like paths with nothing after the name are
    // namespaces themselves, not objects in one.
    parts.next().map(|_| ns)
}

/// Waits for a token before each request and counts the request by code and method.
#[derive(Clone)]
pub struct RateLimitLayer {
    bucket: Arc<TokenBucket>,
    metrics: Option<Metrics>,
}

impl RateLimitLayer {
    pub fn new(bucket: Arc<TokenBucket>, metrics: Option<Metrics>) -> RateLimitLayer {
        RateLimitLayer { bucket, metrics }
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimited<S>;

    fn layer(&self, inner: S) -> RateLimited<S> {
        RateLimited {
            inner,
            bucket: self.bucket.clone(),
            metrics: self.metrics.clone(),
        }
    }
}

#[derive(Clone)]
pub struct RateLimited<S> {
    inner: S,
    bucket: Arc<TokenBucket>,
    metrics: Option<Metrics>,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B> Service<Request<Body>> for RateLimited<S>
where
    S: Service<Request<Body>, Response = Response<B>, Error = BoxError> + Clone + Send + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
{
    type Response = Response<B>;
    type Error = BoxError;
    type Future = BoxFuture<Result<Response<B>, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        // The clone-and-swap idiom: the ready service goes into the future.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let bucket = self.bucket.clone();
        let metrics = self.metrics.clone();
        Box::pin(async move {
            let waited = bucket.acquire().await;
            let method = req.method().as_str().to_owned();
            let started = Instant::now();
            let result = inner.call(req).await;
            // A write the fence refused was never sent: it is no request, and no
            // transport error (`<error>` pages as one).
            let sent = !matches!(&result, Err(e) if refused_by_fence(e.as_ref()));
            if let Some(m) = metrics.filter(|_| sent) {
                m.rate_limiter_wait.observe(waited.as_secs_f64());
                let code = match &result {
                    Ok(res) => res.status().as_u16().to_string(),
                    Err(_) => "<error>".to_owned(),
                };
                m.rest_requests
                    .with_label_values(&[code.as_str(), method.as_str()])
                    .inc();
                m.rest_latency
                    .with_label_values(&[method.as_str()])
                    .observe(started.elapsed().as_secs_f64());
            }
            result
        })
    }
}

/// Retries of answers that say "try again": 429, 500, 502, 503 and 504. At most
/// [`MAX_RETRIES`] per request, after the server's `Retry-After` when it gives one (a
/// request is never retried sooner than it was told; told to wait longer than
/// [`MAX_RETRY_AFTER`], it is not retried here: the reconcile fails and its per-GpuJob
/// backoff takes over), else after 100 ms doubling up to 5 s. A retry passes the rate
/// limiter and the fence again (both sit inside this layer), and is counted in
/// `rest_client_request_retries_total`. Every request this client sends is safe to
/// repeat (stable names, preconditions), so an answer lost to a 5xx is resolved by
/// sending it again and reading what the server says.
#[derive(Clone)]
pub struct BoundedRetry {
    attempt: u32,
    metrics: Option<Metrics>,
}

/// Retries per request.
pub const MAX_RETRIES: u32 = 4;
/// The longest `Retry-After` waited for within one request.
pub const MAX_RETRY_AFTER: std::time::Duration = std::time::Duration::from_secs(30);

impl BoundedRetry {
    pub fn new(metrics: Option<Metrics>) -> BoundedRetry {
        BoundedRetry {
            attempt: 0,
            metrics,
        }
    }

    /// How long to wait before retry number `attempt` (from 1) of an answer with `code`
    /// and `retry_after`; `None`: do not retry.
    pub fn delay(
        attempt: u32,
        code: u16,
        retry_after: Option<&str>,
    ) -> Option<std::time::Duration> {
        if attempt > MAX_RETRIES || !matches!(code, 429 | 500 | 502 | 503 | 504) {
            return None;
        }
        let backoff = crate::backoff::exponential(
            std::time::Duration::from_millis(100),
            std::time::Duration::from_secs(5),
            attempt,
        );
        match retry_after.map(str::trim).map(str::parse::<u64>) {
            Some(Ok(secs)) => {
                let told = std::time::Duration::from_secs(secs);
                (told <= MAX_RETRY_AFTER).then(|| told.max(backoff))
            }
            _ => Some(backoff),
        }
    }
}

impl<Res> Policy<Request<Body>, Response<Res>, BoxError> for BoundedRetry {
    type Future = tokio::time::Sleep;

    fn retry(
        &mut self,
        req: &mut Request<Body>,
        result: &mut Result<Response<Res>, BoxError>,
    ) -> Option<Self::Future> {
        let response = result.as_ref().ok()?;
        let code = response.status().as_u16();
        let retry_after = response
            .headers()
            .get(http::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok());
        let delay = Self::delay(self.attempt + 1, code, retry_after)?;
        self.attempt += 1;
        if let Some(m) = &self.metrics {
            m.rest_retries
                .with_label_values(&[code.to_string().as_str(), req.method().as_str()])
                .inc();
        }
        Some(tokio::time::sleep(delay))
    }

    fn clone_request(&mut self, req: &Request<Body>) -> Option<Request<Body>> {
        let body = req.body().try_clone()?;
        let mut builder = Request::builder()
            .method(req.method().clone())
            .uri(req.uri().clone())
            .version(req.version());
        if let Some(headers) = builder.headers_mut() {
            headers.extend(req.headers().clone());
        }
        builder.body(body).ok().map(|mut new| {
            *new.extensions_mut() = req.extensions().clone();
            new
        })
    }
}

#[cfg(test)]
mod tests {
    use super::{BoundedRetry, LeaseLapsed, MAX_RETRIES, fenced, namespace_of};
    use std::time::Duration;

    #[test]
    fn a_write_the_fence_refused_is_told_from_other_failures() {
        assert!(fenced(&kube::Error::Service(Box::new(LeaseLapsed))));
        let other = kube::Error::Service(Box::new(std::io::Error::other("reset")));
        assert!(!fenced(&other));
    }

    #[test]
    fn retries_are_bounded_and_never_sooner_than_the_server_says() {
        let d = |attempt, code, after| BoundedRetry::delay(attempt, code, after);
        assert_eq!(d(1, 503, None), Some(Duration::from_millis(100)));
        assert_eq!(d(2, 503, None), Some(Duration::from_millis(200)));
        assert_eq!(
            d(1, 429, Some("2")),
            Some(Duration::from_secs(2)),
            "Retry-After"
        );
        assert_eq!(
            d(1, 429, Some("31")),
            None,
            "told to wait too long: not here"
        );
        assert_eq!(d(MAX_RETRIES + 1, 503, None), None, "bounded");
        assert_eq!(
            d(1, 409, None),
            None,
            "a conflict is an answer, not a retry"
        );
        assert_eq!(d(1, 404, None), None);
        assert_eq!(d(1, 500, Some("junk")), Some(Duration::from_millis(100)));
    }

    #[test]
    fn the_namespace_comes_from_the_path() {
        let cases = [
            ("/apis/batch/v1/namespaces/team-a/jobs", Some("team-a")),
            ("/apis/batch/v1/namespaces/team-a/jobs/x-1", Some("team-a")),
            (
                "/apis/gpujob.dev/v1/namespaces/ml/gpujobs/a/status",
                Some("ml"),
            ),
            ("/apis/events.k8s.io/v1/namespaces/ml/events", Some("ml")),
            ("/api/v1/namespaces/ml", None),
            ("/api/v1/namespaces", None),
            ("/apis/gpujob.dev/v1/gpujobs", None),
        ];
        for (path, ns) in cases {
            assert_eq!(namespace_of(path), ns, "{path}");
        }
    }
}
