//! Pure: the headless Service through which a multi-node attempt's pods find each other
//! by name. One per attempt, named like its Job (so a pod's name is
//! `<job>-<index>.<job>`, which `MASTER_ADDR` says for rank 0), owned by the Job (the
//! garbage collector deletes it with the Job), selecting that attempt's pods only.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Service, ServiceSpec};

use crate::api::{LABEL_ATTEMPT, LABEL_UID};
use crate::seen_job::SeenJob;

/// The Service of `job`'s attempt; `None` unless it is a multi-node attempt's Job
/// (`SeenJob::nodes`, set only for more than one pod) with a uid and an attempt.
pub fn service(job: &SeenJob) -> Option<Service> {
    job.nodes?;
    let metadata = job.attempt_object_meta()?;
    let selector = BTreeMap::from([
        (LABEL_UID.to_owned(), job.owner_uid.clone()),
        (LABEL_ATTEMPT.to_owned(), job.attempt?.to_string()),
    ]);
    Some(Service {
        metadata,
        spec: Some(ServiceSpec {
            // Headless: DNS names the pods themselves, no virtual IP.
            cluster_ip: Some("None".to_owned()),
            selector: Some(selector),
            // Ranks look each other up while starting, before any is Ready.
            publish_not_ready_addresses: Some(true),
            ..ServiceSpec::default()
        }),
        status: None,
    })
}

/// What a Service name held by a foreign Service says, wherever it is found.
pub fn name_taken(ns: &str, name: &str) -> String {
    format!(
        "Service {ns}/{name} exists and is not this multi-node attempt's (not owned by its Job {name}); its pods would not find each other, so the Job waits, not started; delete or rename that Service"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::V2Only;
    use crate::job::desired_job;

    fn seen(nodes: Option<i32>) -> SeenJob {
        let mut g = crate::job::tests::gpujob("train");
        g.spec.v2 = Some(V2Only {
            nodes,
            ..V2Only::default()
        });
        let mut job = desired_job(&g, 3);
        job.metadata.uid = Some("job-uid".into());
        SeenJob::of(&job).expect("controlled by a GpuJob")
    }

    #[test]
    fn a_multi_node_attempt_gets_a_headless_service_of_its_job() {
        let svc = service(&seen(Some(4))).expect("a multi-node attempt");
        let m = &svc.metadata;
        assert_eq!(m.name.as_deref(), Some("train-3"));
        assert_eq!(m.namespace.as_deref(), Some("team-a"));
        let owner = &m.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()),
            ("Job", "train-3", "job-uid")
        );
        let spec = svc.spec.unwrap();
        assert_eq!(spec.cluster_ip.as_deref(), Some("None"));
        assert_eq!(spec.publish_not_ready_addresses, Some(true));
        let selector = spec.selector.unwrap();
        assert_eq!(selector[LABEL_UID], "uid-1");
        assert_eq!(selector[LABEL_ATTEMPT], "3");
        assert_eq!(selector.len(), 2, "the attempt's pods only: {selector:?}");
    }

    #[test]
    fn a_one_node_attempt_has_none() {
        assert_eq!(service(&seen(None)), None);
        assert_eq!(service(&seen(Some(1))), None);
    }
}
