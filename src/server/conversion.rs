//! The CRD conversion webhook: `POST /convert` answers a `ConversionReview`
//! (`apiextensions.k8s.io/v1`) by passing each object through
//! [`crate::api::convert::convert`]. Served over HTTPS on every replica from process start,
//! leader or not: the API server cannot read or write a GpuJob in a version other than the
//! stored one (v1) while no replica answers.
//!
//! Every answer that can carry a review does: a conversion that fails is a review whose
//! result is `Failure` with a message naming the object and the field, which the API
//! server passes on to its client; the HTTP status is 200 then. A body that is not a
//! ConversionReview at all gets a 400 with a review saying why (there is no uid to answer).

use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use kube::core::Status as ApiStatus;
use kube::core::conversion::{ConversionRequest, ConversionResponse, ConversionReview};
use serde_json::Value;
use tracing::{debug, warn};

use crate::api::convert::{ConvertError, convert};
use crate::metrics::Metrics;

/// The path the CRD's `conversion.webhook.clientConfig` names.
pub use crate::api::crd::WEBHOOK_PATH as PATH;

/// A review carries one list page of objects; GpuJobs with pod templates run to a few KB
/// each, so this is far above any page the API server sends, and still bounded.
const BODY_LIMIT: usize = 64 << 20;

/// `POST /convert`.
pub fn router(metrics: Metrics) -> Router {
    Router::new()
        .route(PATH, post(handle))
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .with_state(Arc::new(metrics))
}

async fn handle(State(metrics): State<Arc<Metrics>>, body: Bytes) -> Response {
    let started = Instant::now();
    let (code, review) = review(&body);
    let failed = review
        .response
        .as_ref()
        .is_none_or(|r| r.result.status != Some(kube::core::response::StatusSummary::Success));
    let result = if failed { "failed" } else { "success" };
    let body = serde_json::to_vec(&review).unwrap_or_else(|e| {
        // Not reachable with these types (strings and JSON values only); answer with
        // something the API server can read all the same.
        format!(r#"{{"apiVersion":"apiextensions.k8s.io/v1","kind":"ConversionReview","response":{{"uid":"","result":{{"status":"Failure","message":"encoding the answer failed: {e}"}}}}}}"#).into_bytes()
    });
    metrics
        .conversion_requests
        .with_label_values(&[result])
        .inc();
    metrics
        .conversion_duration
        .observe(started.elapsed().as_secs_f64());
    (code, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// The answer to a request body, and its HTTP status.
pub fn review(body: &[u8]) -> (StatusCode, ConversionReview) {
    let request = serde_json::from_slice::<ConversionReview>(body)
        .map_err(|e| format!("the body is not a ConversionReview: {e}"))
        .and_then(|r| {
            ConversionRequest::from_review(r)
                .map_err(|_| "the ConversionReview has no request".to_owned())
        });
    let request = match request {
        Ok(r) => r,
        Err(message) => {
            warn!(
                "conversion webhook: {message}; answered 400 (a client other than the API server, or a newer API server?)"
            );
            let status = ApiStatus::failure(&message, "BadRequest").with_code(400);
            return (
                StatusCode::BAD_REQUEST,
                ConversionResponse::invalid(status).into_review(),
            );
        }
    };
    let desired = request.desired_api_version.clone();
    let count = request.objects.len();
    let objects = request.objects.clone();
    let response = ConversionResponse::for_request(request);
    let mut converted = Vec::with_capacity(count);
    for object in objects {
        let who = describe(&object);
        match convert(object, &desired) {
            Ok(o) => converted.push(o),
            Err(e) => {
                let message = failure_message(&who, &desired, &e);
                warn!(
                    object = %who, desired = %desired, error = e.metric_label(),
                    "conversion webhook: {message}; the API server fails the request that needed it with this message, and nothing is written"
                );
                let status = ApiStatus::failure(&message, "Invalid").with_code(422);
                return (StatusCode::OK, response.failure(status).into_review());
            }
        }
    }
    debug!(objects = count, desired = %desired, "conversion webhook: converted");
    (StatusCode::OK, response.success(converted).into_review())
}

/// `GpuJob team-a/train (uid 1234)` from whatever metadata the object has.
fn describe(object: &Value) -> String {
    let meta = object.get("metadata");
    let field = |k: &str| meta.and_then(|m| m.get(k)).and_then(Value::as_str);
    let kind = object
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or("object");
    let name = match (field("namespace"), field("name")) {
        (Some(ns), Some(name)) => format!("{ns}/{name}"),
        (None, Some(name)) => name.to_owned(),
        _ => "(no name)".to_owned(),
    };
    match field("uid") {
        Some(uid) => format!("{kind} {name} (uid {uid})"),
        None => format!("{kind} {name}"),
    }
}

/// What the API server's client reads: the object, the target version, and the field.
fn failure_message(who: &str, desired: &str, e: &ConvertError) -> String {
    match e {
        // The decode error names the field (`spec.resources.gpus: invalid type: …`).
        ConvertError::Decode { api_version, error } => format!(
            "converting {who} to {desired}: field {}: the {api_version} object does not decode: {}",
            if error.path.is_empty() {
                "(the object)"
            } else {
                &error.path
            },
            error.message
        ),
        other => format!("converting {who} to {desired}: {other}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use http::Request;
    use serde_json::json;
    use tower::ServiceExt;

    fn request(desired: &str, objects: Vec<Value>) -> Value {
        json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "ConversionReview",
            "request": {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "desiredAPIVersion": desired, "objects": objects},
        })
    }

    fn v1(name: &str, spec: Value) -> Value {
        json!({
            "apiVersion": "gpujob.dev/v1", "kind": "GpuJob",
            "metadata": {"name": name, "namespace": "team-a", "uid": format!("uid-{name}")},
            "spec": spec,
        })
    }

    async fn post_body(metrics: &Metrics, body: Vec<u8>) -> (StatusCode, Value) {
        let res = router(metrics.clone())
            .oneshot(
                Request::post(PATH)
                    .header("content-type", "application/json")
                    .body(Body::from(body))
                    .unwrap(),
            )
            .await
            .unwrap();
        let code = res.status();
        let bytes = axum::body::to_bytes(res.into_body(), 1 << 20)
            .await
            .unwrap();
        (code, serde_json::from_slice(&bytes).unwrap())
    }

    #[tokio::test]
    async fn converts_every_object_and_keeps_the_uid() {
        let metrics = Metrics::new();
        let objects = vec![
            v1("a", json!({"image": "i", "gpus": 2, "maxRetries": 1})),
            v1(
                "b",
                json!({"image": "j", "gpus": 1, "activeDeadlineSeconds": 90}),
            ),
        ];
        let body = serde_json::to_vec(&request("gpujob.dev/v2", objects)).unwrap();
        let (code, review) = post_body(&metrics, body).await;
        assert_eq!(code, StatusCode::OK);
        assert_eq!(review["kind"], "ConversionReview");
        assert_eq!(review["apiVersion"], "apiextensions.k8s.io/v1");
        let response = &review["response"];
        assert_eq!(response["uid"], "705ab4f5-6393-11e8-b7cc-42010a800002");
        assert_eq!(response["result"]["status"], "Success");
        let out = response["convertedObjects"].as_array().unwrap();
        assert_eq!(out.len(), 2);
        assert_eq!(out[0]["apiVersion"], "gpujob.dev/v2");
        assert_eq!(out[0]["metadata"]["uid"], "uid-a");
        assert_eq!(out[0]["spec"]["resources"]["gpus"], 2);
        assert_eq!(out[0]["spec"]["retryPolicy"]["maxRetries"], 1);
        assert_eq!(out[1]["spec"]["attemptDeadline"], "1m30s");
        let text = metrics.encode();
        assert!(
            text.contains("gpujob_conversion_requests_total{result=\"success\"} 1"),
            "{text}"
        );
        assert!(text.contains("gpujob_conversion_duration_seconds_count 1"));
    }

    #[tokio::test]
    async fn a_bad_object_fails_the_review_naming_the_object_and_the_field() {
        let metrics = Metrics::new();
        let objects = vec![
            v1("good", json!({"image": "i", "gpus": 1})),
            v1("bad", json!({"image": "i", "gpus": "two"})),
        ];
        let body = serde_json::to_vec(&request("gpujob.dev/v2", objects)).unwrap();
        let (code, review) = post_body(&metrics, body).await;
        assert_eq!(
            code,
            StatusCode::OK,
            "a failed conversion is still a review"
        );
        let response = &review["response"];
        assert_eq!(response["uid"], "705ab4f5-6393-11e8-b7cc-42010a800002");
        assert_eq!(response["result"]["status"], "Failure");
        let message = response["result"]["message"].as_str().unwrap();
        assert!(
            message.contains("GpuJob team-a/bad (uid uid-bad)"),
            "names the object: {message}"
        );
        assert!(
            message.contains("field spec.gpus"),
            "names the field: {message}"
        );
        assert!(message.contains("gpujob.dev/v2"), "{message}");
        assert!(
            response["convertedObjects"]
                .as_array()
                .is_none_or(Vec::is_empty),
            "nothing half-converted: {review}"
        );
        assert!(
            metrics
                .encode()
                .contains("gpujob_conversion_requests_total{result=\"failed\"} 1")
        );
    }

    #[tokio::test]
    async fn an_unknown_version_or_kind_fails_the_review() {
        let metrics = Metrics::new();
        let body = serde_json::to_vec(&request(
            "gpujob.dev/v3",
            vec![v1("a", json!({"image": "i", "gpus": 1}))],
        ))
        .unwrap();
        let (_, review) = post_body(&metrics, body).await;
        let message = review["response"]["result"]["message"].as_str().unwrap();
        assert!(message.contains("gpujob.dev/v3"), "{message}");
        assert!(message.contains("team-a/a"), "{message}");

        let mut other = v1("w", json!({}));
        other["kind"] = json!("Widget");
        let body = serde_json::to_vec(&request("gpujob.dev/v2", vec![other])).unwrap();
        let (_, review) = post_body(&metrics, body).await;
        let message = review["response"]["result"]["message"].as_str().unwrap();
        assert!(message.contains("Widget team-a/w"), "{message}");
    }

    #[tokio::test]
    async fn a_body_that_is_no_review_gets_a_400_review_not_a_panic() {
        let metrics = Metrics::new();
        let (code, review) = post_body(&metrics, b"{not json".to_vec()).await;
        assert_eq!(code, StatusCode::BAD_REQUEST);
        assert_eq!(review["kind"], "ConversionReview");
        assert_eq!(review["response"]["result"]["status"], "Failure");
        let (code, review) = post_body(
            &metrics,
            br#"{"apiVersion":"apiextensions.k8s.io/v1","kind":"ConversionReview"}"#.to_vec(),
        )
        .await;
        assert_eq!(code, StatusCode::BAD_REQUEST);
        let message = review["response"]["result"]["message"].as_str().unwrap();
        assert!(message.contains("no request"), "{message}");
        assert!(
            metrics
                .encode()
                .contains("gpujob_conversion_requests_total{result=\"failed\"} 2")
        );
    }

    #[tokio::test]
    async fn an_empty_request_is_a_success() {
        let metrics = Metrics::new();
        let body = serde_json::to_vec(&request("gpujob.dev/v1", vec![])).unwrap();
        let (code, review) = post_body(&metrics, body).await;
        assert_eq!(code, StatusCode::OK);
        assert_eq!(review["response"]["result"]["status"], "Success");
    }
}
