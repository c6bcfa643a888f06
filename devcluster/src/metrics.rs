//! kube-apiserver's `/metrics`, parsed from the Prometheus text format, so tests can read
//! counters such as `apiserver_request_total{verb,resource,code}` as evidence from the
//! API server itself.

use std::collections::BTreeMap;

use crate::Error;

/// One sample: a metric name, its labels and its value.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// All samples of one scrape.
#[derive(Debug, Clone, Default)]
pub struct Metrics {
    pub samples: Vec<Sample>,
}

impl Metrics {
    /// Parses the Prometheus text exposition format (comments and blank lines skipped).
    pub fn parse(text: &str) -> Result<Metrics, Error> {
        let mut samples = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let sample = parse_line(line).ok_or_else(|| {
                Error::invalid("parsing metrics", format!("line {}: {line}", i + 1))
            })?;
            samples.push(sample);
        }
        Ok(Metrics { samples })
    }

    /// Sum of the samples named `name` whose labels include every `(key, value)` given.
    pub fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.samples
            .iter()
            .filter(|s| s.name == name)
            .filter(|s| {
                labels
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).is_some_and(|have| have == v))
            })
            .map(|s| s.value)
            .sum()
    }
}

fn parse_line(line: &str) -> Option<Sample> {
    let (name, rest) = match line.find(['{', ' ']) {
        Some(i) => line.split_at(i),
        None => return None,
    };
    let mut labels = BTreeMap::new();
    let rest = if let Some(body) = rest.strip_prefix('{') {
        let mut chars = body.char_indices().peekable();
        let mut end = None;
        loop {
            // skip separators
            while let Some((_, c)) = chars.peek() {
                if *c == ',' || c.is_whitespace() {
                    chars.next();
                } else {
                    break;
                }
            }
            match chars.peek() {
                Some((i, '}')) => {
                    end = Some(*i);
                    break;
                }
                None => break,
                _ => {}
            }
            let mut key = String::new();
            for (_, c) in chars.by_ref() {
                if c == '=' {
                    break;
                }
                key.push(c);
            }
            if chars.next().map(|(_, c)| c) != Some('"') {
                return None;
            }
            let mut value = String::new();
            let mut closed = false;
            while let Some((_, c)) = chars.next() {
                match c {
                    '\\' => match chars.next().map(|(_, c)| c) {
                        Some('n') => value.push('\n'),
                        Some(other) => value.push(other),
                        None => return None,
                    },
                    '"' => {
                        closed = true;
                        break;
                    }
                    c => value.push(c),
                }
            }
            if !closed {
                return None;
            }
            labels.insert(key.trim().to_owned(), value);
        }
        &body[end? + 1..]
    } else {
        rest
    };
    let value = rest.split_whitespace().next()?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().ok()?,
    };
    Some(Sample {
        name: name.to_owned(),
        labels,
        value,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"
# HELP apiserver_request_total Counter of apiserver requests
# TYPE apiserver_request_total counter
apiserver_request_total{code="201",component="apiserver",resource="configmaps",verb="POST",version="v1"} 3
apiserver_request_total{code="409",component="apiserver",resource="configmaps",verb="POST",version="v1"} 1
apiserver_request_total{code="200",resource="pods",verb="LIST"} 7 1700000000000
weird_metric{path="a\"b,c",le="+Inf"} +Inf
plain_gauge 2.5
"#;

    #[test]
    fn parses_and_sums_by_labels() {
        let m = Metrics::parse(TEXT).unwrap();
        assert_eq!(m.samples.len(), 5);
        assert_eq!(
            m.sum("apiserver_request_total", &[("resource", "configmaps")]),
            4.0
        );
        assert_eq!(
            m.sum(
                "apiserver_request_total",
                &[("resource", "configmaps"), ("code", "409")]
            ),
            1.0
        );
        assert_eq!(m.sum("apiserver_request_total", &[("verb", "LIST")]), 7.0);
        assert_eq!(m.sum("apiserver_request_total", &[("verb", "DELETE")]), 0.0);
        assert_eq!(m.sum("plain_gauge", &[]), 2.5);
        let weird = &m.samples[3];
        assert_eq!(weird.labels["path"], "a\"b,c");
        assert!(weird.value.is_infinite());
    }

    #[test]
    fn rejects_garbage() {
        assert!(Metrics::parse("metric{unterminated=\"x} 1").is_err());
        assert!(Metrics::parse("metric notanumber").is_err());
    }
}
