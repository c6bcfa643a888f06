//! The operator's integration tests, one binary: each module is one area, run against the
//! real control plane (devcluster) that `scripts/test.sh` starts. One binary links the
//! operator, devcluster and the shared support once, not once per area.

mod support;

mod batch;
mod cli;
mod conversion;
mod crash;
mod crd;
mod day2;
mod dra;
mod echo;
mod events;
mod faults;
mod fence;
mod forged;
mod from_caches;
mod gang;
mod ha;
mod ha_apiserver;
mod install;
mod kueue;
mod late_create;
mod lease;
mod lost_node;
mod metrics;
mod metrics_secure;
mod migration;
mod monitoring;
mod multikueue;
mod observability;
mod plugin;
mod preconditions;
mod quota;
mod quota_fencing;
mod quota_http;
mod reconcile;
mod recut;
mod rollout;
mod scheduling;
mod sharded_watch;
mod sharding;
mod soak;
mod spec_changes;
mod stale_takeover;
mod validation;
