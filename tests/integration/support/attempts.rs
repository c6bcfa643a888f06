//! At most one attempt per GpuJob has pods that can run, at every moment: a watch of
//! every pod of every GpuJob (label `gpujob.dev/uid`), in the order the API server
//! committed them. A pod can run ("live" here) from the moment it no longer carries the
//! operator's scheduling gate, or is bound to a node, until it has terminated or is gone
//! (a terminating pod is live: its process may still run; an ungated pod not yet bound
//! is live: the scheduler may place it any moment). After a relist (a kube-apiserver
//! restart, an expired watch) the whole list is judged at once.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use gpujob_operator::api::{LABEL_ATTEMPT, LABEL_NAME, LABEL_UID, SCHEDULING_GATE};
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::Api;
use kube::runtime::watcher;

/// A GpuJob, by namespace and uid (names are reused after a delete).
type Owner = (String, String);

#[derive(Debug, Default)]
struct State {
    /// Live pods: pod uid → (owner, attempt).
    live: BTreeMap<String, (Owner, String)>,
    /// Owner → its GpuJob's name, for reports.
    names: BTreeMap<Owner, String>,
    /// A relist in progress: the live pods it listed so far.
    relist: Option<BTreeMap<String, (Owner, String)>>,
    /// Each time two attempts of one GpuJob had live pods (once per set of attempts).
    overlaps: Vec<String>,
    reported: BTreeSet<(Owner, Vec<String>)>,
    /// Pods seen (bound or not), to show the watch saw anything at all.
    pods_seen: usize,
    /// The most attempts of one GpuJob live at once.
    most: usize,
}

impl State {
    fn judge(&mut self, at: &str) {
        let mut by_owner: BTreeMap<&Owner, BTreeSet<&String>> = BTreeMap::new();
        for (owner, attempt) in self.live.values() {
            by_owner.entry(owner).or_default().insert(attempt);
        }
        for (owner, attempts) in by_owner {
            self.most = self.most.max(attempts.len());
            let set: Vec<String> = attempts.iter().map(|a| (*a).clone()).collect();
            if attempts.len() > 1 && self.reported.insert((owner.clone(), set)) {
                let name = self.names.get(owner).cloned().unwrap_or_default();
                self.overlaps.push(format!(
                    "{}/{name}: attempts {attempts:?} had live pods at once ({at})",
                    owner.0
                ));
            }
        }
    }
}

/// What a pod says: `None` unless it is live.
fn live(pod: &Pod) -> Option<(String, Owner, String, String)> {
    let m = &pod.metadata;
    let labels = m.labels.as_ref()?;
    let spec = pod.spec.as_ref();
    let bound = spec.is_some_and(|s| s.node_name.is_some());
    let gated = spec
        .and_then(|s| s.scheduling_gates.as_ref())
        .is_some_and(|g| g.iter().any(|g| g.name == SCHEDULING_GATE));
    let terminated = matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    );
    if (gated && !bound) || terminated {
        return None;
    }
    Some((
        m.uid.clone()?,
        (m.namespace.clone()?, labels.get(LABEL_UID)?.clone()),
        labels.get(LABEL_NAME).cloned().unwrap_or_default(),
        labels.get(LABEL_ATTEMPT).cloned().unwrap_or_default(),
    ))
}

/// Watches every GpuJob's pods cluster-wide until dropped.
pub struct AttemptWatch {
    state: Arc<Mutex<State>>,
    task: tokio::task::JoinHandle<()>,
}

impl AttemptWatch {
    pub fn start(admin: &Client) -> AttemptWatch {
        let state = Arc::new(Mutex::new(State::default()));
        let api: Api<Pod> = Api::all(admin.clone());
        let config = watcher::Config::default().labels(LABEL_UID);
        let s = state.clone();
        let task = tokio::spawn(async move {
            let mut events = watcher(api, config).boxed();
            while let Some(event) = events.next().await {
                // Errors (kube-apiserver restarting) are retried by the watcher itself,
                // with a relist when it has to.
                let Ok(event) = event else { continue };
                let mut st = s.lock().unwrap();
                let st = &mut *st;
                match event {
                    watcher::Event::Init => st.relist = Some(BTreeMap::new()),
                    watcher::Event::InitApply(p) => {
                        st.pods_seen += 1;
                        if let (Some(relist), Some((uid, owner, name, attempt))) =
                            (st.relist.as_mut(), live(&p))
                        {
                            st.names.insert(owner.clone(), name);
                            relist.insert(uid, (owner, attempt));
                        }
                    }
                    watcher::Event::InitDone => {
                        if let Some(listed) = st.relist.take() {
                            st.live = listed;
                        }
                        st.judge("after a relist");
                    }
                    watcher::Event::Apply(p) => {
                        st.pods_seen += 1;
                        let uid = p.metadata.uid.clone().unwrap_or_default();
                        match live(&p) {
                            Some((uid, owner, name, attempt)) => {
                                st.names.insert(owner.clone(), name);
                                st.live.insert(uid, (owner, attempt));
                            }
                            None => {
                                st.live.remove(&uid);
                            }
                        }
                        let at = format!(
                            "pod {}/{} at resourceVersion {}",
                            p.metadata.namespace.clone().unwrap_or_default(),
                            p.metadata.name.clone().unwrap_or_default(),
                            p.metadata.resource_version.clone().unwrap_or_default()
                        );
                        st.judge(&at);
                    }
                    watcher::Event::Delete(p) => {
                        if let Some(uid) = &p.metadata.uid {
                            st.live.remove(uid);
                        }
                    }
                }
            }
        });
        AttemptWatch { state, task }
    }

    /// Every moment two attempts of one GpuJob had live pods, so far.
    pub fn overlaps(&self) -> Vec<String> {
        self.state.lock().unwrap().overlaps.clone()
    }

    /// Pod events seen so far (a watch that saw nothing proves nothing).
    pub fn pods_seen(&self) -> usize {
        self.state.lock().unwrap().pods_seen
    }

    /// The most attempts of one GpuJob that had live pods at once.
    pub fn most_at_once(&self) -> usize {
        self.state.lock().unwrap().most
    }
}

impl Drop for AttemptWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}
