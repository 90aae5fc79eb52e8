//! Schedules: creating one and changing it (update, pause, resume, delete) on behalf of a
//! principal, who is recorded on every schedule event the change writes. Firing belongs to the
//! store's scheduler pass; the caller wakes its scheduler after a change that can move the next
//! fire.

use crate::{AppResult, Services};
use capstan_engine::schedule::{ParsedSpec, Schedule, ScheduleFields, ScheduleStatus, SpecError};
use capstan_engine::{Principal, Reason, Refusal};
use capstan_store::prelude::*;
use serde_json::{Map, Value};

/// A schedule to create, its request already validated field by field.
pub struct NewSchedule {
    pub namespace: String,
    pub schedule_id: String,
    pub spec: Map<String, Value>,
    pub action: Map<String, Value>,
    pub fields: ScheduleFields,
    /// Created paused: it fires nothing until resumed.
    pub paused: bool,
    pub principal: Option<Principal>,
}

/// What an operator changes on a schedule.
pub enum ScheduleChange {
    /// The fields the request set; a new spec is parsed before the row is touched.
    Update(Box<ScheduleFields>),
    Pause {
        note: Option<String>,
    },
    /// Resuming an active schedule changes nothing (idempotent).
    Resume {
        note: Option<String>,
    },
    Delete,
}

/// A refused spec as a refusal that keeps the spec's own reason and field
/// (`details.spec_reason`, `details.field`), so the edge can name them.
pub fn spec_refusal(error: SpecError) -> Refusal {
    Refusal::new(Reason::InvalidCommands, error.message)
        .with("spec_reason", error.reason.as_str())
        .with("field", error.field)
}

/// The spec error a refusal from [`spec_refusal`] carries, if it is one.
pub fn spec_error_of(refusal: &Refusal) -> Option<SpecError> {
    let reason = refusal.details.get("spec_reason")?.as_str()?;
    let reason = match Reason::parse(reason) {
        Some(reason @ (Reason::InvalidCronExpression | Reason::InvalidScheduleSpec)) => reason,
        _ => Reason::ValidationFailed,
    };
    let field = refusal.details.get("field").and_then(Value::as_str).unwrap_or("action");
    Some(SpecError {
        reason,
        field: field.to_string(),
        message: refusal.message.clone(),
    })
}

/// Creates a schedule; an id in use is `schedule_already_exists`.
pub async fn create<V: Services>(services: &V, new: NewSchedule) -> AppResult<Schedule> {
    let mut schedule = Schedule::create(
        &new.namespace,
        &new.schedule_id,
        new.spec,
        &new.action,
        new.fields,
        new.paused,
        services.now(),
    )
    .map_err(spec_refusal)?;
    schedule.acting_as(new.principal);
    services.store().create_schedule(schedule.clone()).await?;
    Ok(schedule)
}

/// Changes a live schedule atomically; an unknown or deleted one is `schedule_not_found`.
pub async fn change<V: Services>(
    services: &V,
    namespace: &str,
    schedule_id: &str,
    principal: Option<Principal>,
    change: ScheduleChange,
) -> AppResult<()> {
    if let ScheduleChange::Update(fields) = &change {
        if let Some(spec) = &fields.spec {
            ParsedSpec::parse(spec).map_err(spec_refusal)?;
        }
    }
    let now = services.now();
    let store = services.store();
    store
        .change_schedule(namespace, schedule_id, move |schedule| {
            schedule.acting_as(principal);
            match change {
                ScheduleChange::Update(fields) => return schedule.update(*fields, now).map_err(spec_refusal),
                ScheduleChange::Pause { note } => schedule.pause(note, now),
                ScheduleChange::Resume { note } if schedule.status == ScheduleStatus::Paused => schedule.resume(note, now),
                ScheduleChange::Resume { .. } => {}
                ScheduleChange::Delete => schedule.delete("deleted", now),
            }
            Ok(())
        })
        .await?;
    Ok(())
}
