//! Payload envelopes. The server stores them verbatim: codec and blob exactly as received.

use serde::{Deserialize, Serialize};

pub const AVRO_CODEC: &str = "avro";

/// `{"codec": "avro", "blob": "<base64>"}` — opaque to the engine.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Payload {
    pub codec: String,
    pub blob: String,
}

impl Payload {
    pub fn avro(blob: impl Into<String>) -> Self {
        Self {
            codec: AVRO_CODEC.to_string(),
            blob: blob.into(),
        }
    }

    pub fn byte_len(&self) -> usize {
        self.blob.len() + self.codec.len()
    }
}

/// The DW `Value` Avro single-object encoding of `null` (checked against the SDK's golden
/// vectors in the server's Avro tests).
pub const AVRO_NULL_BLOB: &str = "wwHioz3/VYAiNwA=";
