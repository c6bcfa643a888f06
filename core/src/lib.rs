//! The pure core of gpujob-operator: everything that decides, and nothing that reads a
//! clock, talks to the API server or runs a task. The operator crate (runner, queue,
//! client, lease I/O, server, quota service, executor) builds on it; nothing here
//! imports back up, and the dependencies in Cargo.toml make that impossible to break.
//!
//! - [`api`]: the GpuJob v1 and v2 types, their lossless conversion, the CRD;
//! - [`validate`]: what the schema cannot check;
//! - [`plan`]: `(GpuJob, its Jobs, what the outside answered, now) -> actions`;
//! - [`job`], [`status`], [`events`]: the desired Job, condition helpers, Event notes;
//! - [`domain`]: the values of the domain gauges (GpuJobs by phase, waiting, unconverged);
//! - [`rendezvous`]: a multi-node attempt's headless Service;
//! - [`seen_job`], [`seen_pod`]: a Job and a pod as the plan sees them, the same from
//!   every source;
//! - [`balance`]: which shards a replica should hold (rendezvous hashing);
//! - [`lease`]: one Lease's timing, when another holder's record has expired, and the
//!   records that claim and release it;
//! - [`shard`], [`hash`], [`backoff`], [`quota`]: small shared pieces.

pub mod api;
pub mod backoff;
pub mod balance;
pub mod claims;
pub mod domain;
pub mod events;
pub mod failure_policy;
pub mod gang;
pub mod hash;
pub mod job;
pub mod lease;
pub mod plan;
pub mod quota;
pub mod recut;
pub mod rendezvous;
pub mod seen_job;
pub mod seen_pod;
pub mod shard;
pub mod status;
pub mod validate;
