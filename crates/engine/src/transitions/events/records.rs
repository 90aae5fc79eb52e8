//! Facts a workflow records at a step: side effects, version markers, search attribute and memo
//! upserts; and the cancellation of a selection member.

use crate::transitions::events::{payload_json, tagged};
use crate::transitions::iso8601;
use crate::{Millis, Payload, SelectionCancel, StepTags};
use serde_json::{json, Map, Value};

/// `SideEffectRecorded`.
pub(in crate::transitions) fn side_effect_recorded(step: u32, result: &Payload, tags: &StepTags) -> Map<String, Value> {
    tagged(
        obj!("sequence" => step, "result" => result.blob_value(), "payload_codec" => result.codec),
        tags,
    )
}

/// `VersionMarkerRecorded`.
pub(in crate::transitions) fn version_marker_recorded(
    step: u32,
    change_id: &str,
    version: i64,
    (min_supported, max_supported): (i64, i64),
    tags: &StepTags,
) -> Map<String, Value> {
    let payload = obj!(
        "sequence" => step,
        "change_id" => change_id,
        "version" => version,
        "min_supported" => min_supported,
        "max_supported" => max_supported,
    );
    tagged(payload, tags)
}

/// `SearchAttributesUpserted`: the upsert and the run's attributes after it.
pub(in crate::transitions) fn search_attributes_upserted(
    step: u32,
    attributes: &Map<String, Value>,
    merged: &Map<String, Value>,
    tags: &StepTags,
) -> Map<String, Value> {
    tagged(obj!("sequence" => step, "attributes" => attributes, "merged" => merged), tags)
}

/// `MemoUpserted`: the entries and the run's memo after the merge, both encoded.
pub(in crate::transitions) fn memo_upserted(step: u32, entries: &Payload, merged: &Payload, tags: &StepTags) -> Map<String, Value> {
    let payload = obj!(
        "sequence" => step,
        "entries" => payload_json(entries),
        "merged" => payload_json(merged),
    );
    tagged(payload, tags)
}

/// `SelectionOperationCancelled`: the marker that is the cancelled member's outcome.
pub(in crate::transitions) fn selection_operation_cancelled(cancel: &SelectionCancel, cancelled_at: Millis) -> Map<String, Value> {
    obj!(
        "selection_group_id" => cancel.selection_group_id,
        "member_key" => cancel.member_key,
        "member_index" => cancel.member_index,
        "member_base_sequence" => cancel.member_base_sequence,
        "member_size" => cancel.member_size,
        "operation_kind" => cancel.operation_kind,
        "operation_identity" => cancel.operation_identity,
        "cancelled_at" => iso8601(cancelled_at),
    )
}
