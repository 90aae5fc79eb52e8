//! The few DW `Value` payloads the load generator builds or reads, via `apache-avro`.

use apache_avro::types::Value as AvroValue;
use apache_avro::{GenericSingleObjectReader, GenericSingleObjectWriter, Schema};
use base64::Engine;
use std::sync::OnceLock;

const VALUE_SCHEMA: &str = r#"{"type":"record","name":"Value","namespace":"durable_workflow.protocol","fields":[{"name":"value","type":["null",{"type":"record","name":"BooleanValue","fields":[{"name":"boolean","type":"boolean"}]},{"type":"record","name":"LongValue","fields":[{"name":"long","type":"long"}]},{"type":"record","name":"DoubleValue","fields":[{"name":"double","type":"double"}]},{"type":"record","name":"BytesValue","fields":[{"name":"bytes","type":"bytes"}]},{"type":"record","name":"StringValue","fields":[{"name":"string","type":"string"}]},{"type":"record","name":"ArrayValue","fields":[{"name":"items","type":{"type":"array","items":"Value"}}]},{"type":"record","name":"MapValue","fields":[{"name":"entries","type":{"type":"map","values":"Value"}}]}]}]}"#;

fn schema() -> &'static Schema {
    static SCHEMA: OnceLock<Schema> = OnceLock::new();
    SCHEMA.get_or_init(|| Schema::parse_str(VALUE_SCHEMA).expect("schema"))
}

fn wrap(branch: u32, field: &str, inner: AvroValue) -> AvroValue {
    AvroValue::Record(vec![(
        "value".into(),
        AvroValue::Union(branch, Box::new(AvroValue::Record(vec![(field.into(), inner)]))),
    )])
}

fn encode(value: AvroValue) -> String {
    let mut writer = GenericSingleObjectWriter::new_with_capacity(schema(), 2048).expect("writer");
    let mut bytes = Vec::new();
    writer.write_value(value, &mut bytes).expect("encode");
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn string(text: &str) -> AvroValue {
    wrap(5, "string", AvroValue::String(text.to_string()))
}

/// A single string value.
pub fn string_value(text: &str) -> String {
    encode(string(text))
}

/// The argument list `[text]`.
pub fn argument_list_of_string(text: &str) -> String {
    encode(wrap(6, "items", AvroValue::Array(vec![string(text)])))
}

/// Decodes an argument list and re-encodes its first item (the echo activity's result).
pub fn first_argument(blob: &str) -> String {
    let bytes = base64::engine::general_purpose::STANDARD.decode(blob).expect("base64 arguments");
    let reader = GenericSingleObjectReader::new(schema().clone()).expect("reader");
    let value = reader.read_value(&mut bytes.as_slice()).expect("decode arguments");
    let AvroValue::Record(fields) = value else {
        panic!("not a Value record")
    };
    let AvroValue::Union(_, inner) = &fields[0].1 else {
        panic!("not a union")
    };
    let AvroValue::Record(array) = inner.as_ref() else {
        panic!("not an ArrayValue")
    };
    let AvroValue::Array(items) = &array[0].1 else { panic!("no items") };
    encode(items.first().cloned().unwrap_or(AvroValue::Record(vec![(
        "value".into(),
        AvroValue::Union(0, Box::new(AvroValue::Null)),
    )])))
}
