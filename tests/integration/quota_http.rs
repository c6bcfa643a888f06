//! The `http` quota backend as a client of docs/quota-api.md, against the fake service:
//! the bearer token, the per-call timeout and TLS trust. (What the operator does with
//! the answers is in tests/integration/quota.rs.)

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use crate::support;

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
        let Reserve::Granted { id, gpus } = granted else {
            panic!("expected a grant, got {granted:?}");
        };
        assert_eq!(quota.live().get("u1"), Some(&id));
        assert_eq!(
            gpus,
            Some(request("u1").gpus),
            "the grant says what it holds"
        );
        trusting.release("u1", &Call::default()).await.unwrap();
        assert!(quota.live().is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    })
    .await
    .unwrap();
}

/// A token file on a volume that does not answer (here: a FIFO nobody writes to) must
/// not stall the thread the call runs on: on a runtime with a single worker thread, the
/// call still ends, by its own timeout.
#[test]
fn a_token_file_that_blocks_does_not_stall_the_runtime() {
    use nix::fcntl::{OFlag, open};
    use nix::sys::stat::Mode as FileMode;
    use std::io::Write;

    let dir = scratch("fifo");
    let fifo = dir.join("token");
    nix::unistd::mkfifo(&fifo, FileMode::S_IRUSR | FileMode::S_IWUSR).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let path = fifo.clone();
    let caller = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let result = rt.block_on(async {
            let quota = FakeQuota::start().await;
            provider(&quota.url, &path, None)
                .reserve(&request("u1"), &Call::default())
                .await
        });
        // The read may still wait on the blocking pool; do not wait for it.
        rt.shutdown_background();
        let _ = tx.send(result);
    });
    let outcome = rx.recv_timeout(BOUND);
    // Let whatever still waits on the FIFO go (non-blocking: fails if nobody reads).
    if let Ok(fd) = open(
        &fifo,
        OFlag::O_WRONLY | OFlag::O_NONBLOCK,
        FileMode::empty(),
    ) {
        let _ = std::fs::File::from(fd).write_all(TOKEN.as_bytes());
    }
    match outcome {
        Ok(Err(QuotaError::Timeout { op: "reserve", .. })) => {}
        Ok(other) => panic!("expected the call to time out, got {other:?}"),
        Err(_) => panic!("the call never ended: reading the token file stalled the runtime"),
    }
    caller.join().unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn calls_carry_the_fencing_token_and_end_by_the_lease_deadline() {
    tokio::time::timeout(BOUND, async {
        let quota = FakeQuota::start().await;
        let dir = scratch("fence");
        let token = dir.join("token");
        std::fs::write(&token, TOKEN).unwrap();
        let p = provider(&quota.url, &token, None);
        let call = |n: i64| Call {
            token: Some(format!("u1/{n}")),
            deadline: None,
        };

        p.reserve(&request("u1"), &call(4)).await.unwrap();
        assert_eq!(
            quota.calls("reserve", "u1")[0].token.as_deref(),
            Some("u1/4")
        );
        // A later call released it; an earlier call's reserve, landing late, is refused.
        p.release("u1", &call(5)).await.unwrap();
        match p.reserve(&request("u1"), &call(4)).await {
            Err(e @ QuotaError::Fenced { .. }) => {
                assert!(e.to_string().contains("u1/4"), "{e}");
            }
            other => panic!("expected a fenced refusal, got {other:?}"),
        }
        assert!(quota.live().is_empty());

        // A call never outlives the caller's lease deadline (here 100 ms, well inside
        // the 500 ms timeout).
        quota.set_reserve(Mode::Hang);
        let deadline = tokio::time::Instant::now() + Duration::from_millis(100);
        let capped = Call {
            token: Some("u2/6".into()),
            deadline: Some(deadline),
        };
        match p.reserve(&request("u2"), &capped).await {
            Err(QuotaError::Timeout {
                capped: true,
                after,
                ..
            }) => {
                assert!(after <= Duration::from_millis(100), "{after:?}");
            }
            other => panic!("expected a timeout at the lease deadline, got {other:?}"),
        }
        std::fs::remove_dir_all(&dir).unwrap();
    })
    .await
    .unwrap();
}
