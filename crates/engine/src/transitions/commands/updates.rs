//! `complete_update` and `fail_update`: an update handler's result.

use super::*;

pub(in crate::transitions) fn accepted_update(run: &RunState, update_id: &str) -> Result<UpdateRecord, Refusal> {
    match run.updates.get(update_id) {
        Some(record) if record.status == UpdateStatus::Accepted => Ok(record.clone()),
        Some(_) => Err(invalid(format!("Update {update_id} is already settled."))),
        None => Err(invalid(format!("Update {update_id} is not known on this run."))),
    }
}
