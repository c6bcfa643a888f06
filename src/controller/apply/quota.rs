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
                let answer = QuotaAnswer::granted(id, gpus, req.gpus);
                if let QuotaAnswer::Reserved { id, gpus: recorded } = &answer {
                    if gpus.is_some_and(|held| held != req.gpus) {
                        warn!(reservation = %id, asked = req.gpus, held = gpus, recorded, "the quota service holds a reservation of another size than asked");
                    }
                    info!(reservation = %id, gpus = recorded, "GPU quota reserved");
                }
                answer
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
