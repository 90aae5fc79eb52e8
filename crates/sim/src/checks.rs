//! The guarantees checked after every step and at the end (see `Sim::check_run`): chains,
//! acknowledged heads, one terminal fact per durable id, fences, settled updates and liveness.

use super::*;

impl Sim {
    /// After the calm phase: every run closed, every update settled (the checks above), and
    /// the counts of what the seed exercised.
    pub(crate) async fn check_settled(&mut self) -> Result<(), Failure> {
        for (run_id, workflow_id) in self.run_workflows.clone() {
            let run = self
                .store()
                .load_run(NAMESPACE, RunLocator::Run(WorkflowId(workflow_id), RunId(run_id.clone())))
                .await
                .map_err(|e| self.fail(format!("load: {e}")))?
                .ok_or_else(|| self.fail(format!("run {run_id} is gone")))?;
            if !run.is_closed() {
                return Err(self.fail(format!("liveness: run {run_id} is still open")));
            }
            if run.run_number > 1 {
                self.report.continued_as_new += 1;
            }
            if run.workflow_type == CHILD_TYPE && run.run_number == 1 {
                match run.service_call_ids.is_empty() {
                    true => self.report.children_started += 1,
                    false => self.report.service_calls += 1,
                }
            }
        }
        self.report.completed = self.run_workflows.values().collect::<BTreeSet<_>>().len();
        Ok(())
    }

    /// The replay mode a workflow lease was given agrees with the run's sticky owner, and a
    /// run claimed by a registered worker went to another only after its hold ran out.
    pub(crate) fn check_replay_mode(&mut self, task: &Task, run: &RunState, owner: &str) -> Result<(), Failure> {
        let TaskDetail::Workflow { replay_mode, .. } = &task.detail else {
            return Ok(());
        };
        let expected = run.replay_mode_for(owner, self.now);
        self.report.replay_modes[expected as usize] += 1;
        if *replay_mode != Some(expected) {
            return Err(self.fail(format!(
                "workflow task {} leased by {owner} with replay mode {replay_mode:?}, expected {expected:?} ({:?})",
                task.id, run.sticky
            )));
        }
        if let (ReplayMode::ForcedColdReplay, Some(affinity)) = (expected, &run.sticky) {
            let held_until = affinity
                .expires_at
                .min(task.available_at.max(task.created_at) + capstan_engine::sticky::STICKY_HOLD_MS);
            if self.now < held_until && !self.retired.contains(&affinity.worker_id) {
                return Err(self.fail(format!(
                    "workflow task {} of {} held for {} until {held_until} went to {owner} before its hold ran out (created {}, available {}, affinity {affinity:?})",
                    task.id, run.workflow_id, affinity.worker_id, task.created_at, task.available_at
                )));
            }
        }
        Ok(())
    }

    /// A granted lease renewal is the lease the run holds for that worker, live, and it
    /// recorded nothing: the run's history head is where it was.
    pub(crate) fn check_lease_grant(
        &mut self,
        task_id: &TaskId,
        grant: &ActivityLeaseGrant,
        run: &RunState,
        before: Option<(u64, String)>,
        now: Millis,
    ) -> Result<(), Failure> {
        let held = run.tasks.get(task_id).and_then(|t| t.lease());
        if held != Some(&grant.lease) {
            return Err(self.fail(format!("renewal of {task_id} granted {:?}, the run holds {held:?}", grant.lease)));
        }
        if grant.lease.expires_at <= now {
            return Err(self.fail(format!("renewal of {task_id} granted an expired lease")));
        }
        if before != Some((run.last_sequence, run.last_hash.clone())) {
            return Err(self.fail(format!("renewing the lease of {task_id} changed its run's history")));
        }
        Ok(())
    }

    /// The history head of the run that owns `task_id`.
    pub(crate) async fn task_run_head(&mut self, task_id: &TaskId) -> Result<Option<(u64, String)>, Failure> {
        let run = self
            .store()
            .load_run(NAMESPACE, RunLocator::Task(task_id.clone()))
            .await
            .map_err(|e| self.fail(format!("load: {e}")))?;
        Ok(run.map(|r| (r.last_sequence, r.last_hash)))
    }

    /// A session activity is leased only by its session's holder, inside the session's lease.
    pub(crate) async fn check_session_holder(&mut self, task: &Task, run: &RunState, owner: &str) -> Result<(), Failure> {
        let Some(requirement) = capstan_app::sessions::session_of_task(run, &task.id) else {
            return Ok(());
        };
        self.report.session_attempts += 1;
        let session_id = &requirement.options.session_id;
        let session = self.store().get_session(NAMESPACE, session_id).await;
        let session = session.map_err(|e| self.fail(format!("session: {e}")))?;
        match session {
            Some(session) if session.held_by(owner, self.now) => Ok(()),
            other => Err(self.fail(format!(
                "activity task {} of session {session_id} leased by {owner}, but the session is {other:?}",
                task.id
            ))),
        }
    }

    pub(crate) async fn check_touched(&mut self) -> Result<(), Failure> {
        for run_id in std::mem::take(&mut self.touched) {
            self.check_run(&run_id).await?;
        }
        Ok(())
    }

    pub(crate) async fn check_all(&mut self) -> Result<(), Failure> {
        self.touched.clear();
        for run_id in self.acked.keys().cloned().collect::<Vec<_>>() {
            self.check_run(&run_id).await?;
        }
        for schedule_id in self.schedules.clone() {
            self.check_schedule(&schedule_id).await?;
        }
        self.check_held_payloads().await
    }

    /// The guarantees of one run, from its stored state and history.
    /// Who caused an event: a run the simulated client started records it on its start, a
    /// completion records the worker that reported it, and a timer firing is the server's
    /// doing and names no one; an operator's ledger resolution or redrive records the operator.
    fn check_principal(&self, run: &RunState, event: &HistoryEvent) -> Result<(), Failure> {
        let principal = event.payload.get("principal");
        let client = capstan_engine::Principal::token(SIMULATED_CLIENT).to_json();
        let worker = capstan_engine::Principal::token(SIMULATED_WORKER).to_json();
        let operator = capstan_engine::Principal::token(SIMULATED_OPERATOR).to_json();
        let resolution = event
            .payload
            .get("resolved_by")
            .and_then(|_| event.payload.get("ledger_key"))
            .and_then(Value::as_str)
            .map(|key| {
                run.ledger
                    .get(key)
                    .and_then(|entry| entry.resolution.as_ref())
                    .map(|r| r["principal"].clone())
            });
        let wrong = match event.event_type {
            EventType::WorkflowStarted if self.client_started(run) => principal != Some(&client),
            EventType::WorkflowStarted if run.redriven_from.is_some() => principal != Some(&operator),
            EventType::WorkflowCompleted if run.standalone.is_none() => principal != Some(&worker),
            EventType::TimerFired => principal.is_some(),
            // A confirmed outcome: the operator's resolution records the operator, a probe's
            // verdict no one (the server decided); an entry of an earlier run is not at hand.
            EventType::ActivityCompleted => match resolution {
                Some(Some(resolver)) if resolver == json!(SIMULATED_OPERATOR) => principal != Some(&operator),
                Some(Some(_)) => principal.is_some(),
                Some(None) => principal.is_some_and(|p| p != &operator),
                None => false,
            },
            _ => false,
        };
        if wrong {
            return Err(self.fail(format!(
                "{} {}: {} records principal {principal:?}",
                run.workflow_id,
                run.run_id,
                event.event_type.as_str()
            )));
        }
        Ok(())
    }

    /// Whether the simulated client started the run (the first run of one of its instances).
    fn client_started(&self, run: &RunState) -> bool {
        run.run_number == 1 && self.programs.contains_key(run.workflow_id.as_str())
    }

    pub(crate) async fn check_run(&mut self, run_id: &str) -> Result<(), Failure> {
        let workflow_id = self
            .run_workflows
            .get(run_id)
            .cloned()
            .ok_or_else(|| self.fail(format!("run {run_id} was never seen")))?;
        let run = self
            .store()
            .load_run(NAMESPACE, RunLocator::Run(WorkflowId(workflow_id), RunId(run_id.to_string())))
            .await
            .map_err(|e| self.fail(format!("load: {e}")))?
            .ok_or_else(|| self.fail(format!("run {run_id} is gone")))?;
        let events = self
            .store()
            .history(&run.run_id, 0, run.last_sequence, run.last_sequence as usize + 1)
            .await
            .map_err(|e| self.fail(format!("history: {e}")))?;
        if events.len() as u64 != run.last_sequence {
            return Err(self.fail(format!(
                "{run_id}: {} events stored, the run says {}",
                events.len(),
                run.last_sequence
            )));
        }
        if let Err(sequence) = verify_chain_from(&run.chain_origin, &events) {
            return Err(self.fail(format!("{run_id}: the history chain breaks at event {sequence}")));
        }
        self.check_messages(&run, &events)?;
        self.check_service_calls(run_id, &events)?;
        self.check_output_stream(&run, &events).await?;
        // No acknowledged write lost (across restarts too).
        if let Some((sequence, hash)) = self.acked.get(run_id) {
            match events.get((*sequence as usize).wrapping_sub(1)) {
                Some(event) if &event.hash == hash => {}
                _ if *sequence == 0 => {}
                other => {
                    return Err(self.fail(format!(
                        "{run_id}: acknowledged event {sequence} ({hash}) is not in history (found {:?})",
                        other.map(|e| &e.hash)
                    )))
                }
            }
        }
        // At most one committed terminal fact per durable id.
        let mut terminal: BTreeMap<String, usize> = BTreeMap::new();
        let mut workflow_terminal = 0;
        for (index, event) in events.iter().enumerate() {
            self.check_principal(&run, event)?;
            let id = |key: &str| event.payload.get(key).and_then(Value::as_str).unwrap_or("").to_string();
            let key = match event.event_type {
                EventType::ActivityCompleted | EventType::ActivityFailed | EventType::ActivityTimedOut | EventType::ActivityCancelled => {
                    Some(format!("activity {}", id("activity_execution_id")))
                }
                EventType::ActivityCancellationAcknowledged => Some(format!("stop of attempt {}", id("activity_attempt_id"))),
                EventType::CooperativeCancellationDelivered => Some("cancellation delivery".to_string()),
                EventType::TimerFired => Some(format!("timer {}", id("timer_id"))),
                EventType::ChildRunCompleted | EventType::ChildRunFailed | EventType::ChildRunCancelled | EventType::ChildRunTerminated => {
                    Some(format!("child {}", id("child_call_id")))
                }
                EventType::UpdateAccepted => Some(format!("update acceptance {}", id("update_id"))),
                EventType::UpdateCompleted => Some(format!("update outcome {}", id("update_id"))),
                EventType::SignalReceived => Some(format!(
                    "signal {}",
                    event.workflow_command_id.as_ref().map(|c| c.as_str()).unwrap_or("")
                )),
                EventType::WorkflowCompleted
                | EventType::WorkflowFailed
                | EventType::WorkflowCancelled
                | EventType::WorkflowTerminated
                | EventType::WorkflowTimedOut
                | EventType::WorkflowContinuedAsNew => {
                    workflow_terminal += 1;
                    if index + 1 != events.len() && workflow_terminal == 1 {
                        // Nothing follows a run's close but archive bookkeeping.
                        let after: Vec<&str> = events[index + 1..].iter().map(|e| e.event_type.as_str()).collect();
                        if after
                            .iter()
                            .any(|t| !matches!(*t, "ArchiveRequested" | "WorkflowArchived" | "ParentClosePolicyApplied"))
                        {
                            return Err(self.fail(format!("{run_id}: events after the run closed: {after:?}")));
                        }
                    }
                    None
                }
                _ => None,
            };
            if let Some(key) = key {
                *terminal.entry(key).or_default() += 1;
            }
        }
        // A prepared local attempt ends once: a result, a failure, a timeout, a retry or a stop.
        let mut attempt_ends: BTreeMap<&str, usize> = BTreeMap::new();
        for event in &events {
            let ends = matches!(
                event.event_type,
                EventType::ActivityCompleted
                    | EventType::ActivityFailed
                    | EventType::ActivityTimedOut
                    | EventType::ActivityCancelled
                    | EventType::ActivityRetryScheduled
            );
            let local = event.payload.get("execution_mode").and_then(Value::as_str) == Some("local");
            if let (true, true, Some(attempt)) = (ends, local, event.payload.get("activity_attempt_id").and_then(Value::as_str)) {
                *attempt_ends.entry(attempt).or_default() += 1;
            }
        }
        if let Some((attempt, count)) = attempt_ends.iter().find(|(_, count)| **count > 1) {
            return Err(self.fail(format!("{run_id}: local attempt {attempt} ended {count} times")));
        }
        if workflow_terminal > 1 {
            return Err(self.fail(format!("{run_id}: {workflow_terminal} terminal workflow events")));
        }
        if let Some((key, count)) = terminal.iter().find(|(_, count)| **count > 1) {
            return Err(self.fail(format!("{run_id}: {count} terminal facts for {key}")));
        }
        // An update's outcome follows its acceptance, and a closed run has no update left open.
        for key in terminal.keys().filter_map(|k| k.strip_prefix("update outcome ")) {
            if !terminal.contains_key(&format!("update acceptance {key}")) {
                return Err(self.fail(format!("{run_id}: update {key} completed without being accepted")));
            }
        }
        if run.is_closed() {
            if let Some((id, _)) = run.updates.iter().find(|(_, u)| u.status == UpdateStatus::Accepted) {
                return Err(self.fail(format!("{run_id}: closed with update {id} still accepted")));
            }
        }
        // A redriven run copies the steps before its resume step and schedules none of them.
        if let Some(redrive) = &run.redriven_from {
            let resume = u64::from(redrive.resume_step_sequence);
            let step = |e: &HistoryEvent| e.payload.get("sequence").and_then(Value::as_u64).unwrap_or(0);
            let copied = events.iter().filter(|e| e.payload.contains_key("reused_from_run_id")).count() as u64;
            let rerun = events
                .iter()
                .any(|e| e.event_type == EventType::ActivityScheduled && step(e) < resume);
            if copied + 1 != resume || rerun {
                return Err(self.fail(format!(
                    "{run_id}: redriven at step {resume} with {copied} copied steps, rerun: {rerun}"
                )));
            }
        }
        // No automatic retry of a step whose outcome is unknown.
        for execution in run.activities.values() {
            let started = events
                .iter()
                .filter(|e| {
                    e.event_type == EventType::ActivityStarted
                        && e.payload.get("activity_execution_id").and_then(Value::as_str) == Some(execution.id.as_str())
                })
                .count();
            // One block per unknown dispatch: a resolution (an operator's or a probe's) may
            // retry the step once, and its new dispatch may become unknown in turn.
            let Some(ledger_key) = &execution.blocked_by else { continue };
            let key = format!("{}:{ledger_key}", execution.id);
            {
                match self.blocked.get(&key) {
                    Some(before) if started > *before => {
                        return Err(self.fail(format!(
                            "{run_id}: activity {key} was retried ({before} → {started} starts) while its outcome was unknown"
                        )))
                    }
                    Some(_) => {}
                    None => {
                        self.blocked.insert(key, started);
                    }
                }
            }
        }
        Ok(())
    }
}
