//! The filter a listing, its counts and a batch operation share: a type, a queue, a status
//! bucket, and a query (a visibility filter in the listing grammar, or free text matched
//! against workflow ids and business keys, as in DW).

use crate::{AppError, AppResult, Services};
use capstan_engine::{visibility, Refusal};
use capstan_store::prelude::*;
use capstan_store::ListFilter;
use serde::{Deserialize, Serialize};

/// What a caller asks to list, as given.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ListQuery {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workflow_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_queue: Option<String>,
    /// `running`, `completed`, `failed` or `paused`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub query: Option<String>,
}

pub const STATUS_BUCKETS: [&str; 4] = ["running", "completed", "failed", "paused"];

/// The store's filter for `query`: the visibility filter parsed and type-checked against the
/// namespace's search attributes (refused with the grammar's reason, naming `query`).
pub async fn filter<V: Services>(services: &V, namespace: &str, query: &ListQuery) -> AppResult<ListFilter> {
    let status_bucket = match query.status.as_deref().filter(|s| !s.is_empty()) {
        None => None,
        Some(bucket) if STATUS_BUCKETS.contains(&bucket) => Some(bucket.to_string()),
        Some(_) => return Err(AppError::invalid("status", "status must be running, completed, failed or paused.")),
    };
    let mut filter = ListFilter {
        workflow_type: query.workflow_type.clone().filter(|s| !s.is_empty()),
        task_queue: query.task_queue.clone().filter(|s| !s.is_empty()),
        status_bucket,
        ..ListFilter::default()
    };
    if let Some(text) = query.query.as_ref().filter(|s| !s.trim().is_empty()) {
        if visibility::looks_like_filter(text) {
            let schema = services.store().search_attribute_definitions(namespace).await?;
            let parsed = visibility::parse_filter(text, &schema)
                .map_err(|e| AppError::Store(Refusal::new(e.reason, e.message).with("field", "query").into()))?;
            filter.filter = Some(parsed);
        } else {
            filter.query = Some(text.clone());
        }
    }
    Ok(filter)
}
