//! Operators importing closed runs by DW's embedded-v2 contract (`docs/import.md`). A closed
//! run's history is copied in under a new instance id, as a bundle from another server would
//! bring it. The copy must hold exactly the source's events, chained from the bundle's
//! checksum, once, whatever restarts and power cuts follow; importing the same bundle again
//! changes nothing. An open run is rebuilt from its history alone (as one from DW's embedded
//! runtime is) and must come out as the run it is.

use crate::report::Failure;
use crate::workload::NAMESPACE;
use crate::world::{Acted, World};
use capstan_app::imports::{import_run, ImportRequest, ImportVerdict};
use capstan_engine::import::{continuation_of, ImportStamp, ImportedRun, InFlight, OpenRunSections, CONTRACT_VERSION, IMPORT_SOURCE};
use capstan_engine::{verify_chain_from, Cx, EventType, HistoryEvent, Limits, RunId, RunState, SequentialIds, WorkflowId};
use capstan_store::{RunLocator, RunStore};
use rand::Rng;

/// One import acknowledged: the bundle (to send again) and what the copy must hold.
struct Acknowledged {
    bundle: ImportedRun,
    /// The source's events as `(id, type, payload, recorded_at)`.
    facts: Vec<String>,
}

/// The imports operators made.
#[derive(Default)]
pub(crate) struct Imports {
    acknowledged: Vec<Acknowledged>,
}

impl Imports {
    /// An operator imports a copy of a closed run, or sends an earlier import again.
    pub(crate) async fn import_one(&mut self, world: &mut World) -> Result<Acted, Failure> {
        if !self.acknowledged.is_empty() && world.rng.random_bool(0.3) {
            let index = world.rng.random_range(0..self.acknowledged.len());
            let bundle = self.acknowledged[index].bundle.clone();
            return match send(world, bundle).await? {
                Some(ImportVerdict::AlreadyImported(_)) => {
                    world.counters.imports[1] += 1;
                    Ok(Acted::Done)
                }
                other => Err(world.fail(format!("a repeated import was not answered as one: {other:?}"))),
            };
        }
        let instances: Vec<String> = world.seen.instances.iter().cloned().collect();
        if instances.is_empty() {
            return Ok(Acted::Idle);
        }
        let source_id = instances[world.rng.random_range(0..instances.len())].clone();
        let Some(source) = world.current_run(&source_id).await? else {
            return Ok(Acted::Idle);
        };
        if !source.is_closed() {
            return rebuild_matches(world, &source).await;
        }
        let events = world
            .store()
            .history(&source.run_id, 0, source.last_sequence, 100_000)
            .await
            .map_err(|e| world.fail(format!("history: {e}")))?;
        let copy = self.acknowledged.len() + 1;
        let bundle = bundle_of(&source, &events, copy);
        world.trace(|| format!("operator imports {} as {}", source.run_id.as_str(), bundle.workflow_id.as_str()));
        match send(world, bundle.clone()).await? {
            Some(ImportVerdict::Imported(_)) => {
                world.counters.imports[0] += 1;
                self.acknowledged.push(Acknowledged {
                    bundle,
                    facts: events.iter().map(fact).collect(),
                });
                Ok(Acted::Done)
            }
            other => Err(world.fail(format!("a closed run's bundle was not imported: {other:?}"))),
        }
    }

    /// Every acknowledged import is there, whole: the source's events, chained from the
    /// bundle's checksum.
    pub(crate) async fn check(&self, world: &World) -> Result<(), Failure> {
        for acknowledged in &self.acknowledged {
            let bundle = &acknowledged.bundle;
            let locator = RunLocator::Run(bundle.workflow_id.clone(), bundle.run_id.clone());
            let copy = world
                .store()
                .load_run(NAMESPACE, locator)
                .await
                .map_err(|e| world.fail(format!("load: {e}")))?;
            let Some(copy) = copy else {
                return Err(world.fail(format!("the acknowledged import {} is gone", bundle.workflow_id.as_str())));
            };
            let events = world
                .store()
                .history(&copy.run_id, 0, copy.last_sequence, 100_000)
                .await
                .map_err(|e| world.fail(format!("history: {e}")))?;
            let facts: Vec<String> = events.iter().map(fact).collect();
            // An archive batch may have archived the copy since: its bookkeeping follows.
            let archiving = events
                .iter()
                .skip(acknowledged.facts.len())
                .all(|e| matches!(e.event_type, EventType::ArchiveRequested | EventType::WorkflowArchived));
            if !facts.starts_with(&acknowledged.facts) || !archiving || copy.status != bundle.status {
                return Err(world.fail(format!(
                    "the import {} does not hold its source's history",
                    bundle.workflow_id.as_str()
                )));
            }
            if let Err(sequence) = verify_chain_from(&bundle.stamp.bundle_checksum, &events) {
                return Err(world.fail(format!("the import {}'s chain breaks at {sequence}", bundle.workflow_id.as_str())));
            }
        }
        Ok(())
    }
}

/// An open run, where no lease is held, imported without the state Capstan kept (as DW's
/// embedded runtime exports one) is rebuilt from its history and sections to the run it is, or
/// refused by a named rule for what cannot be rebuilt. Only the engine's transition runs: the
/// rebuilt run is compared, not written.
async fn rebuild_matches(world: &mut World, source: &RunState) -> Result<Acted, Failure> {
    // Declared actions are Capstan's own (a run from DW has none): their pins and ledger live
    // beside history, so a Capstan run that uses them moves with its carried state instead.
    let declared_actions = source.activities.values().any(|a| a.action.is_some()) || !source.ledger.is_empty();
    if declared_actions || source.tasks.values().any(|task| !task.is_ready()) || !source.deferred_signals.is_empty() {
        return Ok(Acted::Idle);
    }
    let events = world
        .store()
        .history(&source.run_id, 0, source.last_sequence, 100_000)
        .await
        .map_err(|e| world.fail(format!("history: {e}")))?;
    let mut bundle = ImportedRun::copy_of(source, &events, source.workflow_id.clone(), source.run_id.clone(), stamp_of(source));
    bundle.sections = OpenRunSections::of(source);
    let mut ids = SequentialIds::new("rebuild");
    let limits = Limits::default();
    let mut cx = Cx::new(world.now, &mut ids, &limits);
    match capstan_engine::import_run(&mut cx, bundle, &InFlight::default()) {
        Ok(rebuilt) if continuation_of(&rebuilt) == continuation_of(source) => {
            world.counters.imports[2] += 1;
            Ok(Acted::Done)
        }
        Ok(rebuilt) => Err(world.fail(format!(
            "the open run {} rebuilt from its history differs from it: {} vs {}",
            source.run_id.as_str(),
            continuation_of(&rebuilt),
            continuation_of(source)
        ))),
        Err(refusal) if REBUILD_REFUSALS.contains(&refusal.details.get("rule").and_then(|r| r.as_str()).unwrap_or_default()) => {
            Ok(Acted::Done)
        }
        Err(refusal) => Err(world.fail(format!("an open run's rebuild was refused: {refusal:?}"))),
    }
}

/// What a rebuild may refuse: a feature whose state history does not hold.
const REBUILD_REFUSALS: [&str; 1] = ["workflow.open_feature_unsupported"];

async fn send(world: &mut World, bundle: ImportedRun) -> Result<Option<ImportVerdict>, Failure> {
    let request = ImportRequest {
        import_id: Some(format!("sim-{}", bundle.run_id.as_str())),
        run: bundle,
        in_flight: InFlight {
            history_complete: true,
            ..InFlight::default()
        },
        integrity_errors: Vec::new(),
        principal: Some(capstan_engine::Principal::token(crate::workload::SIMULATED_OPERATOR)),
        dry_run: false,
    };
    let verdict = import_run(&world.app, request).await;
    world.declined(verdict)
}

fn fact(event: &HistoryEvent) -> String {
    let payload = serde_json::to_string(&event.payload).unwrap_or_default();
    format!(
        "{} {} {} {payload}",
        event.id.as_str(),
        event.event_type.as_str(),
        event.recorded_at
    )
}

/// The closed run as a bundle from another server brings it, under a new instance id.
fn bundle_of(source: &RunState, events: &[HistoryEvent], copy: usize) -> ImportedRun {
    let workflow_id = WorkflowId(format!("{}.copy{copy}", source.workflow_id.as_str()));
    let mut bundle = ImportedRun::copy_of(
        source,
        events,
        workflow_id,
        RunId(format!("{}.c{copy}", source.run_id.as_str())),
        stamp_of(source),
    );
    // A copy is run 1 of its own instance, pinned to no build.
    bundle.run_number = 1;
    bundle.compatibility = None;
    bundle
}

fn stamp_of(source: &RunState) -> ImportStamp {
    ImportStamp {
        source: IMPORT_SOURCE.into(),
        import_id: String::new(),
        dedupe_key: format!("{}:{}", source.run_id.as_str(), source.last_sequence),
        contract_version: CONTRACT_VERSION,
        imported_at: 0,
        source_runtime: "capstan".into(),
        // The source's head hash stands in for the bundle's checksum: 64 hex digits, and the
        // copy's chain must start from it.
        bundle_checksum: source.last_hash.clone(),
        source_namespace: Some(NAMESPACE.into()),
        imported_by: None,
    }
}
