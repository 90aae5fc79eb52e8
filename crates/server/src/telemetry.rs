//! The server's own spans, exported over OTLP/HTTP (JSON) when an endpoint is configured.
//!
//! One PRODUCER span `capstan.task.dispatch` per task lease handed to a worker: it starts when
//! the task became ready and ends when a worker leased it (the time the task waited in its
//! queue), in the trace of the run's origin carrier. Its context goes on the task as
//! `dispatch_observability_context`, which the SDKs turn into a `dispatch` link on their task
//! span. Without an endpoint nothing is emitted and no dispatch context is rendered: a context
//! must name a span that exists.

use capstan_engine::trace::{self, TraceContext, DISPATCH_SCHEMA, TRACE_CONTEXT_VERSION};
use capstan_engine::{Millis, RunState, Task};
use opentelemetry::trace::{
    Span as _, SpanContext, SpanId, SpanKind, TraceContextExt as _, TraceFlags, TraceId, TraceState, Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::{Protocol, WithExportConfig as _};
use opentelemetry_sdk::trace::{BatchConfigBuilder, BatchSpanProcessor, SdkTracer, SdkTracerProvider};
use opentelemetry_sdk::Resource;
use serde_json::{json, Value};
use std::str::FromStr as _;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Where and how the server exports its spans.
#[derive(Clone, Debug)]
pub struct OtlpSettings {
    /// The full OTLP/HTTP traces URL (`…/v1/traces`).
    pub traces_endpoint: String,
    /// The `service.name` resource attribute.
    pub service_name: String,
    /// How long finished spans wait before a batch is sent.
    pub export_delay: Duration,
}

impl OtlpSettings {
    /// The standard OpenTelemetry variables: `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (the full URL),
    /// else `OTEL_EXPORTER_OTLP_ENDPOINT` with `/v1/traces` added; `OTEL_SERVICE_NAME` (default
    /// `capstan`); `OTEL_BSP_SCHEDULE_DELAY` in milliseconds (default 5000). `None` when no
    /// endpoint is set.
    pub fn from_env(var: impl Fn(&str) -> Option<String>) -> Option<Self> {
        let set = |name: &str| var(name).filter(|v| !v.trim().is_empty());
        let traces_endpoint = set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            .or_else(|| set("OTEL_EXPORTER_OTLP_ENDPOINT").map(|base| format!("{}/v1/traces", base.trim_end_matches('/'))))?;
        Some(Self {
            traces_endpoint,
            service_name: set("OTEL_SERVICE_NAME").unwrap_or_else(|| "capstan".into()),
            export_delay: Duration::from_millis(set("OTEL_BSP_SCHEDULE_DELAY").and_then(|v| v.parse().ok()).unwrap_or(5_000)),
        })
    }
}

/// The span exporter, or nothing. Cheap to clone.
#[derive(Clone, Default)]
pub struct Telemetry {
    exporter: Option<Arc<Exporter>>,
}

struct Exporter {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
}

impl std::fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Telemetry").field("exporting", &self.exporter.is_some()).finish()
    }
}

impl Telemetry {
    /// Exports to `settings.traces_endpoint` from a background thread.
    pub fn otlp(settings: &OtlpSettings) -> Result<Self, String> {
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpJson)
            .with_endpoint(settings.traces_endpoint.clone())
            .build()
            .map_err(|e| format!("OTLP exporter for {}: {e}", settings.traces_endpoint))?;
        let batches = BatchConfigBuilder::default().with_scheduled_delay(settings.export_delay).build();
        let processor = BatchSpanProcessor::builder(exporter).with_batch_config(batches).build();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(processor)
            .with_resource(Resource::builder().with_service_name(settings.service_name.clone()).build())
            .build();
        let tracer = provider.tracer("capstan");
        Ok(Self {
            exporter: Some(Arc::new(Exporter { provider, tracer })),
        })
    }

    /// Sends what is still buffered; called once when the server stops.
    pub fn shutdown(&self) {
        if let Some(exporter) = &self.exporter {
            if let Err(e) = exporter.provider.shutdown() {
                tracing::warn!(error = %e, "the OTLP span exporter did not shut down cleanly");
            }
        }
    }

    /// Emits the dispatch span of the lease `task` holds now (`leased_at`) and answers the
    /// task's `dispatch_observability_context`; `None` when not exporting or when the run has
    /// no trace to join.
    pub fn dispatched(&self, run: &RunState, task: &Task, leased_at: Millis) -> Option<Value> {
        let exporter = self.exporter.as_ref()?;
        let parent = run
            .origin_trace
            .as_ref()
            .or_else(|| run.command_traces.last().map(|t| &t.context))?;
        let traceparent = trace::dispatch_traceparent(parent, task.id.as_str(), task.fence);
        let remote = SpanContext::new(
            TraceId::from_hex(parent.trace_id()).ok()?,
            SpanId::from_hex(parent.span_id()).ok()?,
            TraceFlags::new(u8::from_str_radix(parent.flags(), 16).ok()?),
            true,
            parent
                .tracestate
                .as_deref()
                .and_then(|s| TraceState::from_str(s).ok())
                .unwrap_or_default(),
        );
        let dispatch = TraceContext {
            traceparent,
            tracestate: parent.tracestate.clone(),
            baggage: None,
        };
        let mut span = exporter
            .tracer
            .span_builder("capstan.task.dispatch")
            .with_kind(SpanKind::Producer)
            .with_span_id(SpanId::from_hex(dispatch.span_id()).ok()?)
            .with_start_time(instant(task.available_at.max(task.created_at).min(leased_at)))
            .with_attributes([
                KeyValue::new("durable.task_id", task.id.as_str().to_string()),
                KeyValue::new("durable.task_kind", task.kind.as_str()),
                KeyValue::new("durable.task_attempt", task.fence as i64),
                KeyValue::new("durable.task_queue", task.queue.clone()),
                KeyValue::new("durable.namespace", run.namespace.clone()),
                KeyValue::new("durable.workflow_id", run.workflow_id.as_str().to_string()),
                KeyValue::new("durable.run_id", run.run_id.as_str().to_string()),
                KeyValue::new("durable.workflow_type", run.workflow_type.clone()),
            ])
            .start_with_context(&exporter.tracer, &Context::new().with_remote_span_context(remote));
        span.end_with_timestamp(instant(leased_at));
        Some(json!({
            "schema": DISPATCH_SCHEMA,
            "version": TRACE_CONTEXT_VERSION,
            "task_id": task.id,
            "context": dispatch.envelope(),
        }))
    }
}

fn instant(at: Millis) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(at.max(0) as u64)
}
