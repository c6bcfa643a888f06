//! gpujob-operator: runs `GpuJob` custom resources as batch/v1 Jobs and keeps their
//! status true.
//!
//! Data flow: watches → caches → keys → work queue → reconcile, where reconcile is
//! observe → plan (pure) → apply (the only writer) → one status patch.

pub mod api;
pub mod apierror;
mod backoff;
pub mod cli;
pub mod client;
pub mod controller;
pub mod failpoint;
mod hash;
pub mod lease;
pub mod metrics;
pub mod migrate;
pub mod queue;
pub mod quota;
pub mod ratelimit;
pub mod server;
pub mod shard;
