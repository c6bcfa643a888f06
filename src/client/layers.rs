//! Tower layers of the API client: the write fence, the rate limit (with request
//! metrics) and a counting retry.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use kube::client::Body;
use kube::client::retry::RetryPolicy;
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
/// between here and the socket): see the README on which writes are safe when late.
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
            if let Some(m) = metrics {
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

/// kube's retry policy for 429/503/504, counting each retry.
#[derive(Clone)]
pub struct CountingRetry {
    inner: RetryPolicy,
    metrics: Option<Metrics>,
}

impl CountingRetry {
    pub fn new(inner: RetryPolicy, metrics: Option<Metrics>) -> CountingRetry {
        CountingRetry { inner, metrics }
    }
}

impl<Res> Policy<Request<Body>, Response<Res>, BoxError> for CountingRetry {
    type Future = tokio::time::Sleep;

    fn retry(
        &mut self,
        req: &mut Request<Body>,
        result: &mut Result<Response<Res>, BoxError>,
    ) -> Option<Self::Future> {
        let code = result.as_ref().ok().map(|r| r.status().as_u16());
        let retry = self.inner.retry(req, result);
        if retry.is_some()
            && let (Some(m), Some(code)) = (&self.metrics, code)
        {
            m.rest_retries
                .with_label_values(&[code.to_string().as_str(), req.method().as_str()])
                .inc();
        }
        retry
    }

    fn clone_request(&mut self, req: &Request<Body>) -> Option<Request<Body>> {
        <RetryPolicy as Policy<Request<Body>, Response<Res>, BoxError>>::clone_request(
            &mut self.inner,
            req,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::namespace_of;

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
