//! Pure: what the CRD schema cannot express. A GpuJob that fails here gets no Job; its
//! Ready condition says `InvalidSpec` and names the field, and nothing is retried until
//! the spec changes. What only v2 says (the pod template, the GPU product, the
//! backoff) is checked in `v2.rs`.

mod v2;

use std::collections::BTreeSet;

use crate::api::convert::deadline_seconds;
use crate::api::duration::ceil_seconds;
use crate::api::{GpuJobSpec, MAX_NODES, MULTI_NODE_ENV};

/// The service account a GpuJob's pods run as when `serviceAccountName` is not set.
pub const DEFAULT_SERVICE_ACCOUNT: &str = "default";

/// The service accounts a GpuJob's Jobs may run as (`--allowed-service-accounts`).
/// The operator creates the Jobs with its own rights, so without this list anyone who
/// may create a GpuJob could run pods as any service account of that namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServiceAccounts {
    /// Any (`*`).
    All,
    /// Only these names.
    Only(BTreeSet<String>),
}

impl ServiceAccounts {
    /// From the flag's values: `*` allows every service account; otherwise each value
    /// must be a service account name.
    pub fn parse<S: AsRef<str>>(values: &[S]) -> Result<ServiceAccounts, String> {
        if values.iter().any(|v| v.as_ref() == "*") {
            if values.len() > 1 {
                return Err(
                    "--allowed-service-accounts: `*` allows every service account; list no names beside it".to_owned(),
                );
            }
            return Ok(ServiceAccounts::All);
        }
        let mut names = BTreeSet::new();
        for v in values {
            let v = v.as_ref();
            if !is_dns_subdomain(v) {
                return Err(format!(
                    "--allowed-service-accounts: {v:?} is not a service account name (lowercase DNS subdomain) or `*`"
                ));
            }
            names.insert(v.to_owned());
        }
        if names.is_empty() {
            return Err(
                "--allowed-service-accounts: name at least one service account, or `*`".to_owned(),
            );
        }
        Ok(ServiceAccounts::Only(names))
    }

    fn allows(&self, name: &str) -> bool {
        match self {
            ServiceAccounts::All => true,
            ServiceAccounts::Only(names) => names.contains(name),
        }
    }
}

impl Default for ServiceAccounts {
    /// Only `default`, the account pods of the namespace run as anyway.
    fn default() -> ServiceAccounts {
        ServiceAccounts::Only(BTreeSet::from([DEFAULT_SERVICE_ACCOUNT.to_owned()]))
    }
}

/// The operator's limits on what a spec may ask for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecLimits {
    /// Most GPUs one GpuJob may request.
    pub max_gpus: i32,
    /// The service accounts its Jobs may run as.
    pub service_accounts: ServiceAccounts,
}

impl Default for SpecLimits {
    fn default() -> SpecLimits {
        SpecLimits {
            max_gpus: 64,
            service_accounts: ServiceAccounts::default(),
        }
    }
}

/// A problem with one field of the spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    pub field: String,
    pub message: String,
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

fn err(field: impl Into<String>, message: impl Into<String>) -> Result<(), FieldError> {
    Err(FieldError {
        field: field.into(),
        message: message.into(),
    })
}

/// Checks the spec against the schema's gaps and the operator's `limits`.
pub fn validate(spec: &GpuJobSpec, limits: &SpecLimits) -> Result<(), FieldError> {
    let max_gpus = limits.max_gpus;
    image_reference(&spec.image).or_else(|m| err("spec.image", m))?;
    let nodes = spec.nodes();
    if !(1..=MAX_NODES).contains(&nodes) {
        return err(
            "spec.nodes",
            format!("{nodes}: from 1 to {MAX_NODES} nodes"),
        );
    }
    if spec.total_gpus() > max_gpus {
        let asked = if nodes > 1 {
            format!(
                "{} GPUs requested ({} on each of {nodes} nodes)",
                spec.total_gpus(),
                spec.gpus
            )
        } else {
            format!("{} GPUs requested", spec.gpus)
        };
        let field = if spec.devices().is_some() {
            "spec.resources.devices"
        } else {
            "spec.gpus"
        };
        return err(
            field,
            format!("{asked}; this operator allows at most {max_gpus} per GpuJob"),
        );
    }
    for (i, e) in spec.env.iter().enumerate() {
        multi_node_env(spec, &e.name).or_else(|m| err(format!("spec.env[{i}].name"), m))?;
        if !is_env_var_name(&e.name) {
            return err(
                format!("spec.env[{i}].name"),
                format!(
                    "{:?} is not a valid environment variable name (letters, digits, '_', '-', '.'; not starting with a digit)",
                    e.name
                ),
            );
        }
    }
    for (k, v) in &spec.node_selector {
        if let Err(m) = label_key(k) {
            return err(format!("spec.nodeSelector[{k:?}]"), format!("key {m}"));
        }
        if let Err(m) = label_value(v) {
            return err(
                format!("spec.nodeSelector[{k:?}]"),
                format!("value {v:?} {m}"),
            );
        }
    }
    if let Some(sa) = &spec.service_account_name
        && !is_dns_subdomain(sa)
    {
        return err(
            "spec.serviceAccountName",
            format!("{sa:?} is not a valid name (lowercase DNS subdomain)"),
        );
    }
    let sa = spec
        .service_account_name
        .as_deref()
        .unwrap_or(DEFAULT_SERVICE_ACCOUNT);
    if !limits.service_accounts.allows(sa) {
        let allowed = match &limits.service_accounts {
            ServiceAccounts::All => String::new(),
            ServiceAccounts::Only(names) => names.iter().cloned().collect::<Vec<_>>().join(", "),
        };
        return err(
            "spec.serviceAccountName",
            format!(
                "service account {sa:?} is not allowed; this operator runs GpuJobs only as: {allowed} (--allowed-service-accounts)"
            ),
        );
    }
    deadline(spec)?;
    v2::v2_only(spec)
}

/// An env var `name` a spec may not set itself: with `spec.nodes` > 1 the operator sets
/// the ranks' env on the main container.
fn multi_node_env(spec: &GpuJobSpec, name: &str) -> Result<(), String> {
    if spec.nodes() > 1 && MULTI_NODE_ENV.contains(&name) {
        return Err(format!(
            "{name:?} is the operator's with spec.nodes > 1 (it sets {})",
            MULTI_NODE_ENV.join(", ")
        ));
    }
    Ok(())
}

/// Longest host name: a DNS label.
pub const MAX_HOST_NAME: usize = 63;

/// How many decimal digits `n` has (at least one).
fn digits(n: i64) -> usize {
    n.unsigned_abs()
        .checked_ilog10()
        .map_or(1, |d| d as usize + 1)
}

/// The longest host name of attempt `attempt`'s pods when `nodes` > 1 (`None` for one
/// node, which needs none): the Job controller names each pod's host `<job>-<index>`,
/// the Job being `<name>-<attempt>` ([`crate::job::job_name`], shortened with a hash
/// past 63 characters).
pub fn host_name_len(name: &str, attempt: i32, nodes: i32) -> Option<usize> {
    (nodes > 1)
        .then(|| crate::job::job_name(name, attempt).len() + 1 + digits(i64::from(nodes) - 1))
}

/// What `spec.nodes` > 1 asks of the GpuJob's name (which the schema cannot check: it
/// depends on the spec): it becomes a Service name (a DNS-1035 label: starts with a
/// letter, no dots) and part of each pod's host name, which must fit in 63 characters
/// for every attempt the retry policy counts (`maxRetries` + 1; the plan checks each
/// further attempt, after disruptions or a rerun, before it starts it).
pub fn multi_node_name(name: &str, spec: &GpuJobSpec) -> Result<(), FieldError> {
    let nodes = spec.nodes();
    if nodes <= 1 {
        return Ok(());
    }
    let starts_with_letter = name.starts_with(|c: char| c.is_ascii_lowercase());
    if !is_dns_label(name) || !starts_with_letter {
        return err(
            "metadata.name",
            format!(
                "{name:?}: with spec.nodes {nodes} the name must start with a letter and have no dots (it names the attempt's Service and the pods' host names)"
            ),
        );
    }
    let last = spec.max_retries.max(0).saturating_add(1);
    let longest = host_name_len(name, last, nodes).unwrap_or_default();
    if longest > MAX_HOST_NAME {
        // `<name>-<attempt>-<index>`.
        let room = MAX_HOST_NAME
            .saturating_sub(2 + digits(i64::from(last)) + digits(i64::from(nodes) - 1));
        return err(
            "metadata.name",
            format!(
                "{name:?}: with spec.nodes {nodes} and maxRetries {}, attempt {last}'s pod host names ({}-<index>) would have {longest} characters, more than {MAX_HOST_NAME}: use a name of at most {room} characters",
                spec.max_retries,
                crate::job::job_name(name, last),
            ),
        );
    }
    Ok(())
}

/// The attempt deadline: v2's `attemptDeadline` when it is what `activeDeadlineSeconds`
/// was converted from (a stale spelling, left behind by a v1 client that changed the
/// seconds, is not the deadline and is ignored), else the seconds.
fn deadline(spec: &GpuJobSpec) -> Result<(), FieldError> {
    let seconds = spec.active_deadline_seconds;
    let text = spec
        .v2
        .as_ref()
        .and_then(|v2| v2.attempt_deadline.as_deref())
        .filter(|t| deadline_seconds(t) == seconds);
    if let Some(Err(m)) = text.map(ceil_seconds) {
        return err("spec.attemptDeadline", m);
    }
    match (seconds, text) {
        (Some(s), Some(t)) if s < 1 => err(
            "spec.attemptDeadline",
            format!("{t:?} is not more than zero"),
        ),
        (Some(s), None) if s < 1 => err(
            "spec.attemptDeadline",
            format!("must be more than zero (activeDeadlineSeconds: {s})"),
        ),
        _ => Ok(()),
    }
}

/// A container image reference: `[host[:port]/]path[:tag][@digest]`, as the
/// distribution reference grammar defines it.
pub fn image_reference(image: &str) -> Result<(), String> {
    if image.trim() != image || image.is_empty() {
        return Err(format!(
            "{image:?} has leading or trailing whitespace or is empty"
        ));
    }
    let (rest, digest) = match image.split_once('@') {
        Some((r, d)) => (r, Some(d)),
        None => (image, None),
    };
    if let Some(d) = digest {
        let Some((algo, hex)) = d.split_once(':') else {
            return Err(format!("digest {d:?} must be <algorithm>:<hex>"));
        };
        let hex_ok = !hex.is_empty()
            && hex
                .chars()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase());
        if algo != "sha256" && algo != "sha512" || !hex_ok || (algo == "sha256" && hex.len() != 64)
        {
            return Err(format!("digest {d:?} is not a valid sha256/sha512 digest"));
        }
    }
    // The tag is after the last ':' that follows the last '/' (a ':' before it is a port).
    let last_slash = rest.rfind('/').map_or(0, |i| i + 1);
    let (name, tag) = match rest[last_slash..].rfind(':') {
        Some(i) => (&rest[..last_slash + i], Some(&rest[last_slash + i + 1..])),
        None => (rest, None),
    };
    if let Some(tag) = tag {
        let ok = !tag.is_empty()
            && tag.len() <= 128
            && tag
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
            && tag
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c));
        if !ok {
            return Err(format!(
                "tag {tag:?} is not valid (up to 128 of [A-Za-z0-9_.-], not starting with '.' or '-')"
            ));
        }
    }
    if name.is_empty() || name.len() > 255 {
        return Err(format!("{image:?} has no repository name"));
    }
    let mut parts: Vec<&str> = name.split('/').collect();
    // A first part with '.' or ':' or "localhost" is a registry host.
    if parts.len() > 1
        && (parts[0].contains('.') || parts[0].contains(':') || parts[0] == "localhost")
    {
        let host = parts.remove(0);
        let (h, port) = match host.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (host, None),
        };
        let host_ok = !h.is_empty()
            && h.split('.').all(|l| {
                !l.is_empty()
                    && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
                    && !l.starts_with('-')
                    && !l.ends_with('-')
            });
        if !host_ok || port.is_some_and(|p| p.is_empty() || !p.chars().all(|c| c.is_ascii_digit()))
        {
            return Err(format!("registry {host:?} is not a valid host[:port]"));
        }
    }
    for part in parts {
        if !path_component(part) {
            return Err(format!(
                "repository path component {part:?} is not valid (lowercase letters and digits, separated by '.', '_', '__' or '-')"
            ));
        }
    }
    Ok(())
}

fn path_component(s: &str) -> bool {
    let bytes = s.as_bytes();
    if bytes.is_empty() || !is_lower_alnum(bytes[0]) || !is_lower_alnum(bytes[bytes.len() - 1]) {
        return false;
    }
    // Separators: '.', '_', '__', or one or more '-'; never two separators in a row otherwise.
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        if is_lower_alnum(c) {
            i += 1;
            continue;
        }
        match c {
            b'.' => i += 1,
            b'_' => {
                i += if bytes.get(i + 1) == Some(&b'_') {
                    2
                } else {
                    1
                }
            }
            b'-' => {
                while bytes.get(i) == Some(&b'-') {
                    i += 1;
                }
            }
            _ => return false,
        }
        if !bytes.get(i).is_some_and(|c| is_lower_alnum(*c)) {
            return false;
        }
    }
    true
}

fn is_lower_alnum(c: u8) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit()
}

/// Kubernetes' IsEnvVarName: `[-._a-zA-Z][-._a-zA-Z0-9]*`.
pub fn is_env_var_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || "-._".contains(c))
        && chars.all(|c| c.is_ascii_alphanumeric() || "-._".contains(c))
}

fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_dns_label)
}

fn label_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || b"-_.".contains(c))
}

fn label_key(k: &str) -> Result<(), String> {
    let (prefix, name) = match k.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, k),
    };
    if let Some(p) = prefix
        && !is_dns_subdomain(p)
    {
        return Err(format!(
            "{k:?} has an invalid prefix (a DNS subdomain before '/')"
        ));
    }
    if !label_name(name) {
        return Err(format!(
            "{k:?} is not a valid label key (up to 63 of [A-Za-z0-9-_.], alphanumeric at both ends)"
        ));
    }
    Ok(())
}

fn label_value(v: &str) -> Result<(), String> {
    if v.is_empty() || label_name(v) {
        Ok(())
    } else {
        Err(
            "is not a valid label value (up to 63 of [A-Za-z0-9-_.], alphanumeric at both ends)"
                .to_owned(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{EnvVar, LABEL_GPU_PRODUCT};

    fn spec() -> GpuJobSpec {
        serde_json::from_value(
            serde_json::json!({"image": "registry.example.com:5000/ml/train:1.4", "gpus": 2}),
        )
        .unwrap()
    }

    fn limits(max_gpus: i32) -> SpecLimits {
        SpecLimits {
            max_gpus,
            ..SpecLimits::default()
        }
    }

    #[test]
    fn only_allowed_service_accounts_run() {
        let with_sa = |sa: Option<&str>| GpuJobSpec {
            service_account_name: sa.map(str::to_owned),
            ..spec()
        };
        // Default: only `default`, named or implied.
        let only_default = SpecLimits::default();
        assert_eq!(validate(&with_sa(None), &only_default), Ok(()));
        assert_eq!(validate(&with_sa(Some("default")), &only_default), Ok(()));
        let e = validate(&with_sa(Some("trainer")), &only_default).unwrap_err();
        assert_eq!(e.field, "spec.serviceAccountName");
        assert!(e.message.contains("\"trainer\" is not allowed"), "{e}");
        assert!(e.message.contains("only as: default"), "{e}");

        let trainer = SpecLimits {
            service_accounts: ServiceAccounts::parse(&["trainer"]).unwrap(),
            ..SpecLimits::default()
        };
        assert_eq!(validate(&with_sa(Some("trainer")), &trainer), Ok(()));
        let e = validate(&with_sa(None), &trainer).unwrap_err();
        assert!(e.message.contains("\"default\" is not allowed"), "{e}");

        let all = SpecLimits {
            service_accounts: ServiceAccounts::parse(&["*"]).unwrap(),
            ..SpecLimits::default()
        };
        assert_eq!(validate(&with_sa(Some("anything")), &all), Ok(()));
        // An invalid name is reported as such, even where every account is allowed.
        assert!(
            validate(&with_sa(Some("Trainer")), &all)
                .unwrap_err()
                .message
                .contains("not a valid name")
        );
    }

    #[test]
    fn allowed_service_accounts_parse() {
        assert_eq!(ServiceAccounts::parse(&["*"]), Ok(ServiceAccounts::All));
        assert_eq!(
            ServiceAccounts::parse(&["b", "a", "b"]),
            Ok(ServiceAccounts::Only(
                ["a".to_owned(), "b".to_owned()].into()
            ))
        );
        assert!(ServiceAccounts::parse(&["*", "a"]).is_err());
        assert!(ServiceAccounts::parse(&["Not Valid"]).is_err());
        assert!(ServiceAccounts::parse::<&str>(&[]).is_err());
    }

    #[test]
    fn good_image_references_pass() {
        for image in [
            "busybox",
            "library/busybox:1.36",
            "registry.example.com/ml/train:1.4",
            "registry.example.com:5000/ml/train",
            "localhost/dev/img:latest",
            "ghcr.io/org/my_img__x-y.z:v1.0.0-rc_1",
            "nvcr.io/nvidia/pytorch@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
            "img:tag@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
        ] {
            assert_eq!(image_reference(image), Ok(()), "{image}");
        }
    }

    #[test]
    fn bad_image_references_say_why() {
        for (image, why) in [
            ("Registry.Example.com/ML/Train", "path component"),
            ("train:", "tag"),
            ("train:-bad", "tag"),
            ("train@sha256:xyz", "digest"),
            ("my image", "path component"),
            (" train", "whitespace"),
            ("ml//train", "path component"),
            ("ml/train-", "path component"),
            ("bad_host:port/x", "registry"),
            ("registry.example.com:abc/x", "registry"),
        ] {
            let e = image_reference(image).unwrap_err();
            assert!(e.contains(why), "{image}: {e}");
        }
    }

    #[test]
    fn spec_errors_name_the_field() {
        assert_eq!(validate(&spec(), &limits(8)), Ok(()));
        let mut s = spec();
        s.image = "Bad/Image".into();
        assert_eq!(validate(&s, &limits(8)).unwrap_err().field, "spec.image");
        let mut s = spec();
        s.gpus = 16;
        let e = validate(&s, &limits(8)).unwrap_err();
        assert_eq!(e.field, "spec.gpus");
        assert!(e.message.contains("at most 8"));
        let mut s = spec();
        s.env = vec![
            EnvVar {
                name: "OK".into(),
                value: String::new(),
            },
            EnvVar {
                name: "1BAD NAME".into(),
                value: String::new(),
            },
        ];
        assert_eq!(
            validate(&s, &limits(8)).unwrap_err().field,
            "spec.env[1].name"
        );
        let mut s = spec();
        s.node_selector.insert("not a key!".into(), "x".into());
        assert!(
            validate(&s, &limits(8))
                .unwrap_err()
                .field
                .starts_with("spec.nodeSelector")
        );
        let mut s = spec();
        s.node_selector
            .insert("gpu.example.com/model".into(), "a100 80g".into());
        assert!(
            validate(&s, &limits(8))
                .unwrap_err()
                .message
                .contains("value")
        );
        let mut s = spec();
        s.service_account_name = Some("Trainer".into());
        assert_eq!(
            validate(&s, &limits(8)).unwrap_err().field,
            "spec.serviceAccountName"
        );
    }

    fn v2_spec(v2: serde_json::Value) -> GpuJobSpec {
        let mut s = spec();
        s.v2 = Some(serde_json::from_value(v2).unwrap());
        s
    }

    fn field_error(s: &GpuJobSpec) -> FieldError {
        validate(s, &limits(8)).unwrap_err()
    }

    #[test]
    fn devices_are_checked_where_the_schema_cannot_and_gpus_must_hold_their_count() {
        use serde_json::json;
        let alt = |name: &str, count: i32| json!({"name": name, "deviceClassName": "gpu.example.com", "count": count});
        // spec() asks for 2 GPUs: the largest count must be 2.
        let ok = v2_spec(json!({"devices": {"firstAvailable": [alt("h200", 1), alt("h100", 2)]}}));
        assert_eq!(validate(&ok, &limits(8)), Ok(()));
        let e = field_error(&v2_spec(
            json!({"devices": {"firstAvailable": [alt("h200", 1), alt("h100", 4)]}}),
        ));
        assert_eq!(e.field, "spec.gpus");
        assert!(e.message.contains("largest count is 4"), "{e}");
        let e = field_error(&v2_spec(
            json!({"devices": {"firstAvailable": [alt("h100", 2), alt("h100", 1)]}}),
        ));
        assert_eq!(e.field, "spec.resources.devices.firstAvailable[1].name");
        let e = field_error(&v2_spec(json!({"devices": {
            "exactly": {"deviceClassName": "gpu.example.com", "count": 2},
            "firstAvailable": [alt("h100", 2)]}})));
        assert_eq!(e.field, "spec.resources.devices");
        let e = field_error(&v2_spec(json!({"devices": {"exactly": {
            "deviceClassName": "Not_A_Class", "count": 2}}})));
        assert_eq!(e.field, "spec.resources.devices.exactly.deviceClassName");
        let e = field_error(&v2_spec(json!({"devices": {"exactly": {
            "deviceClassName": "gpu.example.com", "count": 2,
            "selectors": [{"cel": {"expression": " "}}]}}})));
        assert_eq!(
            e.field,
            "spec.resources.devices.exactly.selectors[0].cel.expression"
        );
        let e = field_error(&v2_spec(json!({"gpuProduct": "NVIDIA-H100",
            "devices": {"exactly": {"deviceClassName": "gpu.example.com", "count": 2}}})));
        assert_eq!(e.field, "spec.resources.product");
        let e = field_error(&v2_spec(json!({
            "devices": {"exactly": {"deviceClassName": "gpu.example.com", "count": 2}},
            "template": {"spec": {"resourceClaims": [{"name": "gpus", "resourceClaimName": "x"}]}}})));
        assert_eq!(e.field, "spec.template.spec.resourceClaims[0].name");
        // Past --max-gpus: the devices are named.
        let mut big = v2_spec(json!({"devices": {"exactly": {
            "deviceClassName": "gpu.example.com", "count": 2}}, "nodes": 8}));
        big.gpus = 2;
        assert_eq!(field_error(&big).field, "spec.resources.devices");
    }

    #[test]
    fn a_multi_node_spec_keeps_the_operators_part_and_a_usable_name() {
        let multi = |v2: serde_json::Value| {
            let mut v2 = v2;
            v2["nodes"] = serde_json::json!(2);
            v2_spec(v2)
        };
        let s = multi(serde_json::json!({}));
        assert_eq!(validate(&s, &limits(8)), Ok(()));
        assert_eq!(multi_node_name("train-gpt", &s), Ok(()));
        for bad in ["train.v2", "7b-train"] {
            let e = multi_node_name(bad, &s).unwrap_err();
            assert_eq!(e.field, "metadata.name", "{bad}");
            assert!(e.message.contains("start with a letter"), "{e}");
        }
        // Host names `<name>-<attempt>-<index>` count the digits there are: maxRetries 3
        // (attempt 4) and 2 nodes (index 1) leave 59 characters for the name.
        assert_eq!(s.max_retries, 3);
        assert_eq!(multi_node_name(&"a".repeat(59), &s), Ok(()));
        let e = multi_node_name(&"a".repeat(60), &s).unwrap_err();
        assert!(e.message.contains("at most 59 characters"), "{e}");
        let mut many = s.clone();
        many.max_retries = 99_999;
        let e = multi_node_name(&"a".repeat(59), &many).unwrap_err();
        assert!(e.message.contains("attempt 100000"), "{e}");
        assert!(e.message.contains("at most 54 characters"), "{e}");
        assert_eq!(multi_node_name(&"a".repeat(54), &many), Ok(()));
        assert_eq!(host_name_len("train", 100_000, 2), Some(14));
        assert_eq!(host_name_len("train", 1, 1), None);
        assert_eq!(digits(0), 1);
        assert_eq!(digits(9), 1);
        assert_eq!(digits(10), 2);
        assert_eq!(digits(i64::from(i32::MAX)), 10);
        // One node: any GpuJob name will do, as before.
        assert_eq!(multi_node_name("train.v2", &spec()), Ok(()));

        let mut s = multi(serde_json::json!({}));
        s.env = vec![EnvVar {
            name: "MASTER_ADDR".into(),
            value: "x".into(),
        }];
        let e = field_error(&s);
        assert_eq!(e.field, "spec.env[0].name");
        assert!(e.message.contains("spec.nodes > 1"), "{e}");
        // With one node they are the user's own.
        let mut one = spec();
        one.env = s.env.clone();
        assert_eq!(validate(&one, &limits(8)), Ok(()));

        let e = field_error(&multi(
            serde_json::json!({"template": {"spec": {"subdomain": "mine"}}}),
        ));
        assert_eq!(e.field, "spec.template.spec.subdomain");
        let e = field_error(&multi(serde_json::json!({"template": {"spec": {
            "containers": [{"name": "main", "env": [{"name": "RANK", "value": "0"}]}]}}})));
        assert_eq!(e.field, "spec.template.spec.containers[0].env[0].name");

        // Per node GPUs count in all against the limit.
        let mut s = multi(serde_json::json!({}));
        s.gpus = 6;
        let e = field_error(&s);
        assert_eq!(e.field, "spec.gpus");
        assert!(
            e.message
                .contains("12 GPUs requested (6 on each of 2 nodes)"),
            "{e}"
        );
        let e = field_error(&v2_spec(serde_json::json!({"nodes": 0})));
        assert_eq!(e.field, "spec.nodes");
    }

    fn template_error(template: serde_json::Value) -> FieldError {
        let mut s = v2_spec(serde_json::json!({"template": template}));
        s.env = vec![EnvVar {
            name: "EPOCHS".into(),
            value: "3".into(),
        }];
        field_error(&s)
    }

    #[test]
    fn a_good_template_and_v2_values_pass() {
        let mut s = v2_spec(serde_json::json!({
            "gpuProduct": "NVIDIA-A100-SXM4-80GB",
            "backoffSeconds": 30,
            "attemptDeadline": "90m",
            "template": {
                "metadata": {"labels": {"team": "ml"}},
                "spec": {
                    "restartPolicy": "Never",
                    "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"},
                    "volumes": [{"name": "data", "emptyDir": {}}],
                    "containers": [{"name": "main", "volumeMounts": [{"name": "data", "mountPath": "/d"}],
                                    "resources": {"requests": {"cpu": "4"}}, "env": [{"name": "X", "value": "1"}]},
                                   {"name": "side", "image": "s", "command": ["run"]}],
                },
            },
        }));
        s.active_deadline_seconds = Some(5400);
        assert_eq!(validate(&s, &limits(8)), Ok(()));
    }

    #[test]
    fn the_template_may_not_set_what_the_operator_owns() {
        use serde_json::json;
        for (template, field, words) in [
            (
                json!({"spec": {"restartPolicy": "OnFailure"}}),
                "spec.template.spec.restartPolicy",
                "the operator sets Never",
            ),
            (
                json!({"spec": {"nodeName": "gpu-node-1"}}),
                "spec.template.spec.nodeName",
                "kubernetes.io/hostname",
            ),
            (
                json!({"spec": {"schedulingGroup": {"podGroupName": "team-gang"}}}),
                "spec.template.spec.schedulingGroup",
                "named after its Job",
            ),
            (
                json!({"spec": {"containers": [{"name": "side", "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}),
                "spec.template.spec.containers[0].resources.limits[\"nvidia.com/gpu\"]",
                "spec.resources.gpus",
            ),
            (
                json!({"spec": {"initContainers": [{"name": "i", "resources": {"requests": {"nvidia.com/gpu": 1}}}]}}),
                "spec.template.spec.initContainers[0].resources.requests[\"nvidia.com/gpu\"]",
                "spec.resources.gpus",
            ),
            (
                json!({"spec": {"containers": [{"name": "side"}, {"name": "main", "image": "other"}]}}),
                "spec.template.spec.containers[1].image",
                "from spec.image",
            ),
            (
                json!({"spec": {"containers": [{"name": "main", "command": ["sh"]}]}}),
                "spec.template.spec.containers[0].command",
                "from spec.command",
            ),
            (
                json!({"spec": {"containers": [{"name": "main", "args": ["-x"]}]}}),
                "spec.template.spec.containers[0].args",
                "from spec.args",
            ),
            (
                json!({"spec": {"containers": [{"name": "main", "env": [{"name": "A"}, {"name": "GPUJOB_ATTEMPT", "value": "1"}]}]}}),
                "spec.template.spec.containers[0].env[1].name",
                "the attempt number",
            ),
            (
                json!({"spec": {"containers": [{"name": "main", "env": [{"name": "EPOCHS", "value": "9"}]}]}}),
                "spec.template.spec.containers[0].env[0].name",
                "set in spec.env",
            ),
            (
                json!({"metadata": {"labels": {"gpujob.dev/attempt": "7"}}}),
                "spec.template.metadata.labels[\"gpujob.dev/attempt\"]",
                "are the operator's",
            ),
            (
                json!({"spec": {"serviceAccountName": "admin"}}),
                "spec.template.spec.serviceAccountName",
                "--allowed-service-accounts",
            ),
            (
                json!({"spec": {"serviceAccount": "admin"}}),
                "spec.template.spec.serviceAccount",
                "--allowed-service-accounts",
            ),
            (
                json!({"spec": {"nodeSelector": {"zone": "b"}}}),
                "spec.template.spec.nodeSelector[\"zone\"]",
                "disagrees with spec.nodeSelector",
            ),
            (
                json!({"spec": {"containers": [{"name": "main", "resources": {"limits": {"memory": ["64Gi"]}}}]}}),
                "spec.template.spec.containers[0].resources.limits.memory",
                "not a pod template: invalid type: sequence",
            ),
            (
                json!({"spec": {"volumes": "data"}}),
                "spec.template.spec.volumes",
                "not a pod template",
            ),
        ] {
            let mut s = v2_spec(json!({"template": template.clone()}));
            s.env = vec![EnvVar {
                name: "EPOCHS".into(),
                value: "3".into(),
            }];
            s.node_selector.insert("zone".into(), "a".into());
            let e = field_error(&s);
            assert_eq!(e.field, field, "{template}: {e}");
            assert!(e.message.contains(words), "{template}: {e}");
        }
        // The operator's own restartPolicy may be said.
        let e = validate(
            &v2_spec(json!({"template": {"spec": {"restartPolicy": "Never"}}})),
            &limits(8),
        );
        assert_eq!(e, Ok(()));
        // The message names the field as the Ready condition will show it.
        let e = template_error(json!({"spec": {"restartPolicy": "Always"}}));
        assert_eq!(
            e.to_string(),
            "spec.template.spec.restartPolicy: \"Always\": the operator sets Never (retries are attempts)"
        );
    }

    #[test]
    fn the_gpu_product_must_agree_with_node_selectors() {
        use serde_json::json;
        let product = "NVIDIA-A100-SXM4-80GB";
        let e = field_error(&v2_spec(json!({"gpuProduct": product,
            "template": {"spec": {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100"}}}})));
        assert_eq!(
            e.field,
            "spec.template.spec.nodeSelector[\"nvidia.com/gpu.product\"]"
        );
        assert!(
            e.message.contains("disagrees with spec.resources.product"),
            "{e}"
        );
        let mut s = v2_spec(json!({"gpuProduct": product}));
        s.node_selector
            .insert(LABEL_GPU_PRODUCT.into(), "NVIDIA-H100".into());
        assert_eq!(
            field_error(&s).field,
            "spec.nodeSelector[\"nvidia.com/gpu.product\"]"
        );
        s.node_selector
            .insert(LABEL_GPU_PRODUCT.into(), product.into());
        assert_eq!(validate(&s, &limits(8)), Ok(()));
        let e = field_error(&v2_spec(json!({"gpuProduct": "A100 80GB"})));
        assert_eq!(e.field, "spec.resources.product");
        assert!(e.message.contains("not a valid label value"), "{e}");
        let e = field_error(&v2_spec(json!({"gpuProduct": ""})));
        assert_eq!(e.field, "spec.resources.product");
    }

    #[test]
    fn backoff_seconds_are_at_least_one() {
        let e = field_error(&v2_spec(serde_json::json!({"backoffSeconds": 0})));
        assert_eq!(e.field, "spec.retryPolicy.backoffSeconds");
        assert_eq!(
            validate(
                &v2_spec(serde_json::json!({"backoffSeconds": 1})),
                &limits(8)
            ),
            Ok(())
        );
    }

    #[test]
    fn the_attempt_deadline_must_parse_and_be_more_than_zero() {
        use serde_json::json;
        // As to_v1 stores v2 values: the seconds, and the spelling when not canonical.
        let stored = |text: &str| {
            crate::api::convert::to_v1(&crate::api::v2::GpuJob::new(
                "t",
                serde_json::from_value(json!({"image": "busybox", "resources": {"gpus": 1},
                "attemptDeadline": text}))
                .unwrap(),
            ))
            .spec
        };
        for text in ["90m", "1h30m", "2.5s", "500ms"] {
            assert_eq!(validate(&stored(text), &limits(8)), Ok(()), "{text}");
        }
        for (text, words) in [
            ("soon", "not a duration"),
            ("0.0s", "\"0.0s\" is not more than zero"),
            ("0s", "must be more than zero"),
            ("-5s", "must be more than zero"),
            ("99999999999999999999999h", "too"),
        ] {
            let e = field_error(&stored(text));
            assert_eq!(e.field, "spec.attemptDeadline", "{text}");
            assert!(e.message.contains(words), "{text}: {e}");
        }
        // A stale spelling (a v1 client changed the seconds since) is not the deadline.
        let mut s = stored("soon");
        s.active_deadline_seconds = Some(100);
        assert_eq!(validate(&s, &limits(8)), Ok(()));
    }

    #[test]
    fn env_names_follow_kubernetes() {
        for ok in ["A", "_x", "x.y-z", "-dash", "MY_VAR_1"] {
            assert!(is_env_var_name(ok), "{ok}");
        }
        for bad in ["", "1X", "A B", "x=y", "ü"] {
            assert!(!is_env_var_name(bad), "{bad}");
        }
    }
}
