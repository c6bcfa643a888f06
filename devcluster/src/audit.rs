//! kube-apiserver's audit log: every write, with who made it, from which user agent, on
//! what, and the response code. Reads (get, list, watch) are not recorded.
//!
//! Give each operator replica its own user or user agent and the log proves which replica
//! wrote what, and when.

use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::Error;

/// The audit policy devcluster starts kube-apiserver with: writes at Metadata level
/// (who, what, response code, no bodies) — except Lease writes, with their request
/// body, so the log holds each Lease's history of holders — reads not at all.
pub const POLICY: &str = r#"apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
  - level: None
    verbs: ["get", "list", "watch"]
  - level: Request
    resources:
      - group: coordination.k8s.io
        resources: ["leases"]
  - level: Metadata
"#;

/// The verbs that change state.
pub const WRITE_VERBS: [&str; 5] = ["create", "update", "patch", "delete", "deletecollection"];

/// One audited request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditEvent {
    pub user: String,
    pub user_agent: String,
    pub verb: String,
    pub api_group: String,
    pub resource: String,
    pub subresource: String,
    pub namespace: String,
    pub name: String,
    pub code: u16,
    /// RFC 3339 with microseconds, as the API server wrote it (`stageTimestamp`: the
    /// response was complete).
    pub timestamp: String,
    /// When the API server received the request (`requestReceivedTimestamp`). Of two
    /// successful writes to one object that each carry the resourceVersion they were
    /// computed from, the one received first also committed first.
    pub received: String,
    /// For a Lease write: the holder it writes (`""`: released).
    pub lease_holder: Option<String>,
}

impl AuditEvent {
    pub fn is_write(&self) -> bool {
        WRITE_VERBS.contains(&self.verb.as_str())
    }

    /// True when the write was accepted (2xx).
    pub fn succeeded(&self) -> bool {
        (200..300).contains(&self.code)
    }
}

/// A position in the audit log: events after it are "since" it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Cursor(u64);

/// The audit log file of one control plane.
#[derive(Debug, Clone)]
pub struct AuditLog {
    path: PathBuf,
}

impl AuditLog {
    pub fn new(path: impl Into<PathBuf>) -> AuditLog {
        AuditLog { path: path.into() }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The current end of the log. Take one before an action, read `since` it after.
    pub fn cursor(&self) -> Result<Cursor, Error> {
        Ok(Cursor(self.read_from(0)?.1))
    }

    /// Every event written after `cursor`.
    pub fn since(&self, cursor: Cursor) -> Result<Vec<AuditEvent>, Error> {
        Ok(self.read_from(cursor.0)?.0)
    }

    /// Every event in the log.
    pub fn all(&self) -> Result<Vec<AuditEvent>, Error> {
        self.since(Cursor(0))
    }

    /// Parses complete lines from byte `offset`; returns the events and the offset after
    /// the last complete line (a line being written right now is left for next time).
    fn read_from(&self, offset: u64) -> Result<(Vec<AuditEvent>, u64), Error> {
        let what = || format!("reading audit log {}", self.path.display());
        let mut file = match std::fs::File::open(&self.path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((Vec::new(), 0)),
            Err(e) => return Err(Error::io(what())(e)),
        };
        let len = file.metadata().map_err(Error::io(what()))?.len();
        if len < offset {
            // Reading on from the old offset would start mid-line in another file.
            return Err(Error::invalid(
                what(),
                format!(
                    "the log is shorter ({len} bytes) than the cursor ({offset}): it was rotated or truncated"
                ),
            ));
        }
        file.seek(SeekFrom::Start(offset))
            .map_err(Error::io(what()))?;
        let mut buf = Vec::new();
        file.read_to_end(&mut buf).map_err(Error::io(what()))?;
        let complete = buf.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
        let mut events = Vec::new();
        for line in buf[..complete].split(|b| *b == b'\n') {
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let raw: RawEvent = serde_json::from_slice(line).map_err(|e| {
                Error::invalid(what(), format!("{e}: {}", String::from_utf8_lossy(line)))
            })?;
            events.push(raw.into());
        }
        Ok((events, offset + complete as u64))
    }
}

/// Filters for the questions tests ask most.
pub trait AuditEvents {
    /// Writes (see [`WRITE_VERBS`]) in `namespace`.
    fn writes_in(&self, namespace: &str) -> Vec<&AuditEvent>;
    /// Events by `user`.
    fn by_user(&self, user: &str) -> Vec<&AuditEvent>;
}

impl AuditEvents for [AuditEvent] {
    fn writes_in(&self, namespace: &str) -> Vec<&AuditEvent> {
        self.iter()
            .filter(|e| e.is_write() && e.namespace == namespace)
            .collect()
    }

    fn by_user(&self, user: &str) -> Vec<&AuditEvent> {
        self.iter().filter(|e| e.user == user).collect()
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawEvent {
    verb: String,
    #[serde(default)]
    user: RawUser,
    #[serde(default)]
    user_agent: String,
    #[serde(default)]
    object_ref: RawObjectRef,
    #[serde(default)]
    response_status: RawStatus,
    #[serde(default)]
    stage_timestamp: String,
    #[serde(default)]
    request_received_timestamp: String,
    #[serde(default)]
    request_object: Option<serde_json::Value>,
}

#[derive(Deserialize, Default)]
struct RawUser {
    #[serde(default)]
    username: String,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct RawObjectRef {
    #[serde(default)]
    resource: String,
    #[serde(default)]
    subresource: String,
    #[serde(default)]
    namespace: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    api_group: String,
}

#[derive(Deserialize, Default)]
struct RawStatus {
    #[serde(default)]
    code: u16,
}

impl From<RawEvent> for AuditEvent {
    fn from(r: RawEvent) -> AuditEvent {
        AuditEvent {
            user: r.user.username,
            user_agent: r.user_agent,
            verb: r.verb,
            api_group: r.object_ref.api_group,
            resource: r.object_ref.resource,
            subresource: r.object_ref.subresource,
            namespace: r.object_ref.namespace,
            name: r.object_ref.name,
            code: r.response_status.code,
            timestamp: r.stage_timestamp,
            received: r.request_received_timestamp,
            lease_holder: r.request_object.filter(|o| o["kind"] == "Lease").map(|o| {
                o["spec"]["holderIdentity"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned()
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    const LINE: &str = r#"{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"a","stage":"ResponseComplete","requestURI":"/api/v1/namespaces/ns1/configmaps","verb":"create","user":{"username":"replica-1","groups":["gpujob.dev:replicas","system:authenticated"]},"sourceIPs":["127.0.0.1"],"userAgent":"gpujob-operator/0.1.0 (replica-1)","objectRef":{"resource":"configmaps","namespace":"ns1","name":"cm","apiVersion":"v1"},"responseStatus":{"metadata":{},"code":201},"requestReceivedTimestamp":"2026-11-30T06:00:00.000000Z","stageTimestamp":"2026-11-30T06:00:00.010000Z"}"#;

    #[test]
    fn reads_complete_lines_since_a_cursor() {
        let dir =
            std::env::temp_dir().join(format!("devcluster-audit-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("audit.log");
        let log = AuditLog::new(&path);
        assert!(
            log.all().unwrap().is_empty(),
            "a missing log reads as empty"
        );

        let mut f = std::fs::File::create(&path).unwrap();
        writeln!(f, "{LINE}").unwrap();
        let cursor = log.cursor().unwrap();
        let second = LINE
            .replace("\"create\"", "\"delete\"")
            .replace("\"code\":201", "\"code\":409");
        writeln!(f, "{second}").unwrap();
        // half a line, as if kube-apiserver were writing it right now
        write!(f, "{{\"verb\":\"pat").unwrap();

        let all = log.all().unwrap();
        assert_eq!(all.len(), 2);
        assert_eq!(all[0].user, "replica-1");
        assert_eq!(all[0].user_agent, "gpujob-operator/0.1.0 (replica-1)");
        assert_eq!(
            (all[0].resource.as_str(), all[0].name.as_str()),
            ("configmaps", "cm")
        );
        assert!(all[0].succeeded());
        let since = log.since(cursor).unwrap();
        assert_eq!(since.len(), 1);
        assert_eq!(since[0].verb, "delete");
        assert!(!since[0].succeeded());
        assert_eq!(all.writes_in("ns1").len(), 2);
        assert_eq!(all.writes_in("ns2").len(), 0);
        assert_eq!(all.by_user("admin").len(), 0);

        // A log that starts over (rotated, truncated) is an error, not a misread.
        let end = log.cursor().unwrap();
        std::fs::write(&path, format!("{LINE}\n")).unwrap();
        let err = log.since(end).unwrap_err().to_string();
        assert!(err.contains("rotated"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
