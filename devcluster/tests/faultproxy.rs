//! The fault proxy in front of a real kube-apiserver: the shared control plane of the
//! test run (or a private one when `DEVCLUSTER_DIR` is unset). Each test works in its own
//! namespace with its own proxy; a "direct" client checks what really happened.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::stream::BoxStream;
use http_body_util::BodyExt;

use devcluster::faultproxy::{Fault, FaultProxy, Faults, INJECTED_MESSAGE, Partition, Rule};
use devcluster::{ControlPlane, Identity};
use http::Method;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, ListParams, PostParams, WatchEvent, WatchParams};
use kube::runtime::watcher;

struct Setup {
    cluster: ControlPlane,
    proxy: FaultProxy,
    /// Admin through the proxy, without kube's default retry of 429/503/504, so every
    /// injected answer reaches the test.
    via: kube::Client,
    /// Admin straight to kube-apiserver.
    direct: kube::Client,
    ns: String,
}

async fn setup(prefix: &str) -> Setup {
    let cluster = ControlPlane::for_tests(&[]).await.expect("control plane");
    let ns = cluster.create_namespace(prefix).await.unwrap();
    let proxy = FaultProxy::start(&cluster).unwrap();
    let mut config = proxy.config(&cluster, Identity::Admin).await.unwrap();
    config.default_retry = false;
    let via = kube::Client::try_from(config).unwrap();
    let direct = cluster.client(Identity::Admin).await.unwrap();
    Setup {
        cluster,
        proxy,
        via,
        direct,
        ns,
    }
}

impl Setup {
    fn via_cms(&self) -> Api<ConfigMap> {
        Api::namespaced(self.via.clone(), &self.ns)
    }

    fn direct_cms(&self) -> Api<ConfigMap> {
        Api::namespaced(self.direct.clone(), &self.ns)
    }

    fn via_namespaces(&self) -> Api<Namespace> {
        Api::all(self.via.clone())
    }

    /// The resourceVersion to watch the namespace's ConfigMaps from.
    /// A watch of the namespace's ConfigMaps through the proxy, from `version`.
    async fn watch_via(
        &self,
        version: &str,
    ) -> BoxStream<'static, kube::Result<WatchEvent<ConfigMap>>> {
        self.via_cms()
            .watch(&watch_params(), version)
            .await
            .unwrap()
            .boxed()
    }

    async fn cms_version(&self) -> String {
        self.direct_cms()
            .list(&ListParams::default())
            .await
            .unwrap()
            .metadata
            .resource_version
            .unwrap()
    }
}

fn cm(name: &str) -> ConfigMap {
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some(name.to_owned());
    cm
}

fn watch_params() -> WatchParams {
    WatchParams::default().timeout(120)
}

fn is_api(e: &kube::Error, code: u16, reason: &str) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == code && s.reason == reason)
}

#[tokio::test]
async fn without_faults_requests_and_watches_pass_through() {
    let s = setup("fp-pass").await;
    let kubeconfig = s.proxy.kubeconfig(&s.cluster, Identity::Admin).unwrap();
    let text = std::fs::read_to_string(&kubeconfig).unwrap();
    assert!(text.contains(&s.proxy.url()), "{text}");
    assert!(
        kubeconfig.starts_with(&s.cluster.info().state_dir),
        "{kubeconfig:?}"
    );

    // A list that needs admin's token: the Authorization header went through.
    let names: Vec<String> = s
        .via_namespaces()
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .collect();
    assert!(names.contains(&s.ns), "{names:?}");

    // A watch streams events as they happen.
    let version = s.cms_version().await;
    let mut events = s.watch_via(&version).await;
    s.via_cms()
        .create(&PostParams::default(), &cm("seen"))
        .await
        .unwrap();
    let seen = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(event) = events.next().await {
            if let WatchEvent::Added(cm) = event.unwrap()
                && cm.metadata.name.as_deref() == Some("seen")
            {
                return;
            }
        }
        panic!("the watch ended without the ConfigMap");
    })
    .await;
    assert!(seen.is_ok(), "no ADDED event through the proxy within 10s");

    // kubectl (Go's client, which offers HTTP/2 in ALPN) works through it too.
    // (Blocking this test's runtime is fine: the proxy runs on its own.)
    let out = std::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args(["get", "configmap", "seen", "-n", &s.ns, "-o", "name"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "kubectl: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "configmap/seen"
    );

    let counts = s.proxy.counts();
    assert!(counts["forwarded"] >= 4, "{counts:?}");
    assert_eq!(counts["forwarded"], counts["requests"], "{counts:?}");
}

#[tokio::test]
async fn an_injected_503_answers_at_once_until_cleared() {
    let s = setup("fp-503").await;
    s.proxy.set(
        Faults::new().rule(
            Rule::new(Fault::Status {
                code: 503,
                retry_after: Some(1),
            })
            .methods([Method::GET]),
        ),
    );
    let forwarded = s.proxy.count("forwarded");

    // The raw answer: code, Retry-After, a Kubernetes Status.
    let req = http::Request::get(format!("/api/v1/namespaces/{}", s.ns))
        .body(kube::client::Body::empty())
        .unwrap();
    let resp = s.via.send(req).await.unwrap();
    assert_eq!(resp.status(), 503);
    assert_eq!(resp.headers()["retry-after"], "1");
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    let status: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(status["kind"], "Status");
    assert_eq!(status["status"], "Failure");
    assert_eq!(status["reason"], "ServiceUnavailable");
    assert_eq!(status["code"], 503);
    assert_eq!(status["message"], INJECTED_MESSAGE);

    // What a typed client makes of it.
    let err = s.via_namespaces().get(&s.ns).await.unwrap_err();
    assert!(is_api(&err, 503, "ServiceUnavailable"), "{err:?}");
    assert_eq!(s.proxy.count("status_503"), 2);
    assert_eq!(s.proxy.count("forwarded"), forwarded, "nothing forwarded");

    // Only GETs match: a create goes through.
    s.via_cms()
        .create(&PostParams::default(), &cm("post-is-fine"))
        .await
        .unwrap();

    // kube's default retry honours Retry-After: a GET started during the fault succeeds
    // once it is cleared.
    let retrying =
        kube::Client::try_from(s.proxy.config(&s.cluster, Identity::Admin).await.unwrap()).unwrap();
    let ns = s.ns.clone();
    let get = tokio::spawn(async move { Api::<Namespace>::all(retrying).get(&ns).await });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!get.is_finished());
    s.proxy.clear();
    let got = tokio::time::timeout(Duration::from_secs(5), get)
        .await
        .expect("the retried GET to finish")
        .unwrap();
    assert_eq!(got.unwrap().metadata.name.as_ref(), Some(&s.ns));
    assert!(s.proxy.count("status_503") >= 3, "{:?}", s.proxy.counts());

    s.via_namespaces().get(&s.ns).await.unwrap();
}

#[tokio::test]
async fn reset_after_loses_the_answer_and_reset_before_the_write() {
    let s = setup("fp-reset").await;
    let post_configmaps = |fault| {
        Faults::new().rule(
            Rule::new(fault)
                .methods([Method::POST])
                .resources(["configmaps"]),
        )
    };

    s.proxy.set(post_configmaps(Fault::ResetAfter));
    let err = s
        .via_cms()
        .create(&PostParams::default(), &cm("written"))
        .await
        .unwrap_err();
    assert!(!matches!(err, kube::Error::Api(_)), "{err:?}");
    assert_eq!(s.proxy.count("reset_after"), 1);
    assert!(
        s.direct_cms().get_opt("written").await.unwrap().is_some(),
        "the write happened although its answer was lost"
    );

    s.proxy.set(post_configmaps(Fault::ResetBefore));
    let forwarded = s.proxy.count("forwarded");
    let err = s
        .via_cms()
        .create(&PostParams::default(), &cm("not-written"))
        .await
        .unwrap_err();
    assert!(!matches!(err, kube::Error::Api(_)), "{err:?}");
    assert_eq!(s.proxy.count("reset_before"), 1);
    assert_eq!(s.proxy.count("forwarded"), forwarded);
    assert!(
        s.direct_cms()
            .get_opt("not-written")
            .await
            .unwrap()
            .is_none(),
        "the write did not happen"
    );

    // Reads are not matched, and the client recovers from the lost connections.
    assert!(s.via_cms().get_opt("written").await.unwrap().is_some());
    s.proxy.clear();
    s.via_cms()
        .create(&PostParams::default(), &cm("after"))
        .await
        .unwrap();
}

#[tokio::test]
async fn gone_fails_a_watch_start_with_410_expired() {
    let s = setup("fp-gone").await;
    s.proxy.set(Faults::new().rule(Rule::new(Fault::Gone)));
    let version = s.cms_version().await;
    let err = match s.via_cms().watch(&watch_params(), &version).await {
        Ok(_) => panic!("the watch started"),
        Err(e) => e,
    };
    assert!(is_api(&err, 410, "Expired"), "{err:?}");
    assert_eq!(s.proxy.count("gone"), 1);
    // Watch faults leave everything else alone.
    s.via_cms().list(&ListParams::default()).await.unwrap();
    assert_eq!(s.proxy.count("gone"), 1);

    // The ERROR-event form, as kube-apiserver's watch cache answers: kube's watcher
    // relists on it.
    s.proxy
        .set(Faults::new().rule(Rule::new(Fault::ExpiredEvent)));
    let mut events = s.watch_via(&version).await;
    match events.next().await {
        Some(Ok(WatchEvent::Error(e))) => assert_eq!((e.code, e.reason.as_str()), (410, "Expired")),
        other => panic!("{other:?}"),
    }
    assert!(events.next().await.is_none());

    s.proxy.reset_counts();
    let mut stream = watcher(s.via_cms(), watcher::Config::default()).boxed();
    let mut inits = 0;
    let relisted = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(event) = stream.next().await {
            if let Ok(watcher::Event::Init) = event {
                inits += 1;
                if inits == 2 {
                    return;
                }
            }
        }
    })
    .await;
    assert!(
        relisted.is_ok(),
        "no relist within 20s: {:?}",
        s.proxy.counts()
    );
    assert!(s.proxy.count("expired_event") >= 1);
}

#[tokio::test]
async fn cut_watch_after_ends_a_watch_within_its_bound() {
    let s = setup("fp-cut").await;
    s.proxy
        .set(Faults::new().seed(3).rule(Rule::new(Fault::CutWatchAfter {
            max: Duration::from_millis(500),
        })));
    let version = s.cms_version().await;
    let started = Instant::now();
    let mut events = s.watch_via(&version).await;
    // The stream is live until the cut.
    s.direct_cms()
        .create(&PostParams::default(), &cm("before-the-cut"))
        .await
        .unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match events.next().await {
                None | Some(Err(_)) => return started.elapsed(),
                Some(Ok(_)) => {}
            }
        }
    })
    .await
    .expect("the watch to end");
    assert!(ended < Duration::from_secs(2), "ended after {ended:?}");
    assert_eq!(s.proxy.count("watch_cut"), 1);
    // Not a watch: untouched.
    s.via_cms().list(&ListParams::default()).await.unwrap();
    assert_eq!(s.proxy.count("watch_cut"), 1);
}

#[tokio::test]
async fn latency_delays_and_hang_holds() {
    let s = setup("fp-latency").await;
    // Warm the connection, so only the injected delay is measured.
    s.via_namespaces().get(&s.ns).await.unwrap();
    s.proxy.set(
        Faults::new().rule(
            Rule::new(Fault::Latency {
                fixed: Duration::from_millis(300),
                jitter: Duration::ZERO,
            })
            .methods([Method::GET]),
        ),
    );
    let started = Instant::now();
    s.via_namespaces().get(&s.ns).await.unwrap();
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(300), "took {took:?}");
    assert_eq!(s.proxy.count("latency"), 1);

    // Latency stacks with the fault that follows it.
    s.proxy.set(
        Faults::new()
            .rule(Rule::new(Fault::Latency {
                fixed: Duration::from_millis(200),
                jitter: Duration::from_millis(100),
            }))
            .rule(Rule::new(Fault::Status {
                code: 500,
                retry_after: None,
            })),
    );
    let started = Instant::now();
    let err = s.via_namespaces().get(&s.ns).await.unwrap_err();
    let took = started.elapsed();
    assert!(is_api(&err, 500, "InternalError"), "{err:?}");
    assert!(took >= Duration::from_millis(200), "took {took:?}");
    assert_eq!(s.proxy.count("status_500"), 1);

    // Hang: no answer, nothing forwarded.
    s.proxy
        .set(Faults::new().rule(Rule::new(Fault::Hang).resources(["namespaces"])));
    let forwarded = s.proxy.count("forwarded");
    let held = tokio::time::timeout(Duration::from_secs(1), s.via_namespaces().get(&s.ns)).await;
    assert!(held.is_err(), "answered: {held:?}");
    assert_eq!(s.proxy.count("hang"), 1);
    assert_eq!(s.proxy.count("forwarded"), forwarded);
    // Other resources still pass.
    s.via_cms().list(&ListParams::default()).await.unwrap();
}

/// Sends a create of `cm` through the proxy in a task of its own, and waits until the
/// proxy's `counter` is one more than before; returns the task.
async fn create_until(
    s: &Setup,
    cm: ConfigMap,
    counter: &'static str,
) -> tokio::task::JoinHandle<kube::Result<ConfigMap>> {
    let api = s.via_cms();
    let want = s.proxy.count(counter) + 1;
    let create = tokio::spawn(async move { api.create(&PostParams::default(), &cm).await });
    s.proxy
        .wait_count(counter, want, Duration::from_secs(30))
        .await
        .unwrap();
    create
}

/// A held write lands when the test lets it go, not before; one sent after the rule is
/// cleared is not held.
#[tokio::test]
async fn hold_lands_a_write_when_released() {
    let s = setup("fp-hold").await;
    s.proxy.set(
        Faults::new().rule(
            Rule::new(Fault::Hold)
                .methods([Method::POST])
                .resources(["configmaps"]),
        ),
    );
    let cm = |name: &str| ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    let create = create_until(&s, cm("held"), "held").await;
    // Reads pass while the write is held, and it has not landed.
    let missing = s.direct_cms().get_opt("held").await.unwrap();
    assert!(missing.is_none(), "landed while held: {missing:?}");
    assert!(!create.is_finished(), "answered while held");
    assert_eq!(s.proxy.count("held_answered"), 0);

    s.proxy.clear();
    s.proxy.release_held();
    let created = tokio::time::timeout(Duration::from_secs(30), create)
        .await
        .expect("the held create to be answered once released")
        .unwrap()
        .unwrap();
    assert_eq!(created.metadata.name.as_deref(), Some("held"));
    assert_eq!(s.proxy.count("held_answered"), 1);
    assert!(s.direct_cms().get_opt("held").await.unwrap().is_some());

    // Cleared: not held.
    tokio::time::timeout(
        Duration::from_secs(30),
        s.via_cms().create(&PostParams::default(), &cm("after")),
    )
    .await
    .expect("a create after the rules were cleared to be answered")
    .unwrap();
    assert_eq!(s.proxy.count("held"), 1, "{:?}", s.proxy.counts());

    // Released while it was still on its way to the hold (a latency first): let go too.
    s.proxy.set(
        Faults::new()
            .rule(
                Rule::new(Fault::Latency {
                    fixed: Duration::from_secs(2),
                    jitter: Duration::ZERO,
                })
                .methods([Method::POST]),
            )
            .rule(Rule::new(Fault::Hold).methods([Method::POST])),
    );
    let create = create_until(&s, cm("on-its-way"), "latency").await;
    s.proxy.clear();
    s.proxy.release_held();
    tokio::time::timeout(Duration::from_secs(30), create)
        .await
        .expect("a create released on its way to the hold to be answered")
        .unwrap()
        .unwrap();
    assert_eq!(
        (s.proxy.count("held"), s.proxy.count("held_answered")),
        (2, 2),
        "{:?}",
        s.proxy.counts()
    );
}

#[tokio::test]
async fn partitions_hold_or_refuse_until_healed() {
    let s = setup("fp-partition").await;
    s.via_namespaces().get(&s.ns).await.unwrap();
    let version = s.cms_version().await;
    let mut events = s.watch_via(&version).await;

    // Hang: requests are held, streams stop.
    s.proxy.set_partition(Some(Partition::Hang));
    let forwarded = s.proxy.count("forwarded");
    let held = tokio::time::timeout(Duration::from_secs(1), s.via_namespaces().get(&s.ns)).await;
    assert!(held.is_err(), "answered during the partition: {held:?}");
    assert!(s.proxy.count("partition_hang") >= 1);
    s.direct_cms()
        .create(&PostParams::default(), &cm("during-the-partition"))
        .await
        .unwrap();
    let event = tokio::time::timeout(Duration::from_secs(1), events.next()).await;
    assert!(event.is_err(), "the watch delivered {event:?}");

    // Heal: what was held is closed, not answered late; new requests work.
    let via = s.via_namespaces();
    let ns = s.ns.clone();
    let hung = s.proxy.count("partition_hang");
    let pending = tokio::spawn(async move { via.get(&ns).await });
    // Healed only once the proxy holds it (a GET that came after would just succeed).
    s.proxy
        .wait_count("partition_hang", hung + 1, Duration::from_secs(30))
        .await
        .unwrap();
    s.proxy.heal();
    let released = tokio::time::timeout(Duration::from_secs(10), pending)
        .await
        .expect("the held GET to be released")
        .unwrap();
    assert!(released.is_err(), "{released:?}");
    let watch_end = tokio::time::timeout(Duration::from_secs(2), async {
        loop {
            match events.next().await {
                None | Some(Err(_)) => return,
                Some(Ok(WatchEvent::Added(cm)))
                    if cm.metadata.name.as_deref() == Some("during-the-partition") =>
                {
                    panic!("a held event was delivered late")
                }
                Some(Ok(_)) => {}
            }
        }
    })
    .await;
    assert!(watch_end.is_ok(), "the held watch was not closed");
    assert_eq!(
        s.proxy.count("forwarded"),
        forwarded,
        "nothing forwarded late"
    );
    s.via_namespaces().get(&s.ns).await.unwrap();

    // Refuse: fails fast, also on the connection already open.
    s.proxy.set_partition(Some(Partition::Refuse));
    // Fast: within a bound no held request meets (a held one is never answered).
    let refused = tokio::time::timeout(Duration::from_secs(5), s.via_namespaces().get(&s.ns))
        .await
        .expect("a refused GET to fail fast");
    assert!(refused.is_err(), "{refused:?}");
    assert!(
        s.proxy.count("partition_refuse") >= 1,
        "{refused:?} {:?}",
        s.proxy.counts()
    );

    s.proxy.heal();
    s.via_namespaces().get(&s.ns).await.unwrap();
}

#[tokio::test]
async fn dropping_the_proxy_closes_its_connections() {
    let s = setup("fp-drop").await;
    let version = s.cms_version().await;
    let mut events = s.watch_via(&version).await;
    let kubeconfig = s.proxy.kubeconfig(&s.cluster, Identity::Admin).unwrap();
    let Setup { proxy, via, ns, .. } = s;
    drop(proxy);
    assert!(!kubeconfig.exists(), "kubeconfig left behind");
    let ended = tokio::time::timeout(Duration::from_secs(2), async {
        while let Some(Ok(_)) = events.next().await {}
    })
    .await;
    assert!(ended.is_ok(), "the watch outlived the proxy");
    let after = tokio::time::timeout(Duration::from_secs(2), Api::<Namespace>::all(via).get(&ns))
        .await
        .expect("a GET to fail fast");
    assert!(after.is_err());
}
