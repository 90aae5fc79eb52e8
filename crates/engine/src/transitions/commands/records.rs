//! Commands that only record a fact in history: side effects, version markers, search
//! attribute and memo upserts.

use crate::transitions::commands::At;
use crate::transitions::{events, invalid};
use crate::{Cx, EventType, Payload, Refusal, RunState, StepTags};
use serde_json::{Map, Value};
use std::ops::RangeInclusive;

/// `SideEffectRecorded`.
pub(super) fn record_side_effect(
    run: &mut RunState,
    cx: &mut Cx,
    at: At,
    result: Payload,
    tags: StepTags,
    stream: Option<crate::workflow_stream::StreamDirective>,
) {
    let At { step, task: wt } = at;
    let payload = events::side_effect_recorded(step, &result, &tags);
    run.append(cx, EventType::SideEffectRecorded, payload, wt, None);
    // The directive is applied by the store in this transaction (its items are rows of their
    // own); a refusal there refuses the whole completion.
    if let Some(directive) = stream {
        cx.effects
            .stream_ops
            .push(crate::workflow_stream::StreamOp { directive, at: cx.now });
    }
}

/// `VersionMarkerRecorded` (validation already checked that `supported` holds `version`).
pub(super) fn record_version_marker(
    run: &mut RunState,
    cx: &mut Cx,
    at: At,
    change_id: String,
    version: i64,
    supported: RangeInclusive<i64>,
    tags: StepTags,
) {
    let At { step, task: wt } = at;
    let payload = events::version_marker_recorded(step, &change_id, version, supported.into_inner(), &tags);
    run.append(cx, EventType::VersionMarkerRecorded, payload, wt, None);
}

/// Merges the attributes into the run's (null removes one): `SearchAttributesUpserted`.
pub(super) fn upsert_search_attributes(
    run: &mut RunState,
    cx: &mut Cx,
    at: At,
    attributes: Map<String, Value>,
    attribute_types: Option<Map<String, Value>>,
    tags: StepTags,
) {
    let At { step, task: wt } = at;
    for (key, value) in &attributes {
        if value.is_null() {
            run.search_attributes.remove(key);
        } else {
            run.search_attributes.insert(key.clone(), value.clone());
        }
    }
    let mut payload = events::search_attributes_upserted(step, &attributes, &run.search_attributes, &tags);
    if let Some(types) = attribute_types {
        payload.insert("attribute_types".into(), Value::Object(types));
    }
    run.append(cx, EventType::SearchAttributesUpserted, payload, wt, None);
}

/// Merges memo entries through the server's codec: `MemoUpserted`.
pub(super) fn upsert_memo(run: &mut RunState, cx: &mut Cx, at: At, entries: Payload, tags: StepTags) -> Result<(), Refusal> {
    let At { step, task: wt } = at;
    let codec = cx.memo.ok_or_else(|| invalid("This server cannot merge memos."))?;
    let base = match &run.memo_merged {
        Some(merged) => crate::memo::MemoBase::Merged(merged),
        None => crate::memo::MemoBase::Start(&run.memo),
    };
    let merged = codec
        .merge(base, &entries)
        .map_err(|reason| invalid(format!("upsert_memo: {reason}")))?;
    let payload = events::memo_upserted(step, &entries, &merged.merged, &tags);
    run.memo = merged.projection;
    run.memo_merged = Some(merged.merged);
    run.append(cx, EventType::MemoUpserted, payload, wt, None);
    Ok(())
}
