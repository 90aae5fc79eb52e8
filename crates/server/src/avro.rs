//! The few payloads the server must produce itself, encoded with the DW `Value` Avro schema
//! (single-object framing, base64) through the `apache-avro` crate, as the SDKs do.

use apache_avro::types::Value as AvroValue;
use apache_avro::{GenericSingleObjectWriter, Schema};
use base64::Engine;
use std::sync::OnceLock;

/// `durable_workflow.protocol.Value`, the one writer schema of DW payloads.
pub const VALUE_SCHEMA: &str = r#"{"type":"record","name":"Value","namespace":"durable_workflow.protocol","fields":[{"name":"value","type":["null",{"type":"record","name":"BooleanValue","fields":[{"name":"boolean","type":"boolean"}]},{"type":"record","name":"LongValue","fields":[{"name":"long","type":"long"}]},{"type":"record","name":"DoubleValue","fields":[{"name":"double","type":"double"}]},{"type":"record","name":"BytesValue","fields":[{"name":"bytes","type":"bytes"}]},{"type":"record","name":"StringValue","fields":[{"name":"string","type":"string"}]},{"type":"record","name":"ArrayValue","fields":[{"name":"items","type":{"type":"array","items":"Value"}}]},{"type":"record","name":"MapValue","fields":[{"name":"entries","type":{"type":"map","values":"Value"}}]}]}]}"#;

fn schema() -> &'static Schema {
    static SCHEMA: OnceLock<Schema> = OnceLock::new();
    SCHEMA.get_or_init(|| Schema::parse_str(VALUE_SCHEMA).expect("the built-in Value schema parses"))
}

fn encode(value: AvroValue) -> String {
    let mut writer = GenericSingleObjectWriter::new_with_capacity(schema(), 64).expect("Value is a record schema");
    let mut bytes = Vec::with_capacity(16);
    writer.write_value(value, &mut bytes).expect("server-built values match the schema");
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn wrap(branch: u32, inner: AvroValue) -> AvroValue {
    AvroValue::Record(vec![("value".to_string(), AvroValue::Union(branch, Box::new(inner)))])
}

/// The blob of an empty argument list: the stored input of a start that sent none.
pub fn empty_arguments_blob() -> &'static str {
    static BLOB: OnceLock<String> = OnceLock::new();
    BLOB.get_or_init(|| encode(wrap(6, AvroValue::Record(vec![("items".to_string(), AvroValue::Array(vec![]))]))))
}

/// The blob of an Avro `null`: the result of a workflow that completed without one.
pub fn null_blob() -> &'static str {
    static BLOB: OnceLock<String> = OnceLock::new();
    BLOB.get_or_init(|| encode(wrap(0, AvroValue::Null)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Golden vectors from the published SDK's `schema/avro-value-v1-golden.json`.
    #[test]
    fn matches_the_sdk_golden_vectors() {
        assert_eq!(null_blob(), "wwHioz3/VYAiNwA=");
        assert_eq!(empty_arguments_blob(), "wwHioz3/VYAiNwwA");
    }
}
