//! A client whose every request carries a shard selector (`shardSelector=…`, the API
//! server's sharded list and watch, KEP-5866): kube-runtime's watcher has no such
//! parameter, so the watch of a scope is given a client that adds it. Requests go
//! through the client it wraps, budget and counting included.

use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use http::{Request, Response, Uri};
use kube::Client;
use kube::client::Body;
use tower::{BoxError, Service};

/// `client`, with `selector` added to every request's query.
pub fn selecting(client: &Client, selector: &str) -> Client {
    let namespace = client.default_namespace().to_owned();
    Client::new(
        Selecting {
            inner: client.clone(),
            param: Arc::from(format!("shardSelector={}", encode(selector))),
        },
        namespace,
    )
}

#[derive(Clone)]
struct Selecting {
    inner: Client,
    param: Arc<str>,
}

impl Service<Request<Body>> for Selecting {
    type Response = Response<Body>;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<Response<Body>, BoxError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        // The wrapped client waits for its own readiness in `send`.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut req: Request<Body>) -> Self::Future {
        let inner = self.inner.clone();
        let uri = with_param(req.uri(), &self.param);
        Box::pin(async move {
            *req.uri_mut() = uri?;
            inner.send(req).await.map_err(BoxError::from)
        })
    }
}

fn with_param(uri: &Uri, param: &str) -> Result<Uri, BoxError> {
    let mut parts = uri.clone().into_parts();
    let path = parts.path_and_query.as_ref().map_or("/", |pq| pq.as_str());
    let joined = if path.contains('?') {
        format!("{path}&{param}")
    } else {
        format!("{path}?{param}")
    };
    parts.path_and_query = Some(joined.parse()?);
    Ok(Uri::from_parts(parts)?)
}

/// Percent-encodes all but RFC 3986's unreserved characters.
pub(crate) fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 2);
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_selector_joins_the_query_encoded() {
        let sel = "shardRange(object.metadata.namespace, '0x0000000000000000', '0x8000000000000000') || shardRange(object.metadata.namespace, '0xc000000000000000', '0x10000000000000000')";
        let param = format!("shardSelector={}", encode(sel));
        let list: Uri = "https://h:6443/apis/gpujob.dev/v2/gpujobs?limit=100"
            .parse()
            .unwrap();
        let got = with_param(&list, &param).unwrap();
        assert_eq!(got.path(), "/apis/gpujob.dev/v2/gpujobs");
        let query = got.query().unwrap();
        assert!(query.starts_with("limit=100&shardSelector=shardRange%28object.metadata.namespace%2C%20%270x0000000000000000%27"), "{query}");
        assert!(query.ends_with("%20%7C%7C%20shardRange%28object.metadata.namespace%2C%20%270xc000000000000000%27%2C%20%270x10000000000000000%27%29"), "{query}");
        let bare: Uri = "/apis/batch/v1/jobs".parse().unwrap();
        assert_eq!(
            with_param(&bare, "a=b").unwrap().to_string(),
            "/apis/batch/v1/jobs?a=b"
        );
    }
}
