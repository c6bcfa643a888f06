//! The executor's calls to the quota service: what it answered goes to the next plan.

use tracing::{info, warn};

use super::{Answer, End, Execution};
use crate::controller::error::Error;
use crate::controller::plan::QuotaAnswer;
use crate::failpoint;
use crate::quota::{Reserve, ReserveRequest};

impl Execution<'_> {
    /// Asks for a reservation with fencing sequence `sequence`.
    pub(super) async fn reserve(
        &mut self,
        req: &ReserveRequest,
        sequence: i64,
    ) -> Result<End, Error> {
        failpoint::hit("before-reserve");
        let answer = match self.ctx.writer.reserve(self.fence, req, sequence).await? {
            Reserve::Granted { id, gpus } => {
                failpoint::hit("after-reserve");
                // What the service holds is recorded: a reservation it held already (a
                // reserve whose answer was lost, a release that did not land) comes back
                // as it is, whatever size is asked, and must not be taken to cover more.
                // The plan then releases it and reserves anew once no pod runs.
                let held = gpus.unwrap_or(req.gpus);
                if held != req.gpus {
                    warn!(reservation = %id, asked = req.gpus, held, "the quota service holds a reservation of another size than asked; recording what it holds: it is released and made again before an attempt of the new size starts");
                }
                info!(reservation = %id, gpus = held, "GPU quota reserved");
                QuotaAnswer::Reserved { id, gpus: held }
            }
            Reserve::Refused { reason, message } => {
                self.ctx.metrics.quota_refusals.inc();
                info!(reason = %reason, "GPU quota refused: {message}; asking again with backoff");
                QuotaAnswer::Refused { reason, message }
            }
        };
        Ok(self.heard(Answer::Quota(answer)))
    }

    /// Releases the GpuJob's reservation with fencing sequence `sequence`; a failure
    /// is an answer (recorded, then reported), not an error of this run.
    pub(super) async fn release(&mut self, sequence: i64) -> Result<End, Error> {
        let uid = self.gpujob.metadata.uid.clone().unwrap_or_default();
        let reservation = self
            .gpujob
            .status
            .as_ref()
            .and_then(|s| s.reservation_id.clone());
        match self.ctx.writer.release(self.fence, &uid, sequence).await {
            Ok(()) => {
                failpoint::hit("after-release");
                info!(
                    reservation = reservation.as_deref().unwrap_or("-"),
                    "GPU quota released"
                );
                Ok(self.heard(Answer::Quota(QuotaAnswer::Released)))
            }
            Err(Error::Quota(e)) => {
                warn!(
                    reservation = reservation.as_deref().unwrap_or("-"),
                    "releasing GPU quota failed: {e}; retrying with backoff"
                );
                Ok(self.heard(Answer::ReleaseFailed(e)))
            }
            Err(e) => Err(e),
        }
    }
}
