//! v2 `spec.topology`: keeps each attempt's pods in one domain of a node label (one
//! rack, one block), as the scheduling layers of 2026 understand it: Kueue's
//! TopologyAwareScheduling (a pod template annotation naming the level), a gang's
//! PodGroup (`schedulingConstraints.topology`, where kube-scheduler serves it) and, for
//! neither, a pod affinity among the attempt's pods on that label.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The pod template annotation by which Kueue keeps a pod set in one domain of a level.
pub const KUEUE_REQUIRED_TOPOLOGY: &str = "kueue.x-k8s.io/podset-required-topology";
/// The same as a preference: Kueue tries the narrowest domain that fits, then wider.
pub const KUEUE_PREFERRED_TOPOLOGY: &str = "kueue.x-k8s.io/podset-preferred-topology";

/// Where each attempt's pods are kept together.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Topology {
    /// The node label whose value names a domain (e.g. a rack label such as
    /// `topology.example.com/rack`); with Kueue, one of the levels of the flavor's
    /// Topology.
    #[schemars(length(min = 1, max = 317))]
    pub level: String,
    /// `Required` (default): all of an attempt's pods in one domain, or none placed;
    /// `Preferred`: in one domain if one has room, else spread.
    #[serde(default, skip_serializing_if = "TopologyMode::is_default")]
    pub mode: TopologyMode,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum TopologyMode {
    #[default]
    Required,
    Preferred,
}

impl TopologyMode {
    fn is_default(&self) -> bool {
        *self == TopologyMode::Required
    }
}

impl Topology {
    /// The Kueue annotation that asks for this (key, value).
    pub fn kueue_annotation(&self) -> (&'static str, &str) {
        let key = match self.mode {
            TopologyMode::Required => KUEUE_REQUIRED_TOPOLOGY,
            TopologyMode::Preferred => KUEUE_PREFERRED_TOPOLOGY,
        };
        (key, &self.level)
    }
}
