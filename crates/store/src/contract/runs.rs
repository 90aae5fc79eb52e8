//! Runs: starting them, changing them through engine transitions, reading them back.

use crate::backend::Backend;
use crate::logic::{audit, imports, ledger_reads, listing, locate, run_counts, runs};
use crate::*;
use serde_json::Value;
use std::sync::Arc;

/// Runs: start, transitions (plain and keyed), reads, listings.
pub trait RunStore: Backend {
    /// This store (and every clone of it) reporting committed facts and commit times to
    /// `observer` from now on.
    fn with_observer(self, observer: std::sync::Arc<dyn Observer>) -> Self
    where
        Self: Sized,
    {
        self.env().observer.set(observer);
        self
    }

    /// This store with `codec` for the payloads its transitions read and write on their own
    /// (a reconciliation probe's question and answer). Call it before the store is used.
    fn with_payload_codec(mut self, codec: &'static dyn MemoCodec) -> Self
    where
        Self: Sized,
    {
        let env = self.env_mut();
        *env = Arc::new(Env {
            codec: Some(codec),
            ..Env::clone(env)
        });
        self
    }

    /// Starts run 1 of a new instance, honouring the duplicate policy and the global reservation
    /// of workflow ids.
    fn start_workflow(
        &self,
        start: StartRun,
        policy: DuplicatePolicy,
        now: Millis,
    ) -> impl Future<Output = StoreResult<(StartOutcome, RunState)>> + Send {
        let env = self.env().clone();
        self.write_guarded(move |tx| Box::pin(async move { runs::start_workflow(tx, start, policy, now, &env).await }))
    }

    /// Starts a standalone activity's host run: run 1 of a new id, or the next run of an id
    /// whose last activity has ended.
    fn start_standalone_activity(&self, start: StartStandaloneActivity, now: Millis) -> impl Future<Output = StoreResult<RunState>> + Send {
        let env = self.env().clone();
        self.write_guarded(move |tx| Box::pin(async move { runs::start_standalone_activity(tx, start, now, &env).await }))
    }

    /// Imports a run from a history bundle (`capstan_engine::import`: a closed run, or an open
    /// one with the state its Capstan source kept) in one transaction: its instance is created
    /// or locked, the run written with its copied history and made current when it is the
    /// instance's latest. The same bundle again (run id and
    /// dedupe key) changes nothing; a run id or run number taken otherwise is refused
    /// (`import_run_conflict`). `dry_run`: every check, and nothing written.
    fn import_run(
        &self,
        run: capstan_engine::import::ImportedRun,
        in_flight: capstan_engine::import::InFlight,
        now: Millis,
        dry_run: bool,
    ) -> impl Future<Output = StoreResult<ImportOutcome>> + Send {
        let env = self.env().clone();
        self.write_guarded(move |tx| Box::pin(async move { imports::import_run(tx, run, in_flight, now, dry_run, &env).await }))
    }

    /// Runs one engine transition on one run, atomically and durably.
    fn mutate_run<T, F>(
        &self,
        namespace: &str,
        locator: RunLocator,
        now: Millis,
        transition: F,
    ) -> impl Future<Output = StoreResult<(T, RunState)>> + Send
    where
        T: Send + 'static,
        F: FnOnce(&mut RunState, &mut Cx) -> Result<T, Refusal> + Send + 'static,
    {
        let namespace = namespace.to_string();
        let env = self.env().clone();
        self.write_guarded(move |tx| Box::pin(async move { runs::mutate(tx, &namespace, &locator, now, &env, transition).await }))
    }

    /// Every run, in run-id order, a page at a time (for offline verification):
    /// `(namespace, workflow id, run id)` after `after`.
    fn runs_page(&self, after: Option<RunId>, limit: usize) -> impl Future<Output = StoreResult<Vec<(String, WorkflowId, RunId)>>> + Send {
        let after = after.map(|r| r.as_str().to_string()).unwrap_or_default();
        self.read(move |tx| Box::pin(async move { ledger_reads::runs_page(tx, &after, limit).await }))
    }

    /// The receipt stored for a keyed command, if any: `(intent_hash, receipt)`. Lets a handler
    /// skip work a retry must not repeat (an update's validation) before `mutate_run_keyed`.
    fn retained_command(
        &self,
        namespace: &str,
        workflow_id: &WorkflowId,
        command_type: &str,
        request_id: &str,
    ) -> impl Future<Output = StoreResult<Option<(String, Value)>>> + Send {
        let (namespace, workflow_id) = (namespace.to_string(), workflow_id.clone());
        let (command_type, request_id) = (command_type.to_string(), request_id.to_string());
        self.read(move |tx| {
            Box::pin(async move { ledger_reads::retained_command(tx, &namespace, &workflow_id, &command_type, &request_id).await })
        })
    }

    /// Like `mutate_run` for a control-plane command with a caller `request_id`: the first call
    /// applies and stores `render(result)`; a repeat with the same intent returns that stored
    /// receipt; a repeat with another intent is a `request_id_conflict`.
    fn mutate_run_keyed<T, F, R>(
        &self,
        namespace: &str,
        locator: RunLocator,
        key: CommandKey,
        now: Millis,
        transition: F,
        render: R,
    ) -> impl Future<Output = StoreResult<(KeyedReceipt<T>, Option<RunState>)>> + Send
    where
        T: Send + 'static,
        F: FnOnce(&mut RunState, &mut Cx) -> Result<T, Refusal> + Send + 'static,
        R: FnOnce(&T, &RunState) -> Value + Send + 'static,
    {
        let namespace = namespace.to_string();
        let env = self.env().clone();
        self.write_guarded(move |tx| {
            Box::pin(async move {
                runs::mutate_keyed(
                    tx,
                    runs::KeyedCommand {
                        namespace: &namespace,
                        locator: &locator,
                        key: &key,
                    },
                    now,
                    &env,
                    transition,
                    render,
                )
                .await
            })
        })
    }

    fn load_run(&self, namespace: &str, locator: RunLocator) -> impl Future<Output = StoreResult<Option<RunState>>> + Send {
        let namespace = namespace.to_string();
        self.read_guarded(move |tx| Box::pin(async move { locate::load_run(tx, &namespace, &locator).await }))
    }

    /// Appends an event to its instance's audit trail.
    fn record_audit(&self, event: AuditEvent) -> impl Future<Output = StoreResult<()>> + Send {
        self.write(move |tx| Box::pin(async move { audit::record_audit(tx, &event).await }))
    }

    /// An instance's audit events, newest first, strictly older than `before` (`(recorded_at,
    /// audit_id)` of the last one seen), at most `limit`.
    fn audit_events(
        &self,
        namespace: &str,
        workflow_id: &str,
        before: Option<(Millis, String)>,
        limit: usize,
    ) -> impl Future<Output = StoreResult<Vec<AuditEvent>>> + Send {
        let (namespace, workflow_id) = (namespace.to_string(), workflow_id.to_string());
        self.read(move |tx| Box::pin(async move { audit::audit_events(tx, &namespace, &workflow_id, before, limit).await }))
    }

    /// Events with `after < sequence <= upto`, at most `limit`, in order.
    fn history(&self, run_id: &RunId, after: u64, upto: u64, limit: usize) -> impl Future<Output = StoreResult<Vec<HistoryEvent>>> + Send {
        let run_id = run_id.clone();
        self.read(move |tx| Box::pin(async move { runs::history(tx, &run_id, after, upto, limit).await }))
    }

    /// The same events as stored ([`StoredEvent`]): served without being parsed and rendered
    /// again.
    fn stored_history(
        &self,
        run_id: &RunId,
        after: u64,
        upto: u64,
        limit: usize,
    ) -> impl Future<Output = StoreResult<Vec<StoredEvent>>> + Send {
        let run_id = run_id.clone();
        self.read(move |tx| Box::pin(async move { runs::stored_history(tx, &run_id, after, upto, limit).await }))
    }

    /// Runs newest first; returns the page and whether more follow.
    fn list_runs(
        &self,
        namespace: &str,
        filter: ListFilter,
        offset: usize,
        limit: usize,
    ) -> impl Future<Output = StoreResult<(Vec<RunSummary>, bool)>> + Send {
        let namespace = namespace.to_string();
        self.read(move |tx| Box::pin(async move { listing::list_runs(tx, &namespace, &filter, offset, limit).await }))
    }

    /// How many current runs match `filter`, per status bucket.
    fn count_runs(&self, namespace: &str, filter: ListFilter) -> impl Future<Output = StoreResult<RunCounts>> + Send {
        let namespace = namespace.to_string();
        self.read(move |tx| Box::pin(async move { listing::count_runs(tx, &namespace, &filter).await }))
    }

    /// Where the kept run counts differ from a full count of the runs, in `namespace` or in
    /// every namespace: empty when they are exact. Reads every run.
    fn run_count_drift(&self, namespace: Option<&str>) -> impl Future<Output = StoreResult<Vec<CountDrift>>> + Send {
        let namespace = namespace.map(str::to_string);
        self.read(move |tx| Box::pin(async move { run_counts::drift(tx, namespace.as_deref()).await }))
    }

    /// Current runs per namespace and class (`open`, `paused`, or a closed status), from the
    /// kept counts.
    fn current_run_classes(&self) -> impl Future<Output = StoreResult<Vec<(String, String, i64)>>> + Send {
        self.read(move |tx| Box::pin(async move { run_counts::current_by_namespace(tx).await }))
    }

    /// Rebuilds the kept run counts from a full count (a repair); how many keys were wrong.
    fn recount_runs(&self, namespace: Option<&str>) -> impl Future<Output = StoreResult<usize>> + Send {
        let namespace = namespace.map(str::to_string);
        self.write(move |tx| Box::pin(async move { run_counts::rebuild(tx, namespace.as_deref()).await }))
    }

    /// All runs of an instance, oldest first.
    fn runs_of(&self, namespace: &str, workflow_id: &WorkflowId) -> impl Future<Output = StoreResult<Vec<RunSummary>>> + Send {
        let (namespace, workflow_id) = (namespace.to_string(), workflow_id.clone());
        self.read(move |tx| Box::pin(async move { runs::runs_of(tx, &namespace, &workflow_id).await }))
    }
}

impl<B: Backend> RunStore for B {}
