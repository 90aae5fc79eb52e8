//! The route table: every path and method, the plane each sits behind (`crate::planes`), and
//! what answers unknown paths, wrong methods and panics.

mod activities;
mod activity_lease;
mod audit;
mod batches;
mod bridge;
mod cancellation;
mod control;
mod credential_events;
mod credentials;
mod dispatch;
mod duties;
mod external_payloads;
mod fleet;
mod imports;
mod ledger;
mod local_activities;
mod message_streams;
mod namespaces;
mod pause;
mod query;
mod queue_pause;
mod redrive;
mod schedules;
pub(crate) mod search_attributes;
mod service_calls;
mod service_catalog;
mod sessions;
pub(crate) mod system;
mod table;
mod update;
mod validation;
pub(crate) mod worker;
mod workflow_streams;

use crate::error::ApiError;
use crate::{planes, Shared};
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, put};
use axum::Router;
use capstan_engine::Reason;
use capstan_store::Store;
use table::ServerTable;

pub fn router<S: Store>(state: Shared<S>) -> Router {
    let (api, api_paths) = ServerTable::<S>::new()
        .route("/health", get(system::health::<S>))
        .route("/ready", get(system::ready::<S>))
        .route("/cluster/info", get(system::cluster_info::<S>))
        .route("/auth/whoami", get(system::whoami::<S>))
        .route("/auth/credentials", get(credentials::list::<S>).post(credentials::create::<S>))
        .route(
            "/auth/credentials/:principal",
            get(credentials::describe::<S>)
                .put(credentials::regrant::<S>)
                .delete(credentials::delete::<S>),
        )
        .route("/auth/credential-events", get(credential_events::list::<S>))
        .route("/auth/credentials/:principal/secrets", post(credentials::add_secret::<S>))
        .route(
            "/auth/credentials/:principal/secrets/:secret_id",
            axum::routing::delete(credentials::remove_secret::<S>),
        )
        .merge(worker_plane(&state))
        .merge(control_plane(&state))
        .merge(namespace_plane(&state))
        .merge(payload_plane(&state))
        .into_parts();
    let routes: Vec<String> = api_paths
        .iter()
        .map(|path| format!("/api{path}"))
        .chain(["/metrics"].iter().chain(&crate::ui::PATHS).map(|path| path.to_string()))
        .collect();
    state.metrics.http.declare_routes(routes.iter().map(String::as_str));

    Router::new()
        .nest("/api", api)
        .route("/metrics", get(system::metrics::<S>))
        .merge(crate::ui::router())
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(state.clone(), crate::metrics::http::record::<S>))
        .layer(tower_http::catch_panic::CatchPanicLayer::custom(panic_response))
        .layer(middleware::from_fn(mark_loopback))
        .layer(middleware::from_fn_with_state(state.clone(), certify::<S>))
        .layer(tower_http::compression::CompressionLayer::new().compress_when(Compressible))
        // Outermost: a refusal under overload costs next to nothing.
        .layer(middleware::from_fn_with_state(state.clone(), crate::admission::gate::<S>))
        .with_state(state)
}

/// The worker plane: registration, sessions, polls and every report a worker makes.
fn worker_plane<S: Store>(state: &Shared<S>) -> ServerTable<S> {
    ServerTable::<S>::new()
        .route("/worker/register", post(worker::register::<S>))
        .route("/worker/heartbeat", post(worker::heartbeat::<S>))
        .route("/worker/registrations/:worker_id", delete(worker::deregister::<S>))
        .route("/worker/registrations/:worker_id/deregister", post(worker::deregister_fenced::<S>))
        .route("/worker/sessions", post(sessions::acquire::<S>))
        .route("/worker/sessions/:session_id/heartbeat", post(sessions::heartbeat::<S>))
        .route("/worker/sessions/:session_id", delete(sessions::close::<S>))
        .route("/worker/workflow-tasks/poll", post(worker::poll_workflow_task::<S>))
        .route("/worker/workflow-tasks/:task_id/history", post(worker::workflow_task_history::<S>))
        .route(
            "/worker/workflow-tasks/:task_id/heartbeat",
            post(worker::heartbeat_workflow_task::<S>),
        )
        .route(
            "/worker/workflow-tasks/:task_id/complete",
            post(worker::complete_workflow_task::<S>),
        )
        .route("/worker/workflow-tasks/:task_id/fail", post(worker::fail_workflow_task::<S>))
        .route("/worker/activity-tasks/poll", post(worker::poll_activity_task::<S>))
        .route(
            "/worker/activity-tasks/:task_id/complete",
            post(worker::complete_activity_task::<S>),
        )
        .route("/worker/activity-tasks/:task_id/fail", post(worker::fail_activity_task::<S>))
        .route(
            "/worker/activity-tasks/:task_id/heartbeat",
            post(worker::heartbeat_activity_task::<S>),
        )
        .route(
            "/worker/workflow-tasks/:task_id/deliver-cancellation",
            post(cancellation::deliver::<S>),
        )
        .route("/worker/activity-tasks/:task_id/status", post(cancellation::activity_status::<S>))
        .route(
            "/worker/activity-tasks/:task_id/renew-lease",
            post(activity_lease::renew_lease::<S>),
        )
        .route(
            "/worker/activity-tasks/:task_id/acknowledge-cancellation",
            post(cancellation::acknowledge::<S>),
        )
        .route(
            "/worker/workflow-tasks/:task_id/local-activities/prepare",
            post(local_activities::prepare::<S>),
        )
        .route(
            "/worker/workflow-tasks/:task_id/local-activities/recover",
            post(local_activities::recover::<S>),
        )
        .route(
            "/worker/workflow-tasks/:task_id/local-activities/checkpoint",
            post(local_activities::checkpoint::<S>),
        )
        .route(
            "/worker/workflow-tasks/:task_id/local-activities/checkpoint-group",
            post(local_activities::checkpoint_group::<S>),
        )
        .route(
            "/worker/workflow-tasks/:task_id/local-activities/:attempt_id/control",
            post(local_activities::control::<S>),
        )
        .route(
            "/worker/workflow-tasks/:task_id/local-activities/:attempt_id/heartbeat",
            post(local_activities::heartbeat::<S>),
        )
        .route(
            "/worker/workflow-tasks/:task_id/local-activities/:attempt_id/outcome",
            post(local_activities::outcome::<S>),
        )
        .route(
            "/worker/workflow-tasks/:task_id/local-activities/:attempt_id/acknowledge-cancellation",
            post(local_activities::acknowledge::<S>),
        )
        .route("/worker/update-validation-tasks/poll", post(validation::poll::<S>))
        .route("/worker/update-validation-tasks/:task_id/approve", post(validation::approve::<S>))
        .route("/worker/update-validation-tasks/:task_id/reject", post(validation::reject::<S>))
        .route("/worker/query-tasks/poll", post(query::poll_query_task::<S>))
        .route("/worker/query-tasks/:task_id/status", get(query::query_task_status::<S>))
        .route("/worker/query-tasks/:task_id/complete", post(query::complete_query_task::<S>))
        .route("/worker/query-tasks/:task_id/fail", post(query::fail_query_task::<S>))
        // Inner to the plane's layer: runs once the namespace is resolved.
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            crate::offload::offload_large_payloads::<S>,
        ))
        .route_layer(middleware::from_fn_with_state(state.clone(), planes::worker_plane::<S>))
}

/// The control plane: what clients and operators do to workflows, schedules, the ledger, the
/// fleet and the server.
fn control_plane<S: Store>(state: &Shared<S>) -> ServerTable<S> {
    workflow_routes::<S>()
        .merge(operator_routes::<S>())
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            crate::offload::offload_large_payloads::<S>,
        ))
        // A bundle is imported byte for byte as its checksum covers it: never offloaded.
        .route("/workflows/import/embedded-v2", post(imports::embedded_v2::<S>))
        .route_layer(middleware::from_fn_with_state(state.clone(), planes::control_plane::<S>))
}

/// The control plane's routes about workflows, activities and their runs.
fn workflow_routes<S: Store>() -> ServerTable<S> {
    ServerTable::<S>::new()
        .route("/workflows", post(control::start::<S>).get(control::list::<S>))
        .route("/activities", post(activities::start::<S>).get(activities::list::<S>))
        .route("/activities/:activity_id", get(activities::describe::<S>))
        .route("/workflows/:workflow_id", get(control::describe::<S>))
        .route("/workflows/:workflow_id/runs", get(control::runs::<S>))
        .route("/workflows/:workflow_id/audit-events", get(audit::list::<S>))
        .route("/workflows/:workflow_id/runs/:run_id", get(control::describe_run::<S>))
        .route("/workflows/:workflow_id/runs/:run_id/history", get(control::history::<S>))
        .route("/workflows/:workflow_id/runs/:run_id/integrity", get(control::integrity::<S>))
        .route(
            "/workflows/:workflow_id/runs/:run_id/history/export",
            get(control::export_history::<S>),
        )
        .route("/workflows/:workflow_id/signal/:signal_name", post(control::signal::<S>))
        .route(
            "/workflows/:workflow_id/runs/:run_id/signal/:signal_name",
            post(control::signal_run::<S>),
        )
        .route("/workflows/:workflow_id/query/:query_name", post(query::query::<S>))
        .route(
            "/workflows/:workflow_id/runs/:run_id/query/:query_name",
            post(query::query_run::<S>),
        )
        .route("/workflows/:workflow_id/update/:update_name", post(update::update::<S>))
        .route(
            "/workflows/:workflow_id/runs/:run_id/update/:update_name",
            post(update::update_run::<S>),
        )
        .route("/workflows/:workflow_id/repair", post(control::repair::<S>))
        .route("/workflows/:workflow_id/archive", post(control::archive::<S>))
        .route("/workflows/:workflow_id/cancel", post(control::cancel::<S>))
        .route("/workflows/:workflow_id/runs/:run_id/cancel", post(control::cancel_run::<S>))
        .route("/workflows/:workflow_id/runs/:run_id/redrive", post(redrive::redrive::<S>))
        .route("/workflows/:workflow_id/runs/:run_id/streams", get(workflow_streams::list::<S>))
        .route(
            "/workflows/:workflow_id/runs/:run_id/streams/:stream_name",
            get(workflow_streams::get::<S>),
        )
        .route(
            "/workflows/:workflow_id/runs/:run_id/streams/:stream_name/items",
            get(workflow_streams::items::<S>).post(workflow_streams::append::<S>),
        )
        .route(
            "/workflows/:workflow_id/runs/:run_id/streams/:stream_name/close",
            post(workflow_streams::close::<S>),
        )
        .route("/workflows/:workflow_id/message-streams", get(message_streams::list::<S>))
        .route(
            "/workflows/:workflow_id/message-streams/:stream_name",
            get(message_streams::describe::<S>),
        )
        .route(
            "/workflows/:workflow_id/message-streams/:stream_name/messages",
            post(message_streams::append::<S>),
        )
        .route("/workflows/:workflow_id/request-cancellation", post(cancellation::request::<S>))
        .route(
            "/workflows/:workflow_id/runs/:run_id/request-cancellation",
            post(cancellation::request_run::<S>),
        )
        .route("/workflows/:workflow_id/nexus-operations", get(service_calls::of_workflow::<S>))
        .route(
            "/workflows/:workflow_id/runs/:run_id/nexus-operations",
            get(service_calls::of_workflow::<S>),
        )
        .route("/workflows/:workflow_id/terminate", post(control::terminate::<S>))
        .route("/workflows/:workflow_id/runs/:run_id/terminate", post(control::terminate_run::<S>))
        .route("/workflows/:workflow_id/pause", post(pause::pause::<S>))
        .route("/workflows/:workflow_id/runs/:run_id/pause", post(pause::pause_run::<S>))
        .route("/workflows/:workflow_id/resume", post(pause::resume::<S>))
        .route("/workflows/:workflow_id/runs/:run_id/resume", post(pause::resume_run::<S>))
}

/// The control plane's routes for operators: schedules, the ledger and integrity incidents, the
/// fleet and task queues, search attributes, the Nexus catalogue, storage, system duties.
fn operator_routes<S: Store>() -> ServerTable<S> {
    ServerTable::<S>::new()
        .route("/workflow-counts", get(control::counts::<S>))
        .route("/action-definitions", get(ledger::list_definitions::<S>))
        .route(
            "/action-definitions/:activity_type",
            get(ledger::get_definition::<S>).put(ledger::put_definition::<S>),
        )
        .route("/ledger", get(ledger::list_entries::<S>))
        .route("/ledger/:ledger_key", get(ledger::get_entry::<S>))
        .route("/ledger/:ledger_key/resolve", post(ledger::resolve::<S>))
        .route("/integrity-incidents", get(ledger::list_incidents::<S>))
        .route("/integrity-incidents/:incident_id/close", post(ledger::close_incident::<S>))
        .route("/bridge-adapters/webhook/:adapter", post(bridge::webhook::<S>))
        .route("/system/metrics", get(duties::metrics::<S>))
        .route("/system/operator-metrics", get(duties::operator_metrics::<S>))
        .route("/system/repair", get(duties::repair_status::<S>))
        .route("/system/repair/pass", post(duties::repair_pass::<S>))
        .route("/system/activity-timeouts", get(duties::activity_timeouts::<S>))
        .route("/system/activity-timeouts/pass", post(duties::activity_timeouts_pass::<S>))
        .route("/system/retention", get(duties::retention_status::<S>))
        .route("/system/retention/pass", post(duties::retention_pass::<S>))
        .route("/system/run-counts", get(duties::run_counts::<S>))
        .route("/system/run-counts/rebuild", post(duties::rebuild_run_counts::<S>))
        .route(
            "/search-attributes",
            get(search_attributes::list::<S>).post(search_attributes::create::<S>),
        )
        .route("/search-attributes/:name", delete(search_attributes::delete::<S>))
        .route("/workers", get(fleet::list_workers::<S>))
        .route(
            "/workers/:worker_id",
            get(fleet::describe_worker::<S>).delete(fleet::delete_worker::<S>),
        )
        .route("/task-queues", get(fleet::list_task_queues::<S>))
        .route("/task-queues/:task_queue", get(fleet::describe_task_queue::<S>))
        .route("/task-queues/:task_queue/priority-fairness", get(dispatch::priority_fairness::<S>))
        .route("/task-queues/:task_queue/limits", get(dispatch::limits::<S>))
        .route("/task-queues/:task_queue/pause", post(queue_pause::pause::<S>))
        .route("/batch-operations", get(batches::list::<S>).post(batches::create::<S>))
        .route("/batch-operations/:batch_id", get(batches::show::<S>))
        .route("/batch-operations/:batch_id/cancel", post(batches::cancel::<S>))
        .route("/task-queues/:task_queue/resume", post(queue_pause::resume::<S>))
        .route(
            "/task-queues/:task_queue/limits/:kind",
            put(dispatch::set_limits::<S>).delete(dispatch::clear_limits::<S>),
        )
        .route("/task-queues/:task_queue/build-ids", get(fleet::build_ids::<S>))
        .route("/task-queues/:task_queue/build-ids/drain", post(fleet::drain_build_id::<S>))
        .route("/task-queues/:task_queue/build-ids/resume", post(fleet::resume_build_id::<S>))
        .route("/task-queues/:task_queue/build-ids/promote", post(fleet::promote_build_id::<S>))
        .route("/schedules", get(schedules::list::<S>).post(schedules::create::<S>))
        .route(
            "/schedules/:schedule_id",
            get(schedules::describe::<S>)
                .put(schedules::update::<S>)
                .delete(schedules::delete::<S>),
        )
        .route("/schedules/:schedule_id/pause", post(schedules::pause::<S>))
        .route("/schedules/:schedule_id/resume", post(schedules::resume::<S>))
        .route("/schedules/:schedule_id/trigger", post(schedules::trigger::<S>))
        .route("/schedules/:schedule_id/backfill", post(schedules::backfill::<S>))
        .route("/schedules/:schedule_id/history", get(schedules::history::<S>))
        .route("/storage/test", post(external_payloads::probe::<S>))
        .route(
            "/service-endpoints",
            get(service_catalog::list_endpoints::<S>).post(service_catalog::create_endpoint::<S>),
        )
        .route(
            "/service-endpoints/:endpoint",
            get(service_catalog::describe::<S>)
                .put(service_catalog::update::<S>)
                .delete(service_catalog::delete::<S>),
        )
        .route(
            "/service-endpoints/:endpoint/services",
            get(service_catalog::list_children::<S>).post(service_catalog::create_child::<S>),
        )
        .route(
            "/service-endpoints/:endpoint/services/:service",
            get(service_catalog::describe::<S>)
                .put(service_catalog::update::<S>)
                .delete(service_catalog::delete::<S>),
        )
        .route(
            "/service-endpoints/:endpoint/services/:service/operations",
            get(service_catalog::list_children::<S>).post(service_catalog::create_child::<S>),
        )
        .route(
            "/service-endpoints/:endpoint/services/:service/operations/:operation",
            get(service_catalog::describe::<S>)
                .put(service_catalog::update::<S>)
                .delete(service_catalog::delete::<S>),
        )
        .route(
            "/service-endpoints/:endpoint/services/:service/operations/:operation/execute",
            post(service_calls::execute::<S>),
        )
        .route(
            "/service-endpoints/:endpoint/services/:service/operations/:operation/service-calls/:service_call_id",
            get(service_calls::describe::<S>),
        )
        .route(
            "/service-endpoints/:endpoint/services/:service/operations/:operation/service-calls/:service_call_id/cancel",
            post(service_calls::cancel::<S>),
        )
}

/// Namespace administration (the namespace is the path, so it need not exist).
fn namespace_plane<S: Store>(state: &Shared<S>) -> ServerTable<S> {
    ServerTable::<S>::new()
        .route("/namespaces", get(namespaces::list::<S>).post(namespaces::create::<S>))
        .route(
            "/namespaces/:name",
            get(namespaces::describe::<S>)
                .put(namespaces::update::<S>)
                .delete(namespaces::delete::<S>),
        )
        .route(
            "/namespaces/:name/external-storage",
            axum::routing::put(external_payloads::set_policy::<S>),
        )
        .route_layer(middleware::from_fn_with_state(state.clone(), planes::namespace_plane::<S>))
}

/// The runtime transport of external payloads: it serves workers and clients alike, each with
/// its own token.
fn payload_plane<S: Store>(state: &Shared<S>) -> ServerTable<S> {
    ServerTable::<S>::new()
        .route("/external-payloads/v1", post(external_payloads::upload::<S>))
        .route("/external-payloads/v1/:reference_id", get(external_payloads::fetch::<S>))
        .route_layer(middleware::from_fn_with_state(state.clone(), planes::payload_plane::<S>))
}

/// A response to a client on this machine: compressing it costs the server CPU and saves no
/// time (a loopback copy is faster than gzip), so it goes out as it is.
#[derive(Clone, Copy)]
struct Loopback;

/// Removes whatever a client sent as [`crate::auth::CERTIFIED_PRINCIPAL`], then sets it to the
/// credential the connection's verified client certificate maps to, if one does: only the
/// server speaks under that name.
async fn certify<S: Store>(State(state): State<Shared<S>>, mut request: Request, next: Next) -> Response {
    request.headers_mut().remove(crate::auth::CERTIFIED_PRINCIPAL);
    let certificate = request.extensions().get::<crate::tls::ClientCertificate>().cloned();
    let credential = certificate.and_then(|certificate| state.config.auth.credentials()?.for_certificate(&certificate.0));
    if let Some(principal) = credential.and_then(|c| axum::http::HeaderValue::from_str(&c.principal).ok()) {
        request.headers_mut().insert(crate::auth::CERTIFIED_PRINCIPAL, principal);
    }
    next.run(request).await
}

async fn mark_loopback(request: Request, next: Next) -> Response {
    let local = request
        .extensions()
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .is_some_and(|peer| peer.0.ip().is_loopback());
    let mut response = next.run(request).await;
    if local {
        response.extensions_mut().insert(Loopback);
    }
    response
}

/// What is compressed for a client that accepts it: what the default rule would compress
/// (bodies over 32 bytes, not images or event streams), sent to another machine.
#[derive(Clone, Copy)]
struct Compressible;

impl tower_http::compression::Predicate for Compressible {
    fn should_compress<B: axum::body::HttpBody>(&self, response: &axum::http::Response<B>) -> bool {
        response.extensions().get::<Loopback>().is_none() && tower_http::compression::DefaultPredicate::new().should_compress(response)
    }
}

async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, Reason::NotFound, "No such endpoint.")
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        Reason::MethodNotAllowed,
        "This endpoint does not accept that method.",
    )
}

fn panic_response(_: Box<dyn std::any::Any + Send + 'static>) -> Response {
    tracing::error!("a request handler panicked");
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        Reason::InternalError,
        "The server hit a bug handling this request.",
    )
    .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn responses_to_loopback_clients_are_not_compressed() {
        use tower_http::compression::Predicate;
        let large = || {
            axum::http::Response::builder()
                .header(axum::http::header::CONTENT_TYPE, "application/json")
                .header(axum::http::header::CONTENT_LENGTH, "4096")
                .body(axum::body::Body::from(vec![b' '; 4096]))
                .unwrap()
        };
        assert!(Compressible.should_compress(&large()), "another machine gets gzip");
        let mut local = large();
        local.extensions_mut().insert(Loopback);
        assert!(!Compressible.should_compress(&local));
    }
}
