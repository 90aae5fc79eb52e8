//! Trace context (DW's `observability_context`): a W3C carrier an SDK sends with a start, a
//! child start or a continue-as-new, kept as the run's *origin* and handed back on every task
//! of the run, so the worker's task spans join the caller's trace. The server never reads or
//! changes a carrier; it checks its shape and bounds (the SDKs normalise before sending).

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

/// The envelope's `schema`.
pub const TRACE_CONTEXT_SCHEMA: &str = "durable-workflow.trace-context";
pub const TRACE_CONTEXT_VERSION: u64 = 1;
/// The whole envelope, measured as DW measures it ([`dw_json_size`]).
pub const MAX_CONTEXT_BYTES: usize = 4096;
pub const MAX_TRACEPARENT: usize = 256;
pub const MAX_TRACESTATE: usize = 512;
pub const MAX_BAGGAGE: usize = 2048;
/// `observability_links`: its schema, and the bounds past which an SDK discards every link.
pub const LINKS_SCHEMA: &str = "durable-workflow.trace-links";
pub const MAX_LINKS: usize = 32;
pub const MAX_LINKS_BYTES: usize = 4096;
/// `dispatch_observability_context`: the context of the server's own span for a task.
pub const DISPATCH_SCHEMA: &str = "durable-workflow.queue-trace";

/// The trace context a signal, update or cancellation arrived with, by the command that
/// recorded it and that event's sequence: the workflow task that first delivers the event
/// links it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommandTrace {
    pub command_id: crate::ids::CommandId,
    pub sequence: u64,
    pub context: TraceContext,
}

/// Keeps `carrier` (an event's recorded `observability_context`) for the next workflow task's
/// links; the oldest go past [`MAX_LINKS`].
pub fn note_command_trace(traces: &mut Vec<CommandTrace>, command_id: &crate::ids::CommandId, sequence: u64, carrier: &Value) {
    let Ok(context) = TraceContext::parse(carrier) else {
        return;
    };
    traces.push(CommandTrace {
        command_id: command_id.clone(),
        sequence,
        context,
    });
    if traces.len() > MAX_LINKS {
        traces.remove(0);
    }
}

/// Where a task's links point: the task and run they were rendered for.
pub struct LinkTarget<'a> {
    pub task_id: &'a str,
    pub run_id: &'a str,
    pub namespace: &'a str,
}

/// `observability_links` for a workflow task whose history ends at `snapshot`: one `command`
/// link per trace recorded up to there, newest kept within the SDKs' bounds (one entry past
/// them and an SDK drops them all). `None` when there is nothing to link.
pub fn command_links(target: &LinkTarget<'_>, traces: &[CommandTrace], snapshot: u64) -> Option<Value> {
    let links: Vec<Value> = traces
        .iter()
        .filter(|trace| trace.sequence <= snapshot)
        .map(|trace| json!({"kind": "command", "command_id": trace.command_id, "context": trace.context.link_envelope()}))
        .collect();
    let mut start = links.len().saturating_sub(MAX_LINKS);
    loop {
        if start >= links.len() {
            return None;
        }
        let body = json!({
            "schema": LINKS_SCHEMA,
            "version": TRACE_CONTEXT_VERSION,
            "task_id": target.task_id,
            "run_id": target.run_id,
            "namespace": target.namespace,
            "links": links[start..],
        });
        if dw_json_size(&body) <= MAX_LINKS_BYTES {
            return Some(body);
        }
        start += 1;
    }
}

/// The traceparent of the server's dispatch span for one lease of a task: in the trace of
/// `parent`, with a span id derived from the task id and the lease's fence, so every node
/// names the same span for the same lease without storing it.
pub fn dispatch_traceparent(parent: &TraceContext, task_id: &str, fence: u64) -> String {
    use sha2::{Digest, Sha256};
    let trace_id = parent.trace_id();
    let digest = Sha256::digest(format!("capstan.task.dispatch\0{task_id}\0{fence}").as_bytes());
    let mut span = [0u8; 8];
    span.copy_from_slice(&digest[..8]);
    if span == [0u8; 8] {
        span[7] = 1;
    }
    let span_id = hex::encode(span);
    format!("00-{trace_id}-{span_id}-{}", parent.flags())
}

/// A run's origin carrier.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceContext {
    pub traceparent: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracestate: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub baggage: Option<String>,
}

impl TraceContext {
    /// The three-key envelope the SDKs send and read back.
    pub fn envelope(&self) -> Value {
        let mut carrier = Map::new();
        carrier.insert("traceparent".into(), json!(self.traceparent));
        if let Some(state) = &self.tracestate {
            carrier.insert("tracestate".into(), json!(state));
        }
        if let Some(baggage) = &self.baggage {
            carrier.insert("baggage".into(), json!(baggage));
        }
        json!({"schema": TRACE_CONTEXT_SCHEMA, "version": TRACE_CONTEXT_VERSION, "carrier": carrier})
    }

    /// The envelope a link or a dispatch context carries: without baggage (an SDK discards a
    /// link context that has any).
    pub fn link_envelope(&self) -> Value {
        TraceContext {
            baggage: None,
            ..self.clone()
        }
        .envelope()
    }

    /// The 32-hex trace id of a checked traceparent.
    pub fn trace_id(&self) -> &str {
        &self.traceparent[3..35]
    }

    /// The 16-hex parent span id of a checked traceparent.
    pub fn span_id(&self) -> &str {
        &self.traceparent[36..52]
    }

    /// The 2-hex trace flags of a checked traceparent.
    pub fn flags(&self) -> &str {
        &self.traceparent[53..55]
    }

    /// Reads an envelope, or says what is wrong with it.
    pub fn parse(value: &Value) -> Result<Self, String> {
        let Some(envelope) = value.as_object() else {
            return Err("must be an object".into());
        };
        if envelope.len() != 3 || !["schema", "version", "carrier"].iter().all(|k| envelope.contains_key(*k)) {
            return Err("must have exactly schema, version and carrier".into());
        }
        if envelope["schema"] != json!(TRACE_CONTEXT_SCHEMA) {
            return Err(format!("schema must be {TRACE_CONTEXT_SCHEMA:?}"));
        }
        if envelope["version"].as_u64() != Some(TRACE_CONTEXT_VERSION) || !envelope["version"].is_u64() {
            return Err("version must be 1".into());
        }
        let Some(carrier) = envelope["carrier"].as_object() else {
            return Err("carrier must be an object".into());
        };
        if let Some(key) = carrier
            .keys()
            .find(|k| !matches!(k.as_str(), "traceparent" | "tracestate" | "baggage"))
        {
            return Err(format!("carrier key {key:?} is not traceparent, tracestate or baggage"));
        }
        let text = |key: &str, max: usize| -> Result<Option<String>, String> {
            match carrier.get(key) {
                None => Ok(None),
                Some(Value::String(s)) if s.len() <= max => Ok(Some(s.clone())),
                Some(Value::String(_)) => Err(format!("carrier.{key} is longer than {max} bytes")),
                Some(_) => Err(format!("carrier.{key} must be a string")),
            }
        };
        let traceparent = text("traceparent", MAX_TRACEPARENT)?.ok_or("carrier.traceparent is required")?;
        if !valid_traceparent(&traceparent) {
            return Err("carrier.traceparent is not a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>)".into());
        }
        let context = TraceContext {
            traceparent,
            tracestate: text("tracestate", MAX_TRACESTATE)?,
            baggage: text("baggage", MAX_BAGGAGE)?,
        };
        if dw_json_size(value) > MAX_CONTEXT_BYTES {
            return Err(format!("the context is larger than {MAX_CONTEXT_BYTES} bytes"));
        }
        Ok(context)
    }
}

/// `00-<32 lower hex, not all zero>-<16 lower hex, not all zero>-<2 lower hex>`.
pub fn valid_traceparent(value: &str) -> bool {
    let parts: Vec<&str> = value.split('-').collect();
    let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    let zero = |s: &str| s.bytes().all(|b| b == b'0');
    parts.len() == 4 && parts[0] == "00" && hex(parts[1], 32) && !zero(parts[1]) && hex(parts[2], 16) && !zero(parts[2]) && hex(parts[3], 2)
}

/// The size of `value` as PHP's default `json_encode` writes it (the budget the SDKs keep to):
/// `/` is escaped (2 bytes) and every non-ASCII UTF-16 unit is a `\uXXXX` (6 bytes).
pub fn dw_json_size(value: &Value) -> usize {
    let compact = value.to_string();
    compact
        .chars()
        .map(|c| match c {
            '/' => 2,
            c if c.is_ascii() => 1,
            c => 6 * c.len_utf16(),
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn an_envelope_round_trips_and_its_bounds_hold() {
        let context = TraceContext {
            traceparent: PARENT.into(),
            tracestate: Some("vendor=a/b".into()),
            baggage: None,
        };
        assert_eq!(TraceContext::parse(&context.envelope()), Ok(context.clone()));
        let mut extra = context.envelope();
        extra["more"] = json!(1);
        assert!(TraceContext::parse(&extra).is_err());
        for bad in [
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "01-x",
        ] {
            let mut envelope = context.envelope();
            envelope["carrier"]["traceparent"] = json!(bad);
            assert!(TraceContext::parse(&envelope).is_err(), "{bad}");
        }
        let mut float = context.envelope();
        float["version"] = json!(1.0);
        assert!(TraceContext::parse(&float).is_err());
        // A slash counts twice: a tracestate of slashes fits 512 characters yet not the budget.
        let mut heavy = context.envelope();
        heavy["carrier"]["baggage"] = json!("/".repeat(2048));
        assert!(TraceContext::parse(&heavy).is_err());
        assert_eq!(dw_json_size(&json!("é/")), 2 + 6 + 2);
    }

    fn trace(i: u64, tracestate: &str) -> CommandTrace {
        CommandTrace {
            command_id: format!("cmd-{i}").into(),
            sequence: i,
            context: TraceContext {
                traceparent: PARENT.into(),
                tracestate: Some(tracestate.into()),
                baggage: Some("user=alice".into()),
            },
        }
    }

    #[test]
    fn command_links_hold_only_delivered_events_and_keep_the_newest_within_both_bounds() {
        let target = LinkTarget {
            task_id: "task",
            run_id: "run",
            namespace: "default",
        };
        let few: Vec<CommandTrace> = (1..=3).map(|i| trace(i, "k=v")).collect();
        let links = command_links(&target, &few, 2).expect("two delivered");
        assert_eq!(links["links"].as_array().unwrap().len(), 2);
        assert_eq!(links["links"][1]["command_id"], "cmd-2");
        assert!(links["links"][0]["context"]["carrier"].get("baggage").is_none());
        assert_eq!(command_links(&target, &few, 0), None);

        let mut many = Vec::new();
        for i in 1..=40 {
            note_command_trace(&mut many, &format!("cmd-{i}").into(), i, &trace(i, "k=v").context.envelope());
        }
        assert_eq!(many.len(), MAX_LINKS);
        assert_eq!(many[0].sequence, 9, "the oldest go first");
        let wide: Vec<CommandTrace> = (1..=32).map(|i| trace(i, &"s".repeat(400))).collect();
        let links = command_links(&target, &wide, 32).expect("some fit");
        let kept = links["links"].as_array().unwrap();
        assert!(kept.len() < 32 && dw_json_size(&links) <= MAX_LINKS_BYTES, "{}", kept.len());
        assert_eq!(kept.last().unwrap()["command_id"], "cmd-32");
    }

    #[test]
    fn a_dispatch_span_id_names_one_lease_in_its_parents_trace() {
        let parent = TraceContext::parse(&json!({"schema": TRACE_CONTEXT_SCHEMA, "version": 1,
                                                  "carrier": {"traceparent": PARENT}}))
        .unwrap();
        let first = dispatch_traceparent(&parent, "task-1", 1);
        assert!(valid_traceparent(&first), "{first}");
        assert_eq!(&first[3..35], parent.trace_id());
        assert_eq!(
            first,
            dispatch_traceparent(&parent, "task-1", 1),
            "every node derives the same span"
        );
        assert_ne!(first, dispatch_traceparent(&parent, "task-1", 2), "a redelivery is another span");
        assert_ne!(first, dispatch_traceparent(&parent, "task-2", 1));
        assert_ne!(&first[36..52], parent.span_id());
    }
}
