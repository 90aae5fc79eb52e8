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
}
