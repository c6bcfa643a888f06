//! Decoding a JSON value into a type, with the path of the field that failed: serde
//! names a missing field but not where a wrong type sits, and a webhook or an
//! `InvalidSpec` condition has to say which field is wrong.

use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

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

/// One step of a path.
#[derive(Debug, Clone)]
enum Step {
    Key(String),
    Index(usize),
}

/// Decodes `value` as `T`. On failure the error is narrowed to the deepest field whose
/// value fails on its own: each child is tried alone on `skeleton` (a minimal value
/// that decodes, holding the required fields), and a child counts only when it fails
/// differently from an empty node there (which only misses required fields), so a
/// missing field is reported at its parent and a wrong type at itself.
pub fn decode<T: DeserializeOwned>(value: &Value, skeleton: &Value) -> Result<T, DecodeError> {
    let first = match serde_json::from_value::<T>(value.clone()) {
        Ok(t) => return Ok(t),
        Err(e) => e.to_string(),
    };
    let try_alone = |path: &[Step], sub: &Value| -> Option<String> {
        serde_json::from_value::<T>(isolate(skeleton, path, sub))
            .err()
            .map(|e| e.to_string())
    };
    let mut path: Vec<Step> = Vec::new();
    let mut node = value;
    let mut message = first;
    loop {
        let children: Vec<(Step, &Value)> = match node {
            Value::Object(m) => m.iter().map(|(k, v)| (Step::Key(k.clone()), v)).collect(),
            Value::Array(a) => a
                .iter()
                .enumerate()
                .map(|(i, v)| (Step::Index(i), v))
                .collect(),
            _ => Vec::new(),
        };
        let empty = match node {
            Value::Array(_) => Value::Array(Vec::new()),
            _ => Value::Object(Map::new()),
        };
        let baseline = try_alone(&path, &empty);
        let culprit = children.into_iter().find_map(|(step, child)| {
            let mut p = path.clone();
            p.push(step);
            match try_alone(&p, child) {
                Some(m) if Some(&m) != baseline.as_ref() => Some((p, child, m)),
                _ => None,
            }
        });
        match culprit {
            Some((p, child, m)) => {
                path = p;
                node = child;
                message = m;
            }
            None => break,
        }
    }
    Err(DecodeError {
        path: render(&path),
        message,
    })
}

/// `skeleton` with the value at `path` replaced by `sub`: objects on the way keep the
/// skeleton's other keys (its required fields), an array on the way holds only the
/// element on the path.
fn isolate(skeleton: &Value, path: &[Step], sub: &Value) -> Value {
    let Some((step, rest)) = path.split_first() else {
        return sub.clone();
    };
    match step {
        Step::Key(k) => {
            let mut m = match skeleton {
                Value::Object(m) => m.clone(),
                _ => Map::new(),
            };
            let inner = m.get(k).cloned().unwrap_or(Value::Null);
            m.insert(k.clone(), isolate(&inner, rest, sub));
            Value::Object(m)
        }
        Step::Index(_) => Value::Array(vec![isolate(&Value::Null, rest, sub)]),
    }
}

/// `spec.containers[0].resources.limits["nvidia.com/gpu"]`: keys that are not plain
/// words are quoted, as the spec validation writes map keys.
fn render(path: &[Step]) -> String {
    let mut out = String::new();
    for step in path {
        match step {
            Step::Key(k)
                if !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') =>
            {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(k);
            }
            Step::Key(k) => out.push_str(&format!("[{k:?}]")),
            Step::Index(i) => out.push_str(&format!("[{i}]")),
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

    fn skeleton() -> Value {
        json!({"name": "n", "inner": {"count": 1}})
    }

    fn error(v: Value) -> DecodeError {
        decode::<Outer>(&v, &skeleton()).unwrap_err()
    }

    #[test]
    fn good_values_decode() {
        let v = json!({"name": "x", "inner": {"count": 2}, "items": [{"key": "k"}]});
        let o: Outer = decode(&v, &skeleton()).unwrap();
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
        let e = decode::<PodTemplateSpec>(&t, &json!({})).unwrap_err();
        assert_eq!(e.path, "spec.containers[0].volumeMounts[0].mountPath");
        let t = json!({"metadata": {"labels": {"app.kubernetes.io/name": 3}}});
        let e = decode::<PodTemplateSpec>(&t, &json!({})).unwrap_err();
        assert_eq!(e.path, "metadata.labels[\"app.kubernetes.io/name\"]");
        assert_eq!(
            join("spec.template", &e.path),
            "spec.template.metadata.labels[\"app.kubernetes.io/name\"]"
        );
    }
}
