//! Request counts, latencies and refusals per route. The route is the matched path template
//! (`/api/worker/activity-tasks/:task_id/complete`), never the request's own path, so ids never
//! become label values; a request no route matched is `unmatched`.

use super::Families;
use crate::Shared;
use axum::extract::{MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::Response;
use capstan_engine::Reason;
use capstan_store::Store;
use prometheus::{HistogramVec, IntCounterVec};
use std::time::Instant;

/// A refusal's reason, left on its response for this layer (see `ApiError::into_response`).
#[derive(Clone, Copy, Debug)]
pub struct Refused(pub Reason);

/// What a worker's late or stale report is refused with.
const STALE_REPORT_REASONS: [Reason; 10] = [
    Reason::TaskNotLeased,
    Reason::LeaseOwnerMismatch,
    Reason::WorkflowTaskAttemptMismatch,
    Reason::LeaseExpired,
    Reason::StaleFence,
    Reason::RunClosed,
    Reason::RunCancelled,
    Reason::RunTerminated,
    Reason::AttemptClosed,
    Reason::TaskMismatch,
];

/// The report routes whose stale-report refusals are declared at zero from start-up.
const REPORT_ROUTES: [&str; 7] = [
    "/api/worker/workflow-tasks/:task_id/complete",
    "/api/worker/workflow-tasks/:task_id/fail",
    "/api/worker/workflow-tasks/:task_id/heartbeat",
    "/api/worker/activity-tasks/:task_id/complete",
    "/api/worker/activity-tasks/:task_id/fail",
    "/api/worker/activity-tasks/:task_id/heartbeat",
    "/api/worker/activity-tasks/:task_id/renew-lease",
];

pub(crate) struct HttpSeries {
    requests: IntCounterVec,
    seconds: HistogramVec,
    refusals: IntCounterVec,
}

impl HttpSeries {
    pub(super) fn new(f: &mut Families) -> Self {
        Self {
            requests: f.counters(
                "capstan_http_requests_total",
                "Requests answered, by route and status class (2xx, 4xx, 5xx).",
                &["route", "code"],
            ),
            seconds: f.histograms(
                "capstan_http_request_duration_seconds",
                "Time to answer a request, by route (long polls included: they wait by design).",
                &["route"],
                super::HTTP_SECONDS,
            ),
            refusals: f.counters(
                "capstan_http_refusals_total",
                "Requests refused with a reason from the catalogue (docs/errors.md), by route; on worker report routes these are late and stale reports.",
                &["route", "reason"],
            ),
        }
    }

    /// Creates every route's series at zero, before any request.
    pub fn declare_routes<'a>(&self, routes: impl IntoIterator<Item = &'a str>) {
        for route in routes {
            for code in ["2xx", "4xx", "5xx"] {
                self.requests.with_label_values(&[route, code]);
            }
            self.seconds.with_label_values(&[route]);
        }
        for route in REPORT_ROUTES {
            for reason in STALE_REPORT_REASONS {
                self.refusals.with_label_values(&[route, reason.as_str()]);
            }
        }
    }

    fn record(&self, route: &str, response: &Response, started: Instant) {
        let code = match response.status().as_u16() {
            100..=199 => "1xx",
            200..=299 => "2xx",
            300..=399 => "3xx",
            400..=499 => "4xx",
            _ => "5xx",
        };
        self.requests.with_label_values(&[route, code]).inc();
        self.seconds.with_label_values(&[route]).observe(started.elapsed().as_secs_f64());
        if let Some(Refused(reason)) = response.extensions().get::<Refused>() {
            self.refusals.with_label_values(&[route, reason.as_str()]).inc();
        }
    }
}

/// The layer around every route (and the fallback) that counts and times requests.
pub async fn record<S: Store>(State(state): State<Shared<S>>, request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_string(), |path| path.as_str().to_string());
    let started = Instant::now();
    let response = next.run(request).await;
    state.metrics.http.record(&route, &response, started);
    response
}
