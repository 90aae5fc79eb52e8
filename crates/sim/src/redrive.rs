//! Redrive in the workload: strict programs (a line of activities that fails with a failed
//! one) are redriven by clients, sometimes with the request sent twice, during the faults and
//! once more when they stop. Every send must name the same successor, and the successor must
//! not schedule a step before the one it resumes (checked in `check_run`).

use super::*;
use capstan_app::redrive::{self, RedriveRequest};

impl Sim {
    /// The instances running strict programs.
    fn strict_workflows(&self) -> Vec<String> {
        let strict = |program: &Vec<Step>| program.first() == Some(&Step::FailWithActivity);
        self.programs.iter().filter(|(_, p)| strict(p)).map(|(id, _)| id.clone()).collect()
    }

    /// A client redrives a random strict workflow's current run (refused unless it failed).
    pub(crate) async fn redrive_one(&mut self) -> Result<(), Failure> {
        let strict = self.strict_workflows();
        match pick(&mut self.rng, strict.iter()) {
            Some(workflow_id) => self.redrive(&workflow_id).await,
            None => self.advance_clock().await,
        }
    }

    /// After the faults: every strict workflow whose current run failed is redriven once.
    pub(crate) async fn redrive_every_failed(&mut self) -> Result<(), Failure> {
        for workflow_id in self.strict_workflows() {
            let failed = self
                .current_run_of(&workflow_id)
                .await?
                .is_some_and(|r| r.status == RunStatus::Failed);
            if failed {
                self.redrive(&workflow_id).await?;
            }
        }
        Ok(())
    }

    async fn redrive(&mut self, workflow_id: &str) -> Result<(), Failure> {
        let Some(source) = self.current_run_of(workflow_id).await? else {
            return Ok(());
        };
        let mut answered: Option<Redrive> = None;
        for send in 1..=self.sends() {
            self.trace(|| format!("redrive {workflow_id} run {} (send {send})", source.run_id));
            let request = RedriveRequest {
                namespace: NAMESPACE.into(),
                workflow_id: workflow_id.to_string(),
                run_id: source.run_id.to_string(),
                request_id: Some(format!("redrive-{}-{send}", self.step)),
                principal: Some(capstan_engine::Principal::token(SIMULATED_OPERATOR)),
            };
            let result = redrive::redrive(&self.app, request).await;
            let Some(outcome) = self.declined(result)? else { continue };
            if outcome.fresh {
                self.report.redrives += 1;
            }
            match &answered {
                Some(first) if first != &outcome.redrive => {
                    return Err(self.fail(format!(
                        "{workflow_id}: two redrives of run {}: {first:?} and {:?}",
                        source.run_id, outcome.redrive
                    )))
                }
                _ => answered = Some(outcome.redrive),
            }
        }
        let Some(record) = answered else { return Ok(()) };
        for run_id in [&record.source_run_id, &record.successor_run_id] {
            let locator = RunLocator::Run(WorkflowId(workflow_id.to_string()), run_id.clone());
            let run = self
                .store()
                .load_run(NAMESPACE, locator)
                .await
                .map_err(|e| self.fail(format!("load: {e}")))?;
            let run = run.ok_or_else(|| self.fail(format!("{workflow_id}: redriven run {run_id} is gone")))?;
            self.acknowledge(&run);
        }
        Ok(())
    }
}
