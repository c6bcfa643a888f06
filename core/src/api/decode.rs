//! Decoding a JSON value into a type, with the path of the field that failed
//! (`serde_path_to_error`): serde alone names a missing field but not where a wrong type
//! sits, and a webhook or an `InvalidSpec` condition has to say which field is wrong.

use serde::de::DeserializeOwned;
use serde_json::Value;
use serde_path_to_error::{Path, Segment};

/// A value that did not decode: where (`spec.resources.gpus`, `containers[1].ports`;
/// empty: the value as a whole) and serde's reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeError {
    pub path: String,
    pub message: String,
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

/// Decodes `value` as `T`; on failure, where serde stopped: the field whose value has
/// the wrong type, or the object that misses a required field.
pub fn decode<T: DeserializeOwned>(value: &Value) -> Result<T, DecodeError> {
    serde_path_to_error::deserialize(value).map_err(|e| DecodeError {
        path: render(e.path()),
        message: e.inner().to_string(),
    })
}

/// `spec.containers[0].resources.limits["nvidia.com/gpu"]`: keys that are not plain
/// words are quoted, as the spec validation writes map keys.
fn render(path: &Path) -> String {
    let mut out = String::new();
    for segment in path {
        match segment {
            Segment::Map { key } | Segment::Enum { variant: key }
                if !key.is_empty()
                    && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') =>
            {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(key);
            }
            Segment::Map { key } | Segment::Enum { variant: key } => {
                out.push_str(&format!("[{key:?}]"));
            }
            Segment::Seq { index } => out.push_str(&format!("[{index}]")),
            Segment::Unknown => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push('?');
            }
        }
    }
    out
}

/// `prefix` and `path` joined: `spec.template` and `spec.volumes` give
/// `spec.template.spec.volumes`.
pub fn join(prefix: &str, path: &str) -> String {
    match (prefix.is_empty(), path.is_empty()) {
        (_, true) => prefix.to_owned(),
        (true, false) => path.to_owned(),
        (false, false) if path.starts_with('[') => format!("{prefix}{path}"),
        (false, false) => format!("{prefix}.{path}"),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use k8s_openapi::api::core::v1::PodTemplateSpec;
    use serde::Deserialize;
    use serde_json::json;

    #[derive(Deserialize, Debug)]
    #[allow(dead_code)]
    struct Outer {
        name: String,
        inner: Inner,
        #[serde(default)]
        items: Vec<Item>,
    }
    #[derive(Deserialize, Debug)]
    #[allow(dead_code)]
    struct Inner {
        count: i32,
        #[serde(default)]
        note: Option<String>,
    }
    #[derive(Deserialize, Debug)]
    #[allow(dead_code)]
    struct Item {
        key: String,
        #[serde(default)]
        value: Option<i64>,
    }

    fn error(v: Value) -> DecodeError {
        decode::<Outer>(&v).unwrap_err()
    }

    #[test]
    fn good_values_decode() {
        let v = json!({"name": "x", "inner": {"count": 2}, "items": [{"key": "k"}]});
        let o: Outer = decode(&v).unwrap();
        assert_eq!(o.items.len(), 1);
    }

    #[test]
    fn a_wrong_type_is_reported_at_its_field() {
        let e = error(json!({"name": "x", "inner": {"count": "two"}}));
        assert_eq!(e.path, "inner.count");
        assert!(e.message.contains("invalid type: string \"two\""), "{e}");
        let e = error(
            json!({"name": "x", "inner": {"count": 1}, "items": [{"key": "a"}, {"key": "b", "value": "v"}]}),
        );
        assert_eq!(e.path, "items[1].value");
        let e = error(json!({"name": "x", "inner": 5}));
        assert_eq!(e.path, "inner");
    }

    #[test]
    fn a_missing_field_is_reported_at_its_parent() {
        let e = error(json!({"name": "x", "inner": {"note": "n"}}));
        assert_eq!(e.path, "inner");
        assert!(e.message.contains("missing field `count`"), "{e}");
        let e = error(json!({"name": "x", "inner": {"count": 1}, "items": [{"value": 1}]}));
        assert_eq!(e.path, "items[0]");
        assert!(e.message.contains("missing field `key`"), "{e}");
        let e = error(json!({"inner": {"count": 1}}));
        assert_eq!(e.path, "");
        assert!(e.message.contains("missing field `name`"), "{e}");
    }

    #[test]
    fn pod_template_errors_name_the_field() {
        let t = json!({"spec": {"containers": [{"name": "main", "volumeMounts": [{"name": "data", "mountPath": 7}]}]}});
        let e = decode::<PodTemplateSpec>(&t).unwrap_err();
        assert_eq!(e.path, "spec.containers[0].volumeMounts[0].mountPath");
        let t = json!({"metadata": {"labels": {"app.kubernetes.io/name": 3}}});
        let e = decode::<PodTemplateSpec>(&t).unwrap_err();
        assert_eq!(e.path, "metadata.labels[\"app.kubernetes.io/name\"]");
        assert_eq!(
            join("spec.template", &e.path),
            "spec.template.metadata.labels[\"app.kubernetes.io/name\"]"
        );
    }
}
