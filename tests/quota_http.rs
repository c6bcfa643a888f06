//! The `http` quota backend as a client of docs/quota-api.md, against the fake service:
//! the bearer token, the per-call timeout and TLS trust. (What the operator does with
//! the answers is in tests/quota.rs.)

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

mod support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use gpujob_operator::quota::{
    Call, HttpProvider, HttpSettings, QuotaError, QuotaProvider, Reserve, ReserveRequest,
};
use support::quota::{FakeQuota, Mode, TOKEN};

/// Every test here is bounded: a call that ignored its timeout fails the test.
const BOUND: Duration = Duration::from_secs(30);

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("quota-http-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn provider(url: &str, token_file: &Path, ca_file: Option<PathBuf>) -> HttpProvider {
    HttpProvider::new(HttpSettings {
        base_url: url.to_owned(),
        token_file: Some(token_file.to_path_buf()),
        ca_file,
        timeout: Duration::from_millis(500),
        user_agent: "gpujob-operator-test".into(),
    })
    .unwrap()
}

fn request(uid: &str) -> ReserveRequest {
    ReserveRequest {
        uid: uid.to_owned(),
        namespace: "team-a".into(),
        name: "train".into(),
        gpus: 2,
    }
}

#[tokio::test]
async fn a_wrong_token_is_an_error_not_a_refusal_and_a_rotated_token_applies_at_once() {
    tokio::time::timeout(BOUND, async {
        let quota = FakeQuota::start().await;
        let dir = scratch("token");
        let token = dir.join("token");
        std::fs::write(&token, "stale-token").unwrap();
        let p = provider(&quota.url, &token, None);

        // 401 is not "no quota": the operator must retry it as a failure, not park the
        // GpuJob as refused.
        match p.reserve(&request("u1"), &Call::default()).await {
            Err(QuotaError::Status { code: 401, .. }) => {}
            other => panic!("expected a 401 error, got {other:?}"),
        }
        assert!(quota.live().is_empty());

        // The token file is re-read per call: rotating it needs no restart.
        std::fs::write(&token, format!("{TOKEN}\n")).unwrap();
        let granted = p.reserve(&request("u1"), &Call::default()).await.unwrap();
        assert!(matches!(granted, Reserve::Granted { .. }), "{granted:?}");
        assert_eq!(quota.live().len(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn a_service_that_never_answers_times_out_per_call() {
    tokio::time::timeout(BOUND, async {
        let quota = FakeQuota::start().await;
        let dir = scratch("hang");
        let token = dir.join("token");
        std::fs::write(&token, TOKEN).unwrap();
        let p = provider(&quota.url, &token, None);

        quota.set_reserve(Mode::Hang);
        match p.reserve(&request("u1"), &Call::default()).await {
            Err(e @ QuotaError::Timeout { op: "reserve", .. }) => {
                assert!(e.to_string().contains(&quota.url), "{e}");
            }
            other => panic!("expected a reserve timeout, got {other:?}"),
        }
        quota.set_release(Mode::Hang);
        match p.release("u1", &Call::default()).await {
            Err(QuotaError::Timeout { op: "release", .. }) => {}
            other => panic!("expected a release timeout, got {other:?}"),
        }
        std::fs::remove_dir_all(&dir).unwrap();
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn https_is_trusted_through_the_ca_file_and_refused_without_it() {
    gpujob_operator::client::install_crypto_provider();
    tokio::time::timeout(BOUND, async {
        let dir = scratch("tls");
        let pki = devcluster::pki::Pki::ensure(&dir.join("pki")).unwrap();
        let quota = FakeQuota::start_tls(&pki).await;
        assert!(quota.url.starts_with("https://"));
        let token = dir.join("token");
        std::fs::write(&token, TOKEN).unwrap();

        // System roots do not vouch for this CA: the call fails before any request is
        // sent, and the error says why, for the person on call.
        let untrusting = provider(&quota.url, &token, None);
        match untrusting.reserve(&request("u1"), &Call::default()).await {
            Err(QuotaError::Transport { message, .. }) => {
                assert!(message.contains("certificate"), "{message}");
            }
            other => panic!("expected a certificate error, got {other:?}"),
        }
        assert!(quota.calls("reserve", "u1").is_empty());

        let trusting = provider(&quota.url, &token, Some(pki.ca_cert.clone()));
        let granted = trusting
            .reserve(&request("u1"), &Call::default())
            .await
            .unwrap();
        let Reserve::Granted { id } = granted else {
            panic!("expected a grant, got {granted:?}");
        };
        assert_eq!(quota.live().get("u1"), Some(&id));
        trusting.release("u1", &Call::default()).await.unwrap();
        assert!(quota.live().is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    })
    .await
    .unwrap();
}
