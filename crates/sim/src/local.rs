//! Prepared local activities in the workload: a worker holding a workflow task admits the
//! call, supervises it, reports its end, and replays on from what the server recorded — or
//! dies mid-call (its claim runs out; the next claim recovers the attempt), or has the call
//! stopped by a cancellation requested meanwhile. Repeats of each report are sent too.

use super::*;
use crate::program::{local_descriptor, LocalCall};
use capstan_app::local_activities;

impl Sim {
    /// Runs the prepared local call the replay stopped at, on the claim of `task`; answers
    /// whether the claim is still held (the replay goes on) or over.
    pub(crate) async fn run_local_call(
        &mut self,
        task: &Task,
        run: &RunState,
        owner: &str,
        call: LocalCall,
        faulty: bool,
    ) -> Result<bool, Failure> {
        let lease = reports::WorkflowLease {
            namespace: NAMESPACE.into(),
            task_id: task.id.clone(),
            owner: owner.to_string(),
            attempt: task.fence,
            principal: Some(capstan_engine::Principal::token(SIMULATED_WORKER)),
        };
        let descriptor = local_descriptor(run.workflow_id.as_str());
        let sequence = call.sequence.unwrap_or(run.next_step);
        if call.recover {
            self.trace(|| format!("{owner} recovers the local call at {sequence} of {}", run.workflow_id));
            let result = local_activities::recover(&self.app, lease, sequence, descriptor).await;
            let Some((receipt, run)) = self.declined(result)? else {
                return Ok(false);
            };
            self.acknowledge(&run);
            self.report.local_attempts[2] += 1;
            return Ok(receipt.record.retry_task_id.is_none());
        }
        let nonce = format!("{}:{}:{sequence}", task.id, task.fence);
        self.trace(|| format!("{owner} prepares the local call at {sequence} of {}", run.workflow_id));
        let result = local_activities::prepare(&self.app, lease.clone(), sequence, nonce.clone(), descriptor.clone()).await;
        let Some((admission, admitted_run)) = self.declined(result)? else {
            return Ok(false);
        };
        self.acknowledge(&admitted_run);
        if !admission.duplicate {
            self.report.local_attempts[0] += 1;
        }
        if faulty && self.rng.random_bool(0.2) {
            let again = local_activities::prepare(&self.app, lease.clone(), sequence, nonce, descriptor).await;
            if let Some((repeat, _)) = self.declined(again)? {
                if !repeat.duplicate || repeat.attempt != admission.attempt {
                    return Err(self.fail(format!("a repeated prepare at {sequence} admitted another attempt")));
                }
            }
        }
        let attempt_id = admission.attempt.attempt_id.clone();
        // The worker dies with the callback running: its claim runs out.
        if faulty && self.rng.random_bool(0.15) {
            self.trace(|| format!("{owner} dies running the local call at {sequence}"));
            self.report.lost_tasks += 1;
            return Ok(false);
        }
        // A client asks the run to stop while the callback runs.
        if faulty && self.rng.random_bool(0.1) {
            self.request_cooperative_cancellation(run.workflow_id.as_str()).await?;
        }
        if faulty && self.rng.random_bool(0.5) {
            let result = local_activities::control(&self.app, lease.clone(), attempt_id.clone(), WORKFLOW_LEASE_MS).await;
            match self.declined(result)? {
                Some((Supervised::Stopped(stop), run, _)) => {
                    self.acknowledge(&run);
                    self.report.local_attempts[3] += 1;
                    let ack = Delivery::AcknowledgeStop {
                        task_id: task.id.clone(),
                        attempt_id,
                        owner: owner.to_string(),
                        request_id: stop.request.request_id.to_string(),
                        fence: Some(task.fence),
                    };
                    self.hand_over(ack, faulty).await?;
                    return Ok(false);
                }
                Some((Supervised::Ended { .. }, run, _)) => {
                    self.acknowledge(&run);
                    return Ok(false);
                }
                Some((Supervised::Active(_), _, _)) => {}
                None => return Ok(false),
            }
        }
        let succeeds = !faulty || self.rng.random_bool(0.6);
        let report = match succeeds {
            true => LocalReport::Completed(Payload::avro(PAYLOAD)),
            false => LocalReport::Failed {
                message: "simulated local failure".into(),
                exception_type: Some("SimulatedError".into()),
                non_retryable: false,
            },
        };
        let fingerprint = format!("{succeeds}");
        let result = local_activities::outcome(&self.app, lease.clone(), attempt_id.clone(), report.clone(), fingerprint.clone()).await;
        let Some((receipt, run)) = self.declined(result)? else {
            return Ok(false);
        };
        self.acknowledge(&run);
        if faulty && self.rng.random_bool(0.25) {
            let again = local_activities::outcome(&self.app, lease, attempt_id, report, fingerprint).await;
            if let Some((repeat, _)) = self.declined(again)? {
                if !repeat.duplicate || repeat.record != receipt.record {
                    return Err(self.fail(format!("a repeated outcome at {sequence} recorded another end")));
                }
            }
        }
        let released = receipt.record.retry_task_id.is_some();
        if released {
            self.report.local_attempts[1] += 1;
        }
        Ok(!released)
    }
}
