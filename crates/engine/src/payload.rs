//! Payload envelopes. The server stores them verbatim: codec and blob exactly as received, or
//! the reference to bytes kept outside history (external payload storage), rendered back exactly
//! as the SDK sent it.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

pub const AVRO_CODEC: &str = "avro";

/// `{"codec": "avro", "blob": "<base64>"}` — opaque to the engine. A payload kept outside
/// history has an empty `blob` and its `reference`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Payload {
    pub codec: String,
    pub blob: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference: Option<Box<PayloadReference>>,
}

/// Where the bytes of an externally stored payload are, as the SDK described them (checked by
/// the server's wire layer, kept verbatim).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PayloadReference {
    /// `{codec, external_payload: {schema, reference_id, codec, size_bytes, sha256}}`: bytes
    /// uploaded to this server's runtime transport (`POST /api/external-payloads/v1`).
    Runtime(Value),
    /// `{codec, external_storage: {schema, uri, sha256, size_bytes, codec}}`: bytes the SDK put
    /// in storage it reaches itself (a direct provider adapter).
    Direct(Value),
}

/// The envelope key of a runtime reference.
pub const RUNTIME_REFERENCE_KEY: &str = "external_payload";
/// The envelope key of a direct reference.
pub const DIRECT_REFERENCE_KEY: &str = "external_storage";

impl Payload {
    pub fn avro(blob: impl Into<String>) -> Self {
        Self {
            codec: AVRO_CODEC.to_string(),
            blob: blob.into(),
            reference: None,
        }
    }

    pub fn inline(codec: impl Into<String>, blob: impl Into<String>) -> Self {
        Self {
            codec: codec.into(),
            blob: blob.into(),
            reference: None,
        }
    }

    pub fn external(codec: impl Into<String>, reference: PayloadReference) -> Self {
        Self {
            codec: codec.into(),
            blob: String::new(),
            reference: Some(Box::new(reference)),
        }
    }

    /// Bytes this payload takes in history (a reference's own JSON, not the bytes it names).
    pub fn byte_len(&self) -> usize {
        let reference = self.reference.as_ref().map_or(0, |r| r.value().to_string().len());
        self.blob.len() + self.codec.len() + reference
    }

    /// `{codec, blob}`, or `{codec, external_payload | external_storage}`.
    pub fn envelope(&self) -> Value {
        match &self.reference {
            None => json!({"codec": self.codec, "blob": self.blob}),
            Some(reference) => json!({"codec": self.codec, reference.key(): reference.value()}),
        }
    }

    /// The value of a slot DW fills with a bare blob string (beside `payload_codec`): the blob,
    /// or the reference envelope an SDK that offloaded it sent in its place.
    pub fn blob_value(&self) -> Value {
        match &self.reference {
            None => Value::String(self.blob.clone()),
            Some(_) => self.envelope(),
        }
    }

    /// What identifies the bytes, for digests: the blob, or the referenced bytes' SHA-256.
    pub fn identity(&self) -> &str {
        match &self.reference {
            None => &self.blob,
            Some(reference) => reference.value().get("sha256").and_then(Value::as_str).unwrap_or_default(),
        }
    }

    /// The runtime reference id (`ep_…`) this payload names, if it names one.
    pub fn runtime_reference_id(&self) -> Option<&str> {
        match self.reference.as_deref() {
            Some(PayloadReference::Runtime(value)) => value.get("reference_id").and_then(Value::as_str),
            _ => None,
        }
    }
}

impl PayloadReference {
    pub fn key(&self) -> &'static str {
        match self {
            Self::Runtime(_) => RUNTIME_REFERENCE_KEY,
            Self::Direct(_) => DIRECT_REFERENCE_KEY,
        }
    }

    pub fn value(&self) -> &Value {
        match self {
            Self::Runtime(value) | Self::Direct(value) => value,
        }
    }
}

/// The DW `Value` Avro single-object encoding of `null` (checked against the SDK's golden
/// vectors in the server's Avro tests).
pub const AVRO_NULL_BLOB: &str = "wwHioz3/VYAiNwA=";

/// The schema of a runtime reference (`external_payload`).
pub const RUNTIME_REFERENCE_SCHEMA: &str = "durable-workflow.v2.runtime-external-payload-reference.v1";
/// The schema of a direct reference (`external_storage`).
pub const DIRECT_REFERENCE_SCHEMA: &str = "durable-workflow.v2.external-payload-reference.v1";

/// Is `id` a runtime reference id: `ep_` and a ULID (Crockford base32, upper case)?
pub fn is_runtime_reference_id(id: &str) -> bool {
    id.strip_prefix("ep_").is_some_and(|ulid| {
        ulid.len() == 26
            && ulid
                .bytes()
                .all(|b| b.is_ascii_digit() || (b.is_ascii_uppercase() && !b"ILOU".contains(&b)))
    })
}

fn is_sha256_hex(value: &str) -> bool {
    value.len() == 64 && value.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

impl PayloadReference {
    /// Checks a reference envelope (`{codec, external_payload}` or `{codec, external_storage}`)
    /// exactly as the SDKs write them; the problem, worded to follow "The reference ", if not.
    pub fn parse(envelope: &serde_json::Map<String, Value>) -> Result<(String, Self), String> {
        let (key, build): (&str, fn(Value) -> Self) = if envelope.contains_key(RUNTIME_REFERENCE_KEY) {
            (RUNTIME_REFERENCE_KEY, Self::Runtime)
        } else {
            (DIRECT_REFERENCE_KEY, Self::Direct)
        };
        if envelope.len() != 2 || !envelope.contains_key("codec") {
            return Err(format!("envelope must hold exactly codec and {key}"));
        }
        let codec = envelope["codec"].as_str().ok_or("envelope codec must be a string")?;
        let Some(reference) = envelope[key].as_object() else {
            return Err(format!("{key} must be an object"));
        };
        let text = |field: &str| reference.get(field).and_then(Value::as_str);
        let (schema, required, optional): (&str, &[&str], &[&str]) = match key {
            RUNTIME_REFERENCE_KEY => (
                RUNTIME_REFERENCE_SCHEMA,
                &["schema", "reference_id", "codec", "size_bytes", "sha256"],
                &[],
            ),
            _ => (
                DIRECT_REFERENCE_SCHEMA,
                &["schema", "uri", "codec", "size_bytes", "sha256"],
                &["expires_at"],
            ),
        };
        if let Some(missing) = required.iter().find(|field| !reference.contains_key(**field)) {
            return Err(format!("{key} lacks {missing}"));
        }
        if let Some(unknown) = reference
            .keys()
            .find(|k| !required.contains(&k.as_str()) && !optional.contains(&k.as_str()))
        {
            return Err(format!("{key} has an unknown field {unknown}"));
        }
        if text("schema") != Some(schema) {
            return Err(format!("{key}.schema must be {schema}"));
        }
        if text("codec") != Some(codec) || codec != AVRO_CODEC {
            return Err(format!("{key}.codec must be \"avro\", as the envelope's codec"));
        }
        if !reference["size_bytes"].is_u64() {
            return Err(format!("{key}.size_bytes must be a non-negative integer"));
        }
        if !text("sha256").is_some_and(is_sha256_hex) {
            return Err(format!("{key}.sha256 must be a lowercase hex SHA-256 digest"));
        }
        match key {
            RUNTIME_REFERENCE_KEY if !text("reference_id").is_some_and(is_runtime_reference_id) => {
                Err(format!("{key}.reference_id must be ep_ and a ULID"))
            }
            DIRECT_REFERENCE_KEY if !text("uri").is_some_and(|uri| !uri.is_empty() && uri.len() <= 2048) => {
                Err(format!("{key}.uri must be a string of 1 to 2048 characters"))
            }
            DIRECT_REFERENCE_KEY if reference.get("expires_at").is_some_and(|v| v.as_str().is_none_or(str::is_empty)) => {
                Err(format!("{key}.expires_at must be an RFC 3339 time"))
            }
            _ => Ok((codec.to_string(), build(envelope[key].clone()))),
        }
    }
}

/// Every runtime reference id named in a JSON text (a serialized event, run document or stream
/// item): what the store records as the instance's uses of external payloads.
pub fn runtime_reference_ids(text: &str) -> impl Iterator<Item = &str> {
    const MARK: &str = "\"reference_id\":\"";
    text.match_indices(MARK).filter_map(|(at, _)| {
        let id = text.get(at + MARK.len()..at + MARK.len() + 29)?;
        is_runtime_reference_id(id).then_some(id)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runtime(id: &str) -> serde_json::Map<String, Value> {
        let reference = json!({"schema": RUNTIME_REFERENCE_SCHEMA, "reference_id": id, "codec": "avro",
            "size_bytes": 10, "sha256": "a".repeat(64)});
        json!({"codec": "avro", "external_payload": reference}).as_object().unwrap().clone()
    }

    #[test]
    fn runtime_references_are_checked_exactly_and_rendered_back_verbatim() {
        let envelope = runtime("ep_01ARZ3NDEKTSV4RRFFQ69G5FAV");
        let (codec, reference) = PayloadReference::parse(&envelope).unwrap();
        let payload = Payload::external(codec, reference);
        assert_eq!(payload.envelope(), Value::Object(envelope.clone()));
        assert_eq!(payload.blob_value(), Value::Object(envelope));
        assert_eq!(payload.runtime_reference_id(), Some("ep_01ARZ3NDEKTSV4RRFFQ69G5FAV"));
        assert_eq!(payload.identity(), "a".repeat(64));
        for bad in [
            "ep_01ARZ3NDEKTSV4RRFFQ69G5FA",
            "ep_01ARZ3NDEKTSV4RRFFQ69G5FAI",
            "xp_01ARZ3NDEKTSV4RRFFQ69G5FAV",
        ] {
            assert!(
                PayloadReference::parse(&runtime(bad)).unwrap_err().contains("reference_id"),
                "{bad}"
            );
        }
        let mut extra = runtime("ep_01ARZ3NDEKTSV4RRFFQ69G5FAV");
        extra["external_payload"]["uri"] = json!("s3://x");
        assert!(PayloadReference::parse(&extra).unwrap_err().contains("unknown field uri"));
        let mut upper = runtime("ep_01ARZ3NDEKTSV4RRFFQ69G5FAV");
        upper["external_payload"]["sha256"] = json!("A".repeat(64));
        assert!(PayloadReference::parse(&upper).unwrap_err().contains("sha256"));
    }

    #[test]
    fn reference_ids_are_found_in_serialized_state() {
        let payload = Payload::external(
            "avro",
            PayloadReference::parse(&runtime("ep_01ARZ3NDEKTSV4RRFFQ69G5FAV")).unwrap().1,
        );
        let text = serde_json::to_string(&json!({"a": payload.envelope(), "b": [payload.envelope()], "c": "reference_id"})).unwrap();
        let ids: Vec<_> = runtime_reference_ids(&text).collect();
        assert_eq!(ids, ["ep_01ARZ3NDEKTSV4RRFFQ69G5FAV", "ep_01ARZ3NDEKTSV4RRFFQ69G5FAV"]);
        // The run document keeps the reference in its serde form: found there too.
        let doc = serde_json::to_string(&payload).unwrap();
        assert_eq!(runtime_reference_ids(&doc).count(), 1);
        assert_eq!(runtime_reference_ids(r#"{"reference_id":"ep_short"}"#).count(), 0);
    }

    #[test]
    fn direct_references_keep_their_uri_and_expiry() {
        let reference = json!({"schema": DIRECT_REFERENCE_SCHEMA, "uri": "file:///tmp/x", "codec": "avro",
            "size_bytes": 3, "sha256": "b".repeat(64), "expires_at": "2030-01-01T00:00:00Z"});
        let envelope = json!({"codec": "avro", "external_storage": reference});
        let (_, parsed) = PayloadReference::parse(envelope.as_object().unwrap()).unwrap();
        assert_eq!(Payload::external("avro", parsed).envelope(), envelope);
        let mut json_codec = envelope.clone();
        json_codec["codec"] = json!("json");
        assert!(PayloadReference::parse(json_codec.as_object().unwrap())
            .unwrap_err()
            .contains("codec"));
    }
}
