//! gpujob-operator: runs `GpuJob` custom resources as batch/v1 Jobs and keeps their
//! status true.
//!
//! Data flow: watches → the view (caches) → keys → work queue → reconcile, where
//! reconcile is a snapshot from the view → plan (pure, in the `gpujob-core` crate) →
//! apply (the only writer) → the view records what the writes did.

pub mod apierror;
pub mod cli;
pub mod client;
pub mod controller;
pub mod failpoint;
pub mod health;
pub mod lease;
pub mod metrics;
pub mod migrate;
pub mod queue;
pub mod quota;
pub mod ratelimit;
pub mod server;
pub mod shard_cuts;

// The pure core, where the operator has always had it (`gpujob_operator::api`, ...).
pub use gpujob_core::{api, backoff, hash, recut, shard};
