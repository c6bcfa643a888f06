//! Pure, lossless conversion between `gpujob.dev/v1` and `gpujob.dev/v2` (the table is in
//! docs/api-versions.md). v1 is the storage version during the compatibility window: a
//! v2 object is stored as v1, with what v1 cannot say in `spec.v2`.

use serde_json::Value;

use super::decode::{DecodeError, decode};
use super::duration::{ceil_seconds, format_seconds};
use super::{GpuJob, GpuJobSpec, V2Only, v2};

pub const V1: &str = "gpujob.dev/v1";
pub const V2: &str = "gpujob.dev/v2";

/// Why an object could not be converted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConvertError {
    #[error("cannot convert to {0:?}: GpuJobs are served as {V1} and {V2}")]
    UnknownDesiredVersion(String),
    #[error("the object has no apiVersion string")]
    MissingApiVersion,
    #[error("apiVersion {0:?} is not a GpuJob version ({V1} or {V2})")]
    UnknownApiVersion(String),
    #[error("kind {0:?} is not GpuJob")]
    WrongKind(String),
    #[error("the {api_version} object does not decode: {error}")]
    Decode {
        api_version: &'static str,
        error: DecodeError,
    },
    #[error("the converted {api_version} object does not encode: {message}")]
    Encode {
        api_version: &'static str,
        message: String,
    },
}

impl ConvertError {
    /// A stable short label, for logs.
    pub fn metric_label(&self) -> &'static str {
        match self {
            ConvertError::UnknownDesiredVersion(_) => "unknown_desired_version",
            ConvertError::MissingApiVersion => "missing_api_version",
            ConvertError::UnknownApiVersion(_) => "unknown_api_version",
            ConvertError::WrongKind(_) => "wrong_kind",
            ConvertError::Decode { .. } => "decode",
            ConvertError::Encode { .. } => "encode",
        }
    }
}

/// The whole seconds a v2 `attemptDeadline` stands for; `None` when it does not parse
/// (or does not fit), which the operator reports as an invalid spec.
pub fn deadline_seconds(attempt_deadline: &str) -> Option<i64> {
    ceil_seconds(attempt_deadline).ok()
}

/// v1 (as stored) to v2. `spec.v2.attemptDeadline` is used only while it still stands for
/// `activeDeadlineSeconds` (a v1 client may have changed the seconds since); otherwise
/// the deadline is the canonical form of the seconds.
pub fn to_v2(v1: &GpuJob) -> v2::GpuJob {
    let s = &v1.spec;
    let only = s.v2.clone().unwrap_or_default();
    let attempt_deadline = match only.attempt_deadline {
        Some(text) if deadline_seconds(&text) == s.active_deadline_seconds => Some(text),
        _ => s.active_deadline_seconds.map(format_seconds),
    };
    v2::GpuJob {
        metadata: v1.metadata.clone(),
        spec: v2::GpuJobSpec {
            image: s.image.clone(),
            command: s.command.clone(),
            args: s.args.clone(),
            env: s.env.clone(),
            // With devices, v1's `gpus` is only their largest count: v2 has no gpus.
            resources: v2::Resources {
                gpus: only.devices.is_none().then_some(s.gpus),
                devices: only.devices,
                product: only.gpu_product,
            },
            nodes: only.nodes.unwrap_or(1),
            queue_name: only.queue_name,
            topology: only.topology,
            retry_policy: v2::RetryPolicy {
                max_retries: s.max_retries,
                backoff_seconds: only.backoff_seconds,
                failure_rules: only.failure_rules,
            },
            attempt_deadline,
            node_selector: s.node_selector.clone(),
            service_account_name: s.service_account_name.clone(),
            update_policy: s.update_policy,
            suspend: s.suspend,
            ttl_seconds_after_finished: s.ttl_seconds_after_finished,
            template: only.template,
        },
        status: v1.status.clone(),
    }
}

/// v2 to v1 (the storage form). `activeDeadlineSeconds` is the deadline rounded up to
/// whole seconds; the string itself is kept in `spec.v2.attemptDeadline` only when it is
/// not the canonical form of those seconds (`"90s"` is kept, `"1m30s"` is not). A
/// deadline that does not parse leaves `activeDeadlineSeconds` unset and is kept as is.
pub fn to_v1(v2: &v2::GpuJob) -> GpuJob {
    let s = &v2.spec;
    let seconds = s.attempt_deadline.as_deref().and_then(deadline_seconds);
    let attempt_deadline = s
        .attempt_deadline
        .clone()
        .filter(|text| seconds.map(format_seconds).as_ref() != Some(text));
    let only = V2Only {
        template: s.template.clone(),
        gpu_product: s.resources.product.clone(),
        backoff_seconds: s.retry_policy.backoff_seconds,
        attempt_deadline,
        failure_rules: s.retry_policy.failure_rules.clone(),
        nodes: (s.nodes != 1).then_some(s.nodes),
        queue_name: s.queue_name.clone(),
        devices: s.resources.devices.clone(),
        topology: s.topology.clone(),
    };
    // v1 requires `gpus`: with devices it holds the most devices a pod may get (what
    // quota counts); 0 for a spec with neither, which the v2 schema refuses.
    let gpus = s.resources.gpus.unwrap_or_else(|| {
        s.resources
            .devices
            .as_ref()
            .map_or(0, crate::api::Devices::max_count)
    });
    GpuJob {
        metadata: v2.metadata.clone(),
        spec: GpuJobSpec {
            image: s.image.clone(),
            command: s.command.clone(),
            args: s.args.clone(),
            env: s.env.clone(),
            gpus,
            max_retries: s.retry_policy.max_retries,
            active_deadline_seconds: seconds,
            node_selector: s.node_selector.clone(),
            service_account_name: s.service_account_name.clone(),
            update_policy: s.update_policy,
            suspend: s.suspend,
            ttl_seconds_after_finished: s.ttl_seconds_after_finished,
            v2: only.non_empty(),
        },
        status: v2.status.clone(),
    }
}

/// Converts a raw GpuJob (as a conversion webhook receives it) to `desired_api_version`.
/// An object already at that version is returned unchanged.
pub fn convert(object: Value, desired_api_version: &str) -> Result<Value, ConvertError> {
    let desired = version(desired_api_version)
        .ok_or_else(|| ConvertError::UnknownDesiredVersion(desired_api_version.to_owned()))?;
    let found = object
        .get("apiVersion")
        .and_then(Value::as_str)
        .ok_or(ConvertError::MissingApiVersion)?;
    let found = version(found).ok_or_else(|| ConvertError::UnknownApiVersion(found.to_owned()))?;
    match object.get("kind").and_then(Value::as_str) {
        Some("GpuJob") => {}
        other => {
            return Err(ConvertError::WrongKind(
                other.unwrap_or_default().to_owned(),
            ));
        }
    }
    if found == desired {
        return Ok(object);
    }
    let encode = |api_version, r: serde_json::Result<Value>| {
        r.map_err(|e| ConvertError::Encode {
            api_version,
            message: e.to_string(),
        })
    };
    if found == V1 {
        let v1: GpuJob = decode(&object).map_err(|error| ConvertError::Decode {
            api_version: V1,
            error,
        })?;
        encode(V2, serde_json::to_value(to_v2(&v1)))
    } else {
        let v2: v2::GpuJob = decode(&object).map_err(|error| ConvertError::Decode {
            api_version: V2,
            error,
        })?;
        encode(V1, serde_json::to_value(to_v1(&v2)))
    }
}

fn version(api_version: &str) -> Option<&'static str> {
    [V1, V2].into_iter().find(|v| *v == api_version)
}

#[cfg(test)]
mod tests;
