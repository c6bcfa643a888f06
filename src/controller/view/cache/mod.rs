//! The replica's caches, fed by the watches: GpuJobs ([`GpuJobCache`], each kept packed),
//! the Jobs they control ([`JobIndex`], indexed by owner) and their attempts' pods
//! ([`PodIndex`], indexed by owner; one table type serves both indexes: `table.rs`).
//! All keep only what the operator reads, compactly: at ten thousand GpuJobs they are
//! most of a replica's memory (`benches/examples/footprint.rs` measures them).

mod gpujobs;
mod jobs;
mod pods;
mod record;
mod table;

use super::scope::Scope;

/// The relists in progress in one cache, one per watch (of everything, or of one shard):
/// the new contents of that part, swapped in when its list completes.
#[derive(Debug)]
struct Relists<T>(Vec<(Scope, T)>);

impl<T> Default for Relists<T> {
    fn default() -> Relists<T> {
        Relists(Vec::new())
    }
}

impl<T: Default> Relists<T> {
    /// The watch of `part` lists anew: whatever it had begun is dropped.
    fn begin(&mut self, part: &Scope) {
        self.abandon(part);
        self.0.push((part.clone(), T::default()));
    }

    /// The contents being listed for `part`, if a list is under way.
    fn get_mut(&mut self, part: &Scope) -> Option<&mut T> {
        self.0.iter_mut().find(|(p, _)| p == part).map(|(_, t)| t)
    }

    /// The list of `part` completed: its contents.
    fn finish(&mut self, part: &Scope) -> Option<T> {
        let i = self.0.iter().position(|(p, _)| p == part)?;
        Some(self.0.swap_remove(i).1)
    }

    /// The watch of `part` stopped.
    fn abandon(&mut self, part: &Scope) {
        self.0.retain(|(p, _)| p != part);
    }
}

pub use gpujobs::GpuJobCache;
pub(super) use jobs::Cached;
pub use jobs::{JobIndex, owner_of};
pub use pods::PodIndex;
