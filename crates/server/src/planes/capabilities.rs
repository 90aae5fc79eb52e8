//! What this server advertises to workers: in cluster info and in every worker-plane response.

use crate::wire::SUPPORTED_COMMANDS;
use capstan_app::updates;
use serde_json::{json, Value};

/// What this server implements, advertised to workers (cluster info and every worker response).
pub fn server_capabilities() -> Value {
    json!({
        "long_poll_timeout": 30,
        "supported_workflow_task_commands": SUPPORTED_COMMANDS,
        "workflow_task_poll_request_idempotency": true,
        "history_page_size_default": 500,
        "history_page_size_max": 1000,
        "query_tasks": true,
        "activity_retry_policy": true,
        "activity_timeouts": true,
        "non_retryable_failures": true,
        "workflow_memo_updates": {"supported": true},
        "update_validation_tasks": true,
        "cooperative_cancellation": true,
        // Delivery at a waited-on Nexus call cancels the call (and, by policy, its linked run).
        "nexus_cooperative_cancellation": true,
        "nexus_cooperative_cancellation_binding_kinds": ["workflow_run"],
        "query_task_authority": true,
        "activity_lease_renewal": true,
        "prepared_local_activities": true,
        "prepared_local_activity_groups": true,
        "prepared_local_activity_cancellation_policies": ["try_cancel", "wait_cancellation_completed"],
        // Exactly as both SDKs validate it (every key, value and JSON type).
        "observability_context": {
            "supported": true,
            "schema": capstan_engine::trace::TRACE_CONTEXT_SCHEMA,
            "version": capstan_engine::trace::TRACE_CONTEXT_VERSION,
            "dispatch_schema": "durable-workflow.queue-trace",
            "links_schema": "durable-workflow.trace-links",
            "max_context_bytes": capstan_engine::trace::MAX_CONTEXT_BYTES,
            "max_links": 32,
            "max_links_bytes": 4096,
        },
        "worker_deregistration_fencing": {
            "supported": true,
            "schema": "durable-workflow.v2.worker-deregistration.v1",
            "endpoint": "/worker/registrations/{workerId}/deregister",
            "receipt_retention_seconds": capstan_store::DEREGISTRATION_RECEIPT_RETENTION_MS / 1000,
        },
        "synchronous_update_validation": update_validation(),
        "sticky_execution": {
            "supported": true,
            "feature": "sticky_execution",
            "correctness_fallback": "cold_replay",
            "routing_identity": "worker_id",
            "replay_modes": ["sticky_hit_expected", "cold_replay", "forced_cold_replay"],
            "max_ttl_seconds": capstan_engine::sticky::STICKY_TTL_SECONDS_MAX,
            "hold_seconds": capstan_engine::sticky::STICKY_HOLD_MS / 1000,
        },
        "task_queue_priority_fairness": priority_fairness(),
    })
}

/// DW's task-queue priority and fairness contract (version 1), as this server keeps it.
fn priority_fairness() -> Value {
    use capstan_engine::scheduling::*;
    let fields = ["priority", "fairness_key", "fairness_weight"];
    json!({
        "schema": "durable-workflow.v2.task-queue-priority-fairness.contract",
        "version": 1,
        "authority_doc": "docs/architecture/task-queue-priority-fairness.md",
        "feature": "task_queue_priority_fairness",
        "fields": {
            "priority": {
                "type": "integer", "min": PRIORITY_MIN, "min_user": PRIORITY_MIN_USER, "max": PRIORITY_MAX,
                "default": PRIORITY_DEFAULT, "lower_is_more_urgent": true,
                "description": "Dispatch urgency: lower numbers are offered to pollers first.",
            },
            "fairness_key": {
                "type": "string", "nullable": true, "max_length": FAIRNESS_KEY_MAX, "pattern": "^[A-Za-z0-9._:-]{1,64}$",
                "normalization": "trim_then_lowercase", "default": null, "default_class_label": DEFAULT_CLASS,
                "description": "The fairness class (a tenant, say) that shares dispatch within a priority.",
            },
            "fairness_weight": {
                "type": "integer", "min": FAIRNESS_WEIGHT_MIN, "max": FAIRNESS_WEIGHT_MAX, "default": FAIRNESS_WEIGHT_DEFAULT,
                "description": "The class's share of dispatch against other classes of the same priority.",
            },
        },
        "inheritance": {
            "workflow_task": "inherits_priority_and_fairness_from_parent_run",
            // No SDK sends them on an activity; Capstan also carries them to a child, a
            // continued run and a retry.
            "activity_task": "inherits_from_run",
            "activity_options_override_fields": [],
            "child_workflow_run": "inherits_from_parent_run",
            "continue_as_new_run": "inherits_from_previous_run",
        },
        "persistence": {
            "columns_per_table": {"workflow_tasks": fields},
            "indexes": [{"purpose": "priority_ordered_dispatch", "columns": ["queue", "status", "priority", "available_at"]}],
        },
        "dispatch": {
            "poll_order": "priority_asc_then_available_at_asc_then_id",
            "fairness_reorder_scope": "within_priority_tier_only",
            "fairness_algorithm": "deficit_round_robin_by_recent_dispatch_score_over_weight",
            "fairness_state_half_life_seconds": capstan_engine::fairness::HALF_LIFE_MS / 1000,
            "workflow_and_activity_buckets_isolated": true,
            "urgency_wins_over_fairness": true,
        },
        "observability": {
            "route": "/api/task-queues/{queue}/priority-fairness",
            "method": "GET",
            "separates_workflow_and_activity": true,
            "response_shape": {"queue": "string", "workflow_task": "priority_fairness_surface", "activity_task": "priority_fairness_surface"},
            "priority_fairness_surface_shape": {
                "ready_tasks": "integer",
                "priority_tiers": "list<{priority:integer,count:integer,classes:list<{fairness_key:string|null,count:integer,fairness_weight:integer}>}>",
                "recent_dispatch": "list<{fairness_key:string|null,score:number}>",
            },
        },
    })
}

/// The `synchronous_update_validation` capability document (what the Python worker checks).
fn update_validation() -> Value {
    json!({
        "supported": true,
        "acceptance_boundary": "validator_approved",
        "worker_capability": updates::VALIDATION_CAPABILITY,
        "workflow_contract_field": "update_validators",
        "timeout_seconds": updates::VALIDATION_WAIT_MS / 1000,
        "task_poll": {
            "strategy": "multiplexed",
            "endpoint": "/worker/workflow-tasks/poll",
            "request_field": "task_kinds",
            "response_discriminator": "task.task_kind",
            "task_kinds": ["workflow", "update_validation"],
            "default_task_kinds": ["workflow"],
        },
        "completion": {
            "approve_endpoint": "/worker/update-validation-tasks/{id}/approve",
            "reject_endpoint": "/worker/update-validation-tasks/{id}/reject",
            "fence_fields": ["lease_owner", "update_validation_attempt"],
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const COVERAGE: &str = include_str!("../../../../docs/protocol-coverage.md");

    /// The rows of the markdown table under `heading`: each row's first cell, unquoted.
    fn table_keys(heading: &str) -> Vec<String> {
        let section = COVERAGE.split(heading).nth(1).expect("the section exists");
        let section = section.split("\n## ").next().unwrap_or(section);
        section
            .lines()
            .filter_map(|line| line.strip_prefix("| `"))
            .filter_map(|rest| rest.split('`').next())
            .map(str::to_string)
            .collect()
    }

    #[test]
    fn every_advertised_capability_has_a_row_and_every_row_is_advertised() {
        let mut advertised: Vec<String> = server_capabilities().as_object().expect("an object").keys().cloned().collect();
        advertised.sort();
        let mut rows = table_keys("## Advertised worker capabilities");
        rows.sort();
        assert_eq!(
            rows, advertised,
            "docs/protocol-coverage.md's capability table and server_capabilities()"
        );
    }

    #[test]
    fn every_served_command_has_a_row_in_the_command_field_table() {
        let mut rows = table_keys("## Command fields");
        rows.sort();
        let mut served: Vec<String> = SUPPORTED_COMMANDS.iter().map(|c| c.to_string()).collect();
        served.sort();
        assert_eq!(rows, served, "docs/protocol-coverage.md's command table and SUPPORTED_COMMANDS");
    }
}
