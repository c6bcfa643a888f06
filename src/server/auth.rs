//! Who may read `/metrics` when it is served securely (`--metrics-secure`): the request's
//! bearer token is checked with a TokenReview, then its user with a SubjectAccessReview
//! for verb `get` on the non-resource URL `/metrics`, as controller-runtime's secure
//! metrics do (`filters.WithAuthenticationAndAuthorization`). Answers: 401 without a
//! token or with one the API server does not accept, 403 when the review denies, 500 when
//! a review could not be made (nothing cached: the next scrape asks again).
//!
//! Each token's outcome is cached for a minute, so a scraper costs the API server two
//! small requests per minute, not two per scrape.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures::future::BoxFuture;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};
use tokio::time::Instant;
use tracing::{debug, warn};

use crate::apierror;

/// The non-resource URL and verb a scraper must be allowed (what the shipped
/// `gpujob-metrics-reader` ClusterRole grants).
pub const METRICS_PATH: &str = "/metrics";
pub const METRICS_VERB: &str = "get";

/// How long a token's outcome is reused, allowed or not (controller-runtime's choice):
/// a new RoleBinding, or a revoked one, takes effect within this.
pub const CACHE_TTL: Duration = Duration::from_secs(60);

/// At most this many tokens are remembered: a client sending a new token on every
/// request must not grow the operator's memory without bound.
const CACHE_MAX: usize = 1024;

/// What the reviews said about one token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// The token's user may `get` `/metrics`.
    Allowed,
    /// The API server does not accept the token (unknown, expired, wrong audience).
    Unauthenticated,
    /// The token is valid but its user may not `get` `/metrics`.
    Denied { user: String },
}

#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    #[error("TokenReview failed: {0}")]
    TokenReview(String),
    #[error("SubjectAccessReview of {user} for get /metrics failed: {message}")]
    SubjectAccessReview { user: String, message: String },
}

impl ReviewError {
    /// Short stable label (logs, metrics).
    pub fn label(&self) -> &'static str {
        match self {
            ReviewError::TokenReview(_) => "token_review",
            ReviewError::SubjectAccessReview { .. } => "subject_access_review",
        }
    }
}

/// Asks someone (the API server, or a test's stand-in) about a token.
pub trait Reviewer: Send + Sync + 'static {
    fn review<'a>(&'a self, token: &'a str) -> BoxFuture<'a, Result<Decision, ReviewError>>;
}

/// The API server's TokenReview and SubjectAccessReview, through `client` (whose user
/// needs `create` on both: deploy/operator/rbac.yaml).
#[derive(Clone)]
pub struct KubeReviewer {
    client: kube::Client,
}

impl std::fmt::Debug for KubeReviewer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeReviewer").finish_non_exhaustive()
    }
}

impl KubeReviewer {
    pub fn new(client: kube::Client) -> KubeReviewer {
        KubeReviewer { client }
    }

    async fn ask(&self, token: &str) -> Result<Decision, ReviewError> {
        let review = TokenReview {
            // No audiences: the API server's own, which its service-account tokens carry
            // (what Prometheus mounts and sends).
            spec: TokenReviewSpec {
                token: token.to_owned(),
                audiences: None,
            },
            ..TokenReview::default()
        };
        let answer = Api::<TokenReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| ReviewError::TokenReview(hint(&e, "tokenreviews")))?;
        let status = answer.status.unwrap_or_default();
        let user = match (status.authenticated, status.user) {
            (Some(true), Some(user)) => user,
            _ => return Ok(Decision::Unauthenticated),
        };
        let name = user.username.clone().unwrap_or_default();
        let access = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: user.username,
                groups: user.groups,
                uid: user.uid,
                extra: user.extra,
                non_resource_attributes: Some(NonResourceAttributes {
                    path: Some(METRICS_PATH.to_owned()),
                    verb: Some(METRICS_VERB.to_owned()),
                }),
                resource_attributes: None,
            },
            ..SubjectAccessReview::default()
        };
        let answer = Api::<SubjectAccessReview>::all(self.client.clone())
            .create(&PostParams::default(), &access)
            .await
            .map_err(|e| ReviewError::SubjectAccessReview {
                user: name.clone(),
                message: hint(&e, "subjectaccessreviews"),
            })?;
        if answer.status.is_some_and(|s| s.allowed) {
            Ok(Decision::Allowed)
        } else {
            Ok(Decision::Denied { user: name })
        }
    }
}

/// The API error in one line, with the fix when the operator itself may not ask.
fn hint(e: &kube::Error, resource: &str) -> String {
    let line = apierror::describe(e);
    match e {
        kube::Error::Api(s) if s.code == 403 => format!(
            "{line}: the operator's ClusterRole needs create on {resource} (apply deploy/operator/rbac.yaml)"
        ),
        _ => line,
    }
}

impl Reviewer for KubeReviewer {
    fn review<'a>(&'a self, token: &'a str) -> BoxFuture<'a, Result<Decision, ReviewError>> {
        Box::pin(self.ask(token))
    }
}

/// Reviews tokens through a [`Reviewer`], remembering each outcome for [`CACHE_TTL`].
/// Failed reviews are not remembered.
pub struct Authorizer {
    reviewer: Box<dyn Reviewer>,
    ttl: Duration,
    /// SHA-256 of the token (the cache holds no token) → when reviewed, and the outcome.
    cache: Mutex<HashMap<[u8; 32], (Instant, Decision)>>,
}

impl std::fmt::Debug for Authorizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authorizer")
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

impl Authorizer {
    pub fn new(reviewer: impl Reviewer, ttl: Duration) -> Arc<Authorizer> {
        Arc::new(Authorizer {
            reviewer: Box::new(reviewer),
            ttl,
            cache: Mutex::new(HashMap::new()),
        })
    }

    /// The outcome for `token`: remembered, or reviewed now.
    pub async fn check(&self, token: &str) -> Result<Decision, ReviewError> {
        let key: [u8; 32] = {
            let digest = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
            let mut key = [0u8; 32];
            key.copy_from_slice(digest.as_ref());
            key
        };
        if let Some(decision) = self.remembered(&key) {
            return Ok(decision);
        }
        let decision = self.reviewer.review(token).await?;
        if let Ok(mut cache) = self.cache.lock() {
            let now = Instant::now();
            if cache.len() >= CACHE_MAX {
                let ttl = self.ttl;
                cache.retain(|_, (at, _)| now.saturating_duration_since(*at) < ttl);
            }
            if cache.len() >= CACHE_MAX {
                // Still full of live entries: a flood of distinct tokens. Forgetting them
                // all costs the real scrapers one review each, nothing worse.
                cache.clear();
            }
            cache.insert(key, (now, decision.clone()));
        }
        Ok(decision)
    }

    fn remembered(&self, key: &[u8; 32]) -> Option<Decision> {
        let cache = self.cache.lock().ok()?;
        let (at, decision) = cache.get(key)?;
        (at.elapsed() < self.ttl).then(|| decision.clone())
    }
}

/// The token of an `Authorization: Bearer <token>` header.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

fn unauthorized() -> Response {
    (
        StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, "Bearer")],
        "Unauthorized\n",
    )
        .into_response()
}

/// Middleware: lets the request through only when its token may `get` `/metrics`.
pub async fn require_metrics_reader(
    State(auth): State<Arc<Authorizer>>,
    request: Request,
    next: Next,
) -> Response {
    let Some(token) = bearer(request.headers()) else {
        debug!("metrics: a request without a bearer token: 401");
        return unauthorized();
    };
    match auth.check(token).await {
        Ok(Decision::Allowed) => next.run(request).await,
        Ok(Decision::Unauthenticated) => {
            debug!("metrics: a token the API server does not accept: 401");
            unauthorized()
        }
        Ok(Decision::Denied { user }) => {
            debug!(user = %user, "metrics: may not get /metrics: 403");
            (
                StatusCode::FORBIDDEN,
                format!("Authorization denied for user {user}: bind the ClusterRole gpujob-metrics-reader\n"),
            )
                .into_response()
        }
        Err(e) => {
            warn!(
                error = e.label(),
                "metrics: reviewing a scrape's token failed: {e}; answered 500, the next scrape asks again"
            );
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                "Reviewing the token failed; see the operator's log\n",
            )
                .into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Answers from a fixed table and counts what it was asked.
    struct Table {
        calls: Arc<AtomicUsize>,
    }

    impl Reviewer for Table {
        fn review<'a>(&'a self, token: &'a str) -> BoxFuture<'a, Result<Decision, ReviewError>> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            Box::pin(async move {
                match token {
                    "reader" => Ok(Decision::Allowed),
                    "stranger" => Ok(Decision::Denied {
                        user: "stranger".into(),
                    }),
                    "broken" => Err(ReviewError::TokenReview("connection refused".into())),
                    _ => Ok(Decision::Unauthenticated),
                }
            })
        }
    }

    fn authorizer() -> (Arc<Authorizer>, Arc<AtomicUsize>) {
        let calls = Arc::new(AtomicUsize::new(0));
        let auth = Authorizer::new(
            Table {
                calls: calls.clone(),
            },
            CACHE_TTL,
        );
        (auth, calls)
    }

    #[test]
    fn the_bearer_token_is_read_from_the_authorization_header() {
        let mut h = HeaderMap::new();
        assert_eq!(bearer(&h), None);
        h.insert(header::AUTHORIZATION, "Bearer abc".parse().unwrap());
        assert_eq!(bearer(&h), Some("abc"));
        h.insert(header::AUTHORIZATION, "bearer  abc ".parse().unwrap());
        assert_eq!(bearer(&h), Some("abc"));
        h.insert(header::AUTHORIZATION, "Basic dXNlcjpwdw==".parse().unwrap());
        assert_eq!(bearer(&h), None);
        h.insert(header::AUTHORIZATION, "Bearer ".parse().unwrap());
        assert_eq!(bearer(&h), None);
    }

    #[tokio::test(start_paused = true)]
    async fn outcomes_are_remembered_for_the_ttl_and_failures_not_at_all() {
        let (auth, calls) = authorizer();
        assert_eq!(auth.check("reader").await.unwrap(), Decision::Allowed);
        assert_eq!(auth.check("reader").await.unwrap(), Decision::Allowed);
        assert_eq!(
            calls.load(Ordering::SeqCst),
            1,
            "the second scrape is cached"
        );
        assert_eq!(
            auth.check("stranger").await.unwrap(),
            Decision::Denied {
                user: "stranger".into()
            }
        );
        auth.check("stranger").await.unwrap();
        assert_eq!(calls.load(Ordering::SeqCst), 2, "denials are cached too");

        tokio::time::advance(CACHE_TTL).await;
        auth.check("reader").await.unwrap();
        assert_eq!(
            calls.load(Ordering::SeqCst),
            3,
            "reviewed again after the ttl"
        );

        assert!(auth.check("broken").await.is_err());
        assert!(auth.check("broken").await.is_err());
        assert_eq!(
            calls.load(Ordering::SeqCst),
            5,
            "a failed review is asked again"
        );
    }

    #[tokio::test]
    async fn a_flood_of_tokens_does_not_grow_the_cache_without_bound() {
        let (auth, _) = authorizer();
        for i in 0..(CACHE_MAX * 2 + 7) {
            auth.check(&format!("random-{i}")).await.unwrap();
        }
        let len = auth.cache.lock().unwrap().len();
        assert!(len <= CACHE_MAX, "{len}");
    }

    #[tokio::test]
    async fn answers_401_403_500_and_lets_readers_through() {
        use axum::Router;
        use axum::body::Body;
        use axum::routing::get;
        use tower::ServiceExt;

        let (auth, _) = authorizer();
        let app = Router::new()
            .route("/metrics", get(|| async { "metrics\n" }))
            .route_layer(axum::middleware::from_fn_with_state(
                auth,
                require_metrics_reader,
            ));
        let ask = |token: Option<&str>| {
            let mut req = axum::http::Request::get("/metrics");
            if let Some(t) = token {
                req = req.header(header::AUTHORIZATION, format!("Bearer {t}"));
            }
            let app = app.clone();
            let req = req.body(Body::empty()).unwrap();
            async move {
                let res = app.oneshot(req).await.unwrap();
                let code = res.status();
                let body = axum::body::to_bytes(res.into_body(), 1 << 16)
                    .await
                    .unwrap();
                (code, String::from_utf8(body.to_vec()).unwrap())
            }
        };
        assert_eq!(ask(None).await.0, StatusCode::UNAUTHORIZED);
        assert_eq!(ask(Some("nonsense")).await.0, StatusCode::UNAUTHORIZED);
        let (code, body) = ask(Some("stranger")).await;
        assert_eq!(code, StatusCode::FORBIDDEN);
        assert!(body.contains("stranger"), "{body}");
        assert_eq!(
            ask(Some("broken")).await.0,
            StatusCode::INTERNAL_SERVER_ERROR
        );
        assert_eq!(
            ask(Some("reader")).await,
            (StatusCode::OK, "metrics\n".into())
        );
    }
}
