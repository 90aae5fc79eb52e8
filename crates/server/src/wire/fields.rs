//! Reading a request's JSON object field by field: each getter names the field it refuses and
//! why (422 `validation_failed`), and unknown fields are refused by name.

use crate::error::{ApiError, ApiResult};
use axum::http::StatusCode;
use capstan_engine::*;
use serde_json::{Map, Value};

/// Typed reads of a JSON object with DW validation errors.
pub struct Fields<'a> {
    map: &'a Map<String, Value>,
    /// Prefix for error field names, e.g. `commands.2.`.
    prefix: String,
}

impl<'a> Fields<'a> {
    pub fn new(map: &'a Map<String, Value>) -> Self {
        Self {
            map,
            prefix: String::new(),
        }
    }

    pub fn nested(map: &'a Map<String, Value>, prefix: String) -> Self {
        Self { map, prefix }
    }

    pub fn name(&self, key: &str) -> String {
        format!("{}{}", self.prefix, key)
    }

    pub fn raw(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    pub fn opt_str(&self, key: &str, max_len: usize) -> ApiResult<Option<String>> {
        match self.map.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) if s.chars().count() <= max_len => Ok(Some(s.clone())),
            Some(Value::String(_)) => Err(ApiError::validation(
                &self.name(key),
                format!("The {key} field must be at most {max_len} characters."),
            )),
            Some(_) => Err(ApiError::validation(&self.name(key), format!("The {key} field must be a string."))),
        }
    }

    pub fn req_str(&self, key: &str, max_len: usize) -> ApiResult<String> {
        match self.opt_str(key, max_len)? {
            Some(s) if !s.trim().is_empty() => Ok(s),
            _ => Err(ApiError::validation(&self.name(key), format!("The {key} field is required."))),
        }
    }

    /// An integer; digit strings are accepted as DW coerces them.
    pub fn opt_int(&self, key: &str, min: i64, max: i64) -> ApiResult<Option<i64>> {
        let value = match self.map.get(key) {
            None | Some(Value::Null) => return Ok(None),
            Some(Value::Number(n)) => n
                .as_i64()
                .or_else(|| n.as_f64().filter(|f| f.fract() == 0.0 && f.abs() < 9e15).map(|f| f as i64)),
            Some(Value::String(s)) => s.trim().parse::<i64>().ok(),
            Some(_) => None,
        };
        match value {
            Some(v) if (min..=max).contains(&v) => Ok(Some(v)),
            Some(_) => Err(ApiError::validation(
                &self.name(key),
                format!("The {key} field must be between {min} and {max}."),
            )),
            None => Err(ApiError::validation(
                &self.name(key),
                format!("The {key} field must be an integer."),
            )),
        }
    }

    pub fn req_int(&self, key: &str, min: i64, max: i64) -> ApiResult<i64> {
        self.opt_int(key, min, max)?
            .ok_or_else(|| ApiError::validation(&self.name(key), format!("The {key} field is required.")))
    }

    pub fn opt_bool(&self, key: &str) -> ApiResult<Option<bool>> {
        match self.map.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(_) => Err(ApiError::validation(&self.name(key), format!("The {key} field must be a boolean."))),
        }
    }

    pub fn opt_object(&self, key: &str) -> ApiResult<Option<&'a Map<String, Value>>> {
        match self.map.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Object(m)) => Ok(Some(m)),
            Some(Value::Array(a)) if a.is_empty() => Ok(None),
            Some(_) => Err(ApiError::validation(&self.name(key), format!("The {key} field must be an object."))),
        }
    }

    pub fn string_list(&self, key: &str) -> ApiResult<Vec<String>> {
        match self.map.get(key) {
            None | Some(Value::Null) => Ok(vec![]),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| {
                    v.as_str()
                        .map(str::to_string)
                        .ok_or_else(|| ApiError::validation(&self.name(key), format!("The {key} field must be a list of strings.")))
                })
                .collect(),
            Some(_) => Err(ApiError::validation(
                &self.name(key),
                format!("The {key} field must be a list of strings."),
            )),
        }
    }

    /// A payload: an envelope `{codec, blob}` or a bare blob string (Avro assumed).
    /// The argument list at `key`; an empty one when absent.
    pub fn arguments(&self, key: &str, limits: &Limits) -> ApiResult<Payload> {
        Ok(self
            .opt_payload(key, limits)?
            .unwrap_or_else(|| Payload::avro(crate::avro::empty_arguments_blob())))
    }

    /// `task_queue`, or DW's `default` when absent or empty.
    pub fn task_queue(&self) -> ApiResult<String> {
        Ok(self
            .opt_str("task_queue", 255)?
            .filter(|q| !q.is_empty())
            .unwrap_or_else(|| "default".into()))
    }

    /// An `observability_context` envelope (see `capstan_engine::trace`), checked strictly.
    pub fn opt_trace(&self, key: &str) -> ApiResult<Option<TraceContext>> {
        match self.map.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(value) => TraceContext::parse(value)
                .map(Some)
                .map_err(|problem| ApiError::validation(&self.name(key), format!("The trace context {problem}."))),
        }
    }

    pub fn opt_payload(&self, key: &str, limits: &Limits) -> ApiResult<Option<Payload>> {
        let payload = match self.map.get(key) {
            None | Some(Value::Null) => return Ok(None),
            Some(Value::String(blob)) => Payload::avro(blob.clone()),
            Some(Value::Object(envelope))
                if envelope.contains_key(payload::RUNTIME_REFERENCE_KEY) || envelope.contains_key(payload::DIRECT_REFERENCE_KEY) =>
            {
                let (codec, reference) = PayloadReference::parse(envelope)
                    .map_err(|problem| ApiError::validation(&self.name(key), format!("The payload reference {problem}.")))?;
                return Ok(Some(Payload::external(codec, reference)));
            }
            Some(Value::Object(envelope)) => {
                let codec = match envelope.get("codec") {
                    None | Some(Value::Null) => payload::AVRO_CODEC.to_string(),
                    Some(Value::String(c)) => c.clone(),
                    Some(_) => return Err(ApiError::validation(&self.name(key), "The payload codec must be a string.")),
                };
                let Some(Value::String(blob)) = envelope.get("blob") else {
                    return Err(ApiError::validation(
                        &self.name(key),
                        format!("The {key} envelope needs a string blob, or an external_payload or external_storage reference."),
                    ));
                };
                Payload::inline(codec, blob.clone())
            }
            Some(_) => {
                return Err(ApiError::validation(
                    &self.name(key),
                    format!("The {key} field must be a payload envelope."),
                ))
            }
        };
        if payload.codec != payload::AVRO_CODEC {
            return Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                Reason::UnsupportedPayloadCodec,
                format!("Payload codec {:?} is not supported; use \"avro\".", payload.codec),
            )
            .with("field", self.name(key)));
        }
        if payload.blob.len() > limits.payload_bytes_max {
            return Err(ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                Reason::PayloadTooLarge,
                format!("The {key} payload exceeds {} bytes.", limits.payload_bytes_max),
            )
            .with("field", self.name(key))
            .with("limit_bytes", limits.payload_bytes_max));
        }
        if !crate::avro::is_value_frame(&payload.blob) {
            return Err(ApiError::validation(
                &self.name(key),
                format!("The {key} blob is not base64 of an Avro single-object frame of the DW Value schema."),
            ));
        }
        Ok(Some(payload))
    }
}

/// Refuses a field of `object` that is not in `known` (null values carry nothing and pass).
pub fn refuse_unknown_fields(object: &Map<String, Value>, known: &[&[&str]], at: &str, what: &str) -> ApiResult<()> {
    let unknown = object
        .iter()
        .find(|(key, value)| !value.is_null() && !known.iter().any(|list| list.contains(&key.as_str())));
    match unknown {
        None => Ok(()),
        Some((key, _)) => Err(ApiError::validation(
            &format!("{at}{key}"),
            format!("The {key} field is not supported on {what}: Capstan neither honours nor records it."),
        )),
    }
}
