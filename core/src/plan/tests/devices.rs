//! GPUs by DRA (`resources.devices`): each attempt's ResourceClaimTemplate exists
//! before any of its pods is let go, and status says which alternative it got.

use super::gate::{LATER, Seen, attempt_one, kinds, made, pod, ungated};
use super::*;
use crate::api::{DeviceAllocation, Devices};
use crate::events::{DEVICES_ALLOCATED, transitions};

fn with_devices(mut g: GpuJob, devices: serde_json::Value) -> GpuJob {
    let devices: Devices = serde_json::from_value(devices).unwrap();
    g.spec.gpus = devices.max_count();
    g.spec.v2 = Some(V2Only {
        devices: Some(devices),
        ..V2Only::default()
    });
    g
}

fn alternatives() -> serde_json::Value {
    json!({"firstAvailable": [
        {"name": "h200", "deviceClassName": "gpu.example.com"},
        {"name": "h100", "deviceClassName": "gpu.example.com", "count": 2},
    ]})
}

#[test]
fn an_attempts_claim_template_is_made_before_its_job() {
    let g = with_devices(gpujob(3), alternatives());
    let p = run(&g, &[], None, T0);
    let names: Vec<&str> = p.actions.iter().map(Action::name).collect();
    let template = names.iter().position(|n| *n == "CreateClaimTemplate");
    let job = names.iter().position(|n| *n == "CreateJob");
    assert!(
        matches!((template, job), (Some(t), Some(j)) if t < j),
        "the template first: {names:?}"
    );
    let Some(Action::CreateClaimTemplate {
        attempt: 1,
        template,
    }) = p
        .actions
        .iter()
        .find(|a| matches!(a, Action::CreateClaimTemplate { .. }))
    else {
        panic!("{:?}", p.actions)
    };
    let name = template.metadata.name.as_deref().unwrap();
    assert!(name.starts_with("train-1-"), "{name}");
    let owner = &template.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str()),
        ("GpuJob", "uid-1")
    );
    // Once the Job exists, its pods are let go with no template made again.
    let g = attempt_one(&g);
    let jobs = [made(&g, 1)];
    let pods = [pod(1, 0)];
    let p = Seen::new(&g, &jobs).cached(&pods).read(&pods).plan(LATER);
    assert_eq!(kinds(&p), vec!["UngatePod"]);
}

#[test]
fn a_foreign_template_under_the_attempts_name_keeps_the_attempt_from_starting() {
    let g = with_devices(gpujob(3), alternatives());
    let message = "ResourceClaimTemplate ns/train-1 exists and is not this GpuJob's".to_owned();
    let p = plan(
        &Observed {
            refused: Some(Refusal {
                attempt: 1,
                reason: CLAIM_TEMPLATE_NAME_CONFLICT,
                message: message.clone(),
            }),
            ..observed(&g, &[], T0)
        },
        &settings(),
    );
    assert_eq!(creates(&p), Vec::<i32>::new(), "{:?}", p.actions);
    assert!(
        !p.actions
            .iter()
            .any(|a| matches!(a, Action::CreateClaimTemplate { .. })),
        "{:?}",
        p.actions
    );
    assert_eq!(ready(&p).1, CLAIM_TEMPLATE_NAME_CONFLICT);
    assert_eq!(p.status.phase, Some(Phase::Pending));
    assert_eq!(p.status.last_error.as_deref(), Some(message.as_str()));
    assert_eq!(p.next, Next::After(settings().name_conflict_retry));
}

#[test]
fn an_attempt_of_nvidia_gpus_makes_no_template() {
    let p = run(&gpujob(3), &[], None, T0);
    assert_eq!(creates(&p), vec![1]);
    assert!(
        !p.actions
            .iter()
            .any(|a| matches!(a, Action::CreateClaimTemplate { .. })),
        "{:?}",
        p.actions
    );
    let g = attempt_one(&gpujob(3));
    let jobs = [made(&g, 1)];
    let pods = [pod(1, 0)];
    let p = Seen::new(&g, &jobs).cached(&pods).read(&pods).plan(LATER);
    assert_eq!(kinds(&p), vec!["UngatePod"]);
}

/// Attempt 1 of a GpuJob with alternatives, its pod placed.
fn placed() -> (GpuJob, [Job; 1], [SeenPod; 1]) {
    let g = attempt_one(&with_devices(gpujob(3), alternatives()));
    let jobs = [made(&g, 1)];
    (g, jobs, [ungated(pod(1, 0))])
}

#[test]
fn once_its_pods_are_placed_the_claims_are_read_once_and_status_says_the_alternative() {
    let (g, jobs, pods) = placed();
    let p = Seen::new(&g, &jobs)
        .cached(&pods)
        .reads(Reads::default())
        .plan(LATER);
    assert_eq!(
        p.actions,
        vec![Action::Read(Read::Devices { attempt: 1 })],
        "the claims are read"
    );

    let reads = having_read(
        Read::Devices { attempt: 1 },
        Found::Devices {
            attempt: 1,
            claims: vec![Some("h100".into())],
        },
    );
    let p = Seen::new(&g, &jobs).cached(&pods).reads(reads).plan(LATER);
    let got = DeviceAllocation {
        attempt: 1,
        alternatives: vec!["h100".into()],
    };
    assert_eq!(p.status.devices.as_ref(), Some(&got));
    let notes = transitions(g.status.as_ref().unwrap(), &p.status);
    let note = notes
        .iter()
        .find(|n| n.reason == DEVICES_ALLOCATED)
        .unwrap();
    assert_eq!(note.note, "attempt 1 got devices h100");

    // Said: not read again.
    let g = with_status(g, &p);
    let p = Seen::new(&g, &jobs)
        .cached(&pods)
        .reads(Reads::default())
        .plan(LATER);
    assert_reads_no_claims(&p);
    assert_eq!(p.status.devices.as_ref(), Some(&got));
}

#[test]
fn claims_are_not_read_before_every_pod_is_placed_nor_said_before_every_one_is_allocated() {
    let g = attempt_one(&nodes_of(with_devices(gpujob(3), alternatives()), 2));
    let jobs = [made(&g, 1)];
    let one_placed = [ungated(pod(1, 0)), pod(1, 1)];
    let p = Seen::new(&g, &jobs)
        .cached(&one_placed)
        .reads(Reads::default())
        .plan(LATER);
    assert_reads_no_claims(&p);

    let both = [ungated(pod(1, 0)), ungated(pod(1, 1))];
    let reads = having_read(
        Read::Devices { attempt: 1 },
        Found::Devices {
            attempt: 1,
            claims: vec![Some("h100".into()), None],
        },
    );
    let p = Seen::new(&g, &jobs).cached(&both).reads(reads).plan(LATER);
    assert_eq!(p.status.devices, None, "one claim is not allocated yet");

    let reads = having_read(
        Read::Devices { attempt: 1 },
        Found::Devices {
            attempt: 1,
            claims: vec![Some("h100".into()), Some("h200".into())],
        },
    );
    let p = Seen::new(&g, &jobs).cached(&both).reads(reads).plan(LATER);
    assert_eq!(
        p.status.devices,
        Some(DeviceAllocation {
            attempt: 1,
            alternatives: vec!["h200".into(), "h100".into()],
        }),
        "each alternative once, in the order of preference"
    );
}

#[test]
fn a_finished_attempts_claims_are_not_read() {
    let (g, _, pods) = placed();
    let done = [job(&g, 1, Some(("Complete", "", "2026-11-30T06:00:01Z")))];
    let p = Seen::new(&g, &done)
        .cached(&pods)
        .reads(Reads::default())
        .plan(LATER);
    assert_reads_no_claims(&p);
}

#[test]
fn an_exact_request_has_no_alternative_to_read() {
    let g = attempt_one(&with_devices(
        gpujob(3),
        json!({"exactly": {"deviceClassName": "gpu.example.com", "count": 2}}),
    ));
    let jobs = [made(&g, 1)];
    let pods = [ungated(pod(1, 0))];
    let p = Seen::new(&g, &jobs)
        .cached(&pods)
        .reads(Reads::default())
        .plan(LATER);
    assert_reads_no_claims(&p);
}

fn nodes_of(mut g: GpuJob, nodes: i32) -> GpuJob {
    g.spec.v2.get_or_insert_with(V2Only::default).nodes = Some(nodes);
    g
}

/// The plan does not read the attempt's ResourceClaims.
fn assert_reads_no_claims(p: &Plan) {
    assert!(
        !p.actions
            .iter()
            .any(|a| matches!(a, Action::Read(Read::Devices { .. }))),
        "{:?}",
        p.actions
    );
}

/// `g` after a plan whose template create a foreign template refused, with quota held.
fn held_by_a_foreign_template(quota: bool) -> GpuJob {
    let mut g = with_devices(gpujob(3), alternatives());
    if quota {
        // The reservation granted and recorded (the plan's checkpoint before any
        // attempt's object), then the template refused.
        g.metadata.finalizers = Some(vec![crate::api::FINALIZER_QUOTA.to_owned()]);
        let p = plan(
            &Observed {
                quota_required: true,
                quota: Some(QuotaAnswer::Reserved {
                    id: "r-1".into(),
                    gpus: 2,
                }),
                ..observed(&g, &[], T0)
            },
            &settings(),
        );
        let recorded = p.actions.iter().find_map(|a| match a {
            Action::RecordStatus(s) => Some(s.as_ref().clone()),
            _ => None,
        });
        g.status = recorded;
        assert!(g.status.as_ref().unwrap().reservation_id.is_some());
    }
    let refused = Refusal {
        attempt: 1,
        reason: CLAIM_TEMPLATE_NAME_CONFLICT,
        message: "taken".into(),
    };
    let p = plan(
        &Observed {
            refused: Some(refused),
            quota_required: quota,
            quota: quota.then(|| QuotaAnswer::Reserved {
                id: "r-1".into(),
                gpus: 2,
            }),
            ..observed(&g, &[], T0)
        },
        &settings(),
    );
    assert_eq!(ready(&p).1, CLAIM_TEMPLATE_NAME_CONFLICT);
    with_status(g, &p)
}

/// The read of the name of `g`'s attempt 1 template.
fn template_read(g: &GpuJob) -> Read {
    let name = crate::claims::template(g, 1)
        .unwrap()
        .metadata
        .name
        .unwrap();
    Read::ClaimTemplate { attempt: 1, name }
}

/// The reads of a reconcile that read that name and found it held by a `foreign`
/// template, or not.
fn template_found(g: &GpuJob, foreign: bool) -> Reads {
    having_read(
        template_read(g),
        Found::ClaimTemplate {
            attempt: 1,
            foreign,
        },
    )
}

#[test]
fn a_template_name_held_is_read_again_before_the_attempt_is_tried() {
    let g = held_by_a_foreign_template(false);
    let at = |reads| {
        plan(
            &Observed {
                reads,
                ..observed(&g, &[], LATER)
            },
            &settings(),
        )
    };
    let p = at(Reads::default());
    assert_eq!(p.actions, vec![Action::Read(template_read(&g))]);

    // Still held: the attempt waits, nothing made.
    let p = at(template_found(&g, true));
    assert!(creates(&p).is_empty(), "{:?}", p.actions);
    assert_eq!(ready(&p).1, CLAIM_TEMPLATE_NAME_CONFLICT);

    // Gone: the template, then the Job.
    let p = at(template_found(&g, false));
    assert_eq!(creates(&p), vec![1], "{:?}", p.actions);
}

#[test]
fn quota_held_while_a_template_name_is_taken_is_released_and_not_asked_again() {
    let g = held_by_a_foreign_template(true);
    assert!(g.status.as_ref().unwrap().reservation_id.is_some());
    let p = plan(
        &Observed {
            reads: template_found(&g, true),
            quota_required: true,
            pods: Some(Vec::new()),
            ..observed(&g, &[], LATER)
        },
        &settings(),
    );
    let kinds = kinds(&p);
    assert!(kinds.contains(&"Release"), "{kinds:?}");
    assert!(!kinds.contains(&"Reserve"), "{kinds:?}");
}

/// The reads of a reconcile that made `read` and found `found`.
fn having_read(read: Read, found: Found) -> Reads {
    let mut reads = Reads::default();
    reads.record(read, &found);
    reads
}
