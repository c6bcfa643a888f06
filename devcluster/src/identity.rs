//! The users the control plane knows, each with a static bearer token and a kubeconfig.

use std::fmt;

/// Username of the operator's service account, as RBAC sees it.
pub const OPERATOR_USER: &str = "system:serviceaccount:gpujob-system:gpujob-operator";
/// Group of the replica users. devcluster grants it nothing: tests bind the operator's
/// ClusterRole to it, so replicas run with the same least privileges as the real
/// deployment while the audit log still tells them apart by user name.
pub const REPLICA_GROUP: &str = "gpujob.dev:replicas";

/// Who a client acts as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Identity {
    /// `admin`, in `system:masters`: bypasses RBAC.
    Admin,
    /// The operator's service-account user, for RBAC tests; granted nothing by default.
    Operator,
    /// `replica-N` (N from 1), for telling operator replicas apart in the audit log.
    Replica(u8),
}

impl Identity {
    /// The user name the API server records for this identity.
    pub fn username(&self) -> String {
        match self {
            Identity::Admin => "admin".to_owned(),
            Identity::Operator => OPERATOR_USER.to_owned(),
            Identity::Replica(n) => format!("replica-{n}"),
        }
    }

    /// Groups, as written to the static token file.
    pub(crate) fn groups(&self) -> Vec<&'static str> {
        match self {
            Identity::Admin => vec!["system:masters"],
            Identity::Operator => vec![
                "system:serviceaccounts",
                "system:serviceaccounts:gpujob-system",
            ],
            Identity::Replica(_) => vec![REPLICA_GROUP],
        }
    }

    /// File-name-safe short name (`admin`, `operator`, `replica-1`).
    pub fn file_stem(&self) -> String {
        match self {
            Identity::Admin => "admin".to_owned(),
            Identity::Operator => "operator".to_owned(),
            Identity::Replica(n) => format!("replica-{n}"),
        }
    }

    /// All identities of a control plane with `replicas` replica users.
    pub fn all(replicas: u8) -> Vec<Identity> {
        let mut all = vec![Identity::Admin, Identity::Operator];
        all.extend((1..=replicas).map(Identity::Replica));
        all
    }
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.username())
    }
}
