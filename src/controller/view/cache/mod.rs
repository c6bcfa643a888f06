//! The replica's caches, fed by the watches: GpuJobs ([`GpuJobCache`], each kept packed)
//! and the Jobs they control ([`JobIndex`], indexed by owner). Both keep only what the
//! operator reads, compactly: at ten thousand GpuJobs they are most of a replica's
//! memory (`benches/examples/footprint.rs` measures them).

mod gpujobs;
mod jobs;
mod record;

pub use gpujobs::GpuJobCache;
pub(super) use jobs::Cached;
pub use jobs::{JobIndex, owner_of};
