//! Importing a run from a history bundle (DW's embedded-v2 import contract,
//! `capstan_engine::import`): the contract's rules, then one store transaction.

use crate::{AppResult, Services};
use capstan_engine::import::{eligibility, Finding, ImportedRun, InFlight};
use capstan_engine::{Reason, RunState};
use capstan_store::prelude::*;
use capstan_store::{ImportOutcome, StoreError};

/// A bundle read by the caller, with what its integrity check found.
pub struct ImportRequest {
    pub run: ImportedRun,
    pub in_flight: InFlight,
    /// Errors of the bundle's integrity and shape checks: each refuses the import.
    pub integrity_errors: Vec<Finding>,
    /// The caller's id for this import; a new one when `None`.
    pub import_id: Option<String>,
    /// Who imports it, as the server authenticated them (kept on the run's stamp).
    pub principal: Option<capstan_engine::Principal>,
    pub dry_run: bool,
}

/// How an import ended, in the contract's terms.
#[derive(Debug)]
pub enum ImportVerdict {
    Imported(RunState),
    AlreadyImported(RunState),
    DryRun(RunState),
    /// A rule of the contract is broken: nothing was written.
    Rejected(Vec<Finding>),
    /// The run id or run number is taken here by another run: nothing was written.
    Conflict(Vec<Finding>),
}

impl ImportVerdict {
    /// DW's report `status`.
    pub fn status(&self) -> &'static str {
        match self {
            ImportVerdict::Imported(_) => "imported",
            ImportVerdict::AlreadyImported(_) => "already_imported",
            ImportVerdict::DryRun(_) => "dry_run",
            ImportVerdict::Rejected(_) | ImportVerdict::Conflict(_) => "rejected",
        }
    }
}

/// Imports the bundle's run unless a rule refuses it; the import is stamped with its id and
/// the time it was made.
pub async fn import_run<V: Services>(services: &V, request: ImportRequest) -> AppResult<ImportVerdict> {
    let ImportRequest {
        mut run,
        in_flight,
        integrity_errors,
        import_id,
        principal,
        dry_run,
    } = request;
    let mut errors = integrity_errors;
    if let Err(crate::AppError::Invalid { message, .. }) =
        crate::search_attributes::check_bounds("workflow.search_attributes", &run.search_attributes)
    {
        errors.push(Finding::new("workflow.search_attributes_invalid", message));
    }
    if !errors.is_empty() {
        // Refused already: the report names the contract's rules the bundle breaks too. (An
        // importable-looking bundle is checked once, by the transition that writes it.)
        errors.extend(eligibility(&run, &in_flight, services.limits().history_events_max as usize));
        return Ok(ImportVerdict::Rejected(errors));
    }
    let now = services.now();
    run.stamp.import_id = import_id.unwrap_or_else(|| services.new_id());
    run.stamp.imported_at = now;
    run.stamp.imported_by = principal.map(|p| p.to_json());
    match services.store().import_run(run, in_flight, now, dry_run).await {
        Ok(ImportOutcome::Imported(run)) => Ok(ImportVerdict::Imported(run)),
        Ok(ImportOutcome::AlreadyImported(run)) => Ok(ImportVerdict::AlreadyImported(run)),
        Ok(ImportOutcome::WouldImport(run)) => Ok(ImportVerdict::DryRun(run)),
        Err(StoreError::Refused(refusal)) if matches!(refusal.reason, Reason::ImportRunConflict | Reason::ImportRejected) => {
            // Both refusals carry every rule broken under `errors`.
            let findings = refusal
                .details
                .get("errors")
                .and_then(|errors| serde_json::from_value::<Vec<Finding>>(errors.clone()).ok())
                .filter(|findings| !findings.is_empty())
                .unwrap_or_else(|| vec![Finding::new("target.conflict", refusal.message.clone())]);
            Ok(if refusal.reason == Reason::ImportRunConflict {
                ImportVerdict::Conflict(findings)
            } else {
                ImportVerdict::Rejected(findings)
            })
        }
        Err(StoreError::Refused(refusal)) if refusal.reason == Reason::WorkflowIdReservedInNamespace => {
            Ok(ImportVerdict::Conflict(vec![Finding::new(
                "target.workflow_id_reserved",
                refusal.message,
            )]))
        }
        Err(error) => Err(error.into()),
    }
}
