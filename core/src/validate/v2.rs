//! What only v2 says (v1 `spec.v2`): the GPU product, the backoff and the pod template,
//! which may not take over what the operator sets.

use k8s_openapi::api::core::v1::{Container, PodTemplateSpec, ResourceRequirements};

use super::{
    FieldError, err, is_dns_label, is_dns_subdomain, label_key, label_value, multi_node_env,
};
use crate::api::devices::{MAX_ALTERNATIVES, MAX_EXPRESSION, MAX_SELECTORS};
use crate::api::{DEVICE_REQUEST, DeviceSelector, Devices};
use crate::api::{ENV_ATTEMPT, GPU_RESOURCE, GpuJobSpec, LABEL_GPU_PRODUCT, LABEL_PREFIX};
use crate::job::{CONTAINER_NAME, TEMPLATE_FIELD, pod_template};

/// What only v2 says (v1 `spec.v2`): the GPU product, the backoff and the pod template,
/// which may not take over what the operator sets.
pub(super) fn v2_only(spec: &GpuJobSpec) -> Result<(), FieldError> {
    let Some(v2) = &spec.v2 else { return Ok(()) };
    let product = v2.gpu_product.as_deref();
    if let Some(p) = product {
        if p.is_empty() {
            return err(
                "spec.resources.product",
                "is empty; leave it out for any GPU",
            );
        }
        label_value(p).or_else(|m| err("spec.resources.product", format!("{p:?} {m}")))?;
        if let Some(other) = spec.node_selector.get(LABEL_GPU_PRODUCT)
            && other != p
        {
            return err(
                format!("spec.nodeSelector[{LABEL_GPU_PRODUCT:?}]"),
                format!("{other:?} disagrees with spec.resources.product {p:?}"),
            );
        }
    }
    if let Some(d) = &v2.devices {
        devices(spec, d, product)?;
    }
    if let Some(t) = &v2.topology {
        label_key(&t.level).or_else(|m| {
            err(
                "spec.topology.level",
                format!("{:?} is not a node label key: {m}", t.level),
            )
        })?;
    }
    if let Some(b) = v2.backoff_seconds
        && b < 1
    {
        return err(
            "spec.retryPolicy.backoffSeconds",
            format!("{b} is less than 1 second"),
        );
    }
    let template = match pod_template(spec) {
        Ok(Some(t)) => t,
        Ok(None) => return Ok(()),
        Err(e) => return err(e.path, format!("not a pod template: {}", e.message)),
    };
    template_owned_fields(spec, &template, product)
}

/// `spec.resources.devices`: what the schema checks, for objects stored before it did,
/// and what it cannot (distinct alternative names, v1's `gpus` holding their largest
/// count).
fn devices(spec: &GpuJobSpec, d: &Devices, product: Option<&str>) -> Result<(), FieldError> {
    const AT: &str = "spec.resources.devices";
    if product.is_some() {
        return err(
            "spec.resources.product",
            "product selects nodes for gpus; with devices, select the product in a device selector",
        );
    }
    let kinds: Vec<(String, &str, i32, &[DeviceSelector])> =
        match (&d.exactly, &d.first_available[..]) {
            (Some(e), []) => vec![(
                format!("{AT}.exactly"),
                e.device_class_name.as_str(),
                e.count,
                &e.selectors[..],
            )],
            (None, alternatives) if !alternatives.is_empty() => {
                if alternatives.len() > MAX_ALTERNATIVES {
                    return err(
                        format!("{AT}.firstAvailable"),
                        format!(
                            "{} alternatives; at most {MAX_ALTERNATIVES}",
                            alternatives.len()
                        ),
                    );
                }
                let mut kinds = Vec::new();
                for (i, a) in alternatives.iter().enumerate() {
                    let at = format!("{AT}.firstAvailable[{i}]");
                    if !is_dns_label(&a.name) {
                        return err(
                            format!("{at}.name"),
                            format!("{:?} is not a valid name (lowercase DNS label)", a.name),
                        );
                    }
                    if alternatives[..i].iter().any(|b| b.name == a.name) {
                        return err(format!("{at}.name"), format!("{:?} is named twice", a.name));
                    }
                    kinds.push((at, a.device_class_name.as_str(), a.count, &a.selectors[..]));
                }
                kinds
            }
            _ => return err(AT, "set exactly one of exactly and firstAvailable"),
        };
    for (at, class, count, selectors) in &kinds {
        if !is_dns_subdomain(class) {
            return err(
                format!("{at}.deviceClassName"),
                format!("{class:?} is not a valid DeviceClass name (lowercase DNS subdomain)"),
            );
        }
        if !(1..=64).contains(count) {
            return err(format!("{at}.count"), format!("{count}: from 1 to 64"));
        }
        if selectors.len() > MAX_SELECTORS {
            return err(
                format!("{at}.selectors"),
                format!("{} selectors; at most {MAX_SELECTORS}", selectors.len()),
            );
        }
        for (j, s) in selectors.iter().enumerate() {
            let e = &s.cel.expression;
            if e.trim().is_empty() || e.len() > MAX_EXPRESSION {
                return err(
                    format!("{at}.selectors[{j}].cel.expression"),
                    format!("must be a CEL expression of 1 to {MAX_EXPRESSION} characters"),
                );
            }
        }
    }
    let most = d.max_count();
    if spec.gpus != most {
        return err(
            "spec.gpus",
            format!(
                "{} disagrees with spec.resources.devices, whose largest count is {most}: in gpujob.dev/v1, gpus holds it (write the GpuJob through gpujob.dev/v2)",
                spec.gpus
            ),
        );
    }
    Ok(())
}

/// The operator's part of the pod, which a template may not set.
fn template_owned_fields(
    spec: &GpuJobSpec,
    template: &PodTemplateSpec,
    product: Option<&str>,
) -> Result<(), FieldError> {
    let at = |path: &str| format!("{TEMPLATE_FIELD}.{path}");
    let labels = template.metadata.as_ref().and_then(|m| m.labels.as_ref());
    if let Some(k) = labels
        .into_iter()
        .flatten()
        .map(|(k, _)| k)
        .find(|k| k.starts_with(LABEL_PREFIX))
    {
        return err(
            at(&format!("metadata.labels[{k:?}]")),
            format!("labels under {LABEL_PREFIX} are the operator's"),
        );
    }
    let Some(pod) = &template.spec else {
        return Ok(());
    };
    if spec.nodes() > 1 {
        for (field, set) in [
            ("spec.hostname", pod.hostname.is_some()),
            ("spec.subdomain", pod.subdomain.is_some()),
        ] {
            if set {
                return err(
                    at(field),
                    "the operator sets it with spec.nodes > 1 (the pods' names under the attempt's Service)",
                );
            }
        }
    }
    if let Some(policy) = pod.restart_policy.as_deref().filter(|p| *p != "Never") {
        return err(
            at("spec.restartPolicy"),
            format!("{policy:?}: the operator sets Never (retries are attempts)"),
        );
    }
    if pod.node_name.as_deref().is_some_and(|n| !n.is_empty()) {
        // Kubernetes refuses a pod with both a node and a scheduling gate, only when the
        // pod is created: the Job would be accepted and none of its pods made.
        return err(
            at("spec.nodeName"),
            "a pod bound to a node cannot wait at the operator's scheduling gate; choose the node with spec.nodeSelector (kubernetes.io/hostname)",
        );
    }
    if pod.scheduling_group.is_some() {
        // A multi-node attempt's PodGroup is the operator's, made for each attempt and
        // named after its Job: one name for every attempt would be held by the kept Job
        // of the one before, and the next attempt would wait for as long as it is kept.
        return err(
            at("spec.schedulingGroup"),
            "the operator sets it: a multi-node attempt's pods form a gang named after its Job (--gang-scheduling)",
        );
    }
    if pod.service_account_name.is_some() || pod.service_account.is_some() {
        let field = if pod.service_account_name.is_some() {
            "spec.serviceAccountName"
        } else {
            "spec.serviceAccount"
        };
        return err(
            at(field),
            "the operator sets it from spec.serviceAccountName (checked against --allowed-service-accounts)",
        );
    }
    for (k, v) in pod.node_selector.iter().flatten() {
        let field = at(&format!("spec.nodeSelector[{k:?}]"));
        if k == LABEL_GPU_PRODUCT
            && let Some(p) = product
            && v != p
        {
            return err(
                field,
                format!("{v:?} disagrees with spec.resources.product {p:?}"),
            );
        }
        if let Some(other) = spec.node_selector.get(k)
            && other != v
        {
            return err(
                field,
                format!("{v:?} disagrees with spec.nodeSelector ({other:?})"),
            );
        }
    }
    if spec.devices().is_some()
        && let Some(i) = pod
            .resource_claims
            .iter()
            .flatten()
            .position(|c| c.name == DEVICE_REQUEST)
    {
        return err(
            at(&format!("spec.resourceClaims[{i}].name")),
            format!(
                "{DEVICE_REQUEST:?} is the operator's claim for spec.resources.devices; name yours otherwise"
            ),
        );
    }
    let lists = [
        (
            "containers",
            pod.containers
                .iter()
                .map(|c| c.resources.as_ref())
                .collect::<Vec<Option<&ResourceRequirements>>>(),
        ),
        (
            "initContainers",
            pod.init_containers
                .iter()
                .flatten()
                .map(|c| c.resources.as_ref())
                .collect(),
        ),
        (
            "ephemeralContainers",
            pod.ephemeral_containers
                .iter()
                .flatten()
                .map(|c| c.resources.as_ref())
                .collect(),
        ),
    ];
    for (list, containers) in &lists {
        for (i, r) in containers.iter().enumerate() {
            let Some(r) = r else { continue };
            for (kind, map) in [("requests", &r.requests), ("limits", &r.limits)] {
                if map.as_ref().is_some_and(|m| m.contains_key(GPU_RESOURCE)) {
                    return err(
                        at(&format!(
                            "spec.{list}[{i}].resources.{kind}[{GPU_RESOURCE:?}]"
                        )),
                        "GPUs are requested by spec.resources.gpus",
                    );
                }
            }
        }
    }
    if let Some((i, main)) = pod
        .containers
        .iter()
        .enumerate()
        .find(|(_, c)| c.name == CONTAINER_NAME)
    {
        main_container(spec, &at(&format!("spec.containers[{i}]")), main)?;
    }
    Ok(())
}

/// The template's entry for the operator's container adds to it, but its image, command,
/// args and attempt number are the operator's.
fn main_container(spec: &GpuJobSpec, field: &str, c: &Container) -> Result<(), FieldError> {
    for (name, set, from) in [
        ("image", c.image.is_some(), "spec.image"),
        ("command", c.command.is_some(), "spec.command"),
        ("args", c.args.is_some(), "spec.args"),
    ] {
        if set {
            return err(
                format!("{field}.{name}"),
                format!("the operator sets the {CONTAINER_NAME} container's {name} from {from}"),
            );
        }
    }
    for (j, e) in c.env.iter().flatten().enumerate() {
        let at = format!("{field}.env[{j}].name");
        if e.name == ENV_ATTEMPT {
            return err(
                at,
                format!("{ENV_ATTEMPT} is the operator's: the attempt number"),
            );
        }
        multi_node_env(spec, &e.name).or_else(|m| err(at.clone(), m))?;
        if spec.env.iter().any(|s| s.name == e.name) {
            return err(at, format!("{:?} is set in spec.env already", e.name));
        }
    }
    Ok(())
}
