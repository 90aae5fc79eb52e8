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
/// A JSON value as a DW Avro `Value` frame (an operator-supplied activity result).
pub fn encode_json(value: &Json) -> String {
    encode(from_json(value))
}

pub fn empty_arguments_blob() -> &'static str {
    static BLOB: OnceLock<String> = OnceLock::new();
    BLOB.get_or_init(|| encode(wrap(6, AvroValue::Record(vec![("items".to_string(), AvroValue::Array(vec![]))]))))
}

/// The blob of an Avro `null`: the result of a workflow that completed without one.
pub fn null_blob() -> &'static str {
    static BLOB: OnceLock<String> = OnceLock::new();
    BLOB.get_or_init(|| encode(wrap(0, AvroValue::Null)))
}

/// Whether `blob` is base64 of an Avro single-object frame written with the DW `Value` schema
/// (marker `c3 01` and the schema's fingerprint). The body stays opaque: checking the frame is
/// cheap enough for every payload on the hot path and refuses what would poison a run's replay
/// (a blob no SDK can decode) at the API instead.
pub fn is_value_frame(blob: &str) -> bool {
    static HEADER: OnceLock<Vec<u8>> = OnceLock::new();
    let header = HEADER.get_or_init(|| {
        let bytes = base64::engine::general_purpose::STANDARD.decode(null_blob()).expect("own blob");
        bytes[..10].to_vec()
    });
    const LENIENT: base64::engine::GeneralPurpose = base64::engine::GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        base64::engine::GeneralPurposeConfig::new().with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
    );
    match LENIENT.decode(blob) {
        Ok(bytes) => bytes.len() > header.len() && bytes.starts_with(header),
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognises_value_frames_only() {
        assert!(is_value_frame(null_blob()));
        assert!(is_value_frame(empty_arguments_blob()));
        assert!(is_value_frame(null_blob().trim_end_matches('=')), "unpadded base64 is accepted");
        for bad in ["", "!!!not-base64!!!", "AAAA", "wwHioz3/VYAiNw==", "eyJhIjoxfQ=="] {
            assert!(!is_value_frame(bad), "{bad:?}");
        }
    }

    /// A frame whose body claims more than it holds: a block count of half a billion items,
    /// nesting deeper than any payload needs, a string longer than the bytes left.
    fn hostile_blobs() -> Vec<(&'static str, String)> {
        let header = base64::engine::general_purpose::STANDARD.decode(null_blob()).unwrap()[..10].to_vec();
        let frame = |body: &[u8]| {
            let mut bytes = header.clone();
            bytes.extend_from_slice(body);
            base64::engine::general_purpose::STANDARD.encode(bytes)
        };
        let mut huge_count = vec![0x0c]; // branch 6: an array
        zigzag(536_870_911, &mut huge_count); // items claimed
        huge_count.extend_from_slice(&[0x00, 0x00]);
        let mut negative_count = vec![0x0c];
        zigzag(-536_870_911, &mut negative_count);
        zigzag(1, &mut negative_count);
        let mut long_string = vec![0x0a]; // branch 5: a string
        zigzag(400_000_000, &mut long_string);
        long_string.extend_from_slice(b"abc");
        let mut map_count = vec![0x0e]; // branch 7: a map
        zigzag(100_000_000, &mut map_count);
        map_count.extend_from_slice(&[0x02, b'k', 0x00]);
        let deep: Vec<u8> = std::iter::repeat_n([0x0c, 0x02], 50_000).flatten().collect();
        vec![
            ("a block of half a billion items", frame(&huge_count)),
            ("a negative block count", frame(&negative_count)),
            ("a string longer than the frame", frame(&long_string)),
            ("a map of a hundred million entries", frame(&map_count)),
            ("arrays nested 50,000 deep", frame(&deep)),
        ]
    }

    #[test]
    fn a_frame_that_claims_more_than_it_holds_is_refused_without_allocating_for_it() {
        for (what, blob) in hostile_blobs() {
            let decoded = AVRO_MEMO.to_json(&Payload::avro(&blob));
            assert!(decoded.is_err(), "{what}: {decoded:?}");
        }
    }

    /// On a thread like the server's (see `STACK_BYTES`): the deepest payload allowed decodes,
    /// one level more is refused.
    #[test]
    fn nesting_up_to_the_limit_decodes() {
        let deepest = std::thread::Builder::new()
            .stack_size(crate::STACK_BYTES)
            .spawn(|| {
                let mut value = Json::Null;
                for _ in 0..MAX_DEPTH - 1 {
                    value = Json::Array(vec![value]);
                }
                assert_eq!(AVRO_MEMO.to_json(&Payload::avro(encode_json(&value))).unwrap(), value);
                let deeper = Json::Array(vec![value]);
                assert!(AVRO_MEMO.to_json(&Payload::avro(encode_json(&deeper))).is_err());
            })
            .unwrap();
        deepest.join().unwrap();
    }

    /// Golden vectors from the published SDK's `schema/avro-value-v1-golden.json`.
    #[test]
    fn matches_the_sdk_golden_vectors() {
        assert_eq!(null_blob(), "wwHioz3/VYAiNwA=");
        assert_eq!(null_blob(), capstan_engine::payload::AVRO_NULL_BLOB);
        assert_eq!(empty_arguments_blob(), "wwHioz3/VYAiNwwA");
    }
}

// ---------------------------------------------------------------------------------------------
// Memos

use capstan_engine::{MemoBase, MemoCodec, MergedMemo, Payload};
use serde_json::{Map, Value as Json};
use std::collections::BTreeMap;

/// Memo merges in the DW `Value` encoding.
pub struct AvroMemo;

pub static AVRO_MEMO: AvroMemo = AvroMemo;

/// SDK-side memo limits, mirrored here.
const MEMO_ENTRIES_MAX: usize = 100;
const MEMO_VALUE_BYTES_MAX: usize = 10_240;
const MEMO_TOTAL_BYTES_MAX: usize = 65_536;

fn valid_memo_key(key: &str) -> bool {
    let digits = key.strip_prefix('-').unwrap_or(key);
    let all_digits = !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit());
    let allowed = key
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b':' | b'-'));
    (1..=64).contains(&key.len()) && allowed && !all_digits
}

fn decode(payload: &Payload) -> Result<AvroValue, String> {
    if payload.reference.is_some() {
        // Memos and the values the server itself reads stay inline.
        return Err("it is stored externally; the server reads only inline payloads here".into());
    }
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(&payload.blob)
        .map_err(|e| format!("blob is not base64: {e}"))?;
    check_shape(&bytes)?;
    let reader = apache_avro::GenericSingleObjectReader::new(schema().clone()).map_err(|e| e.to_string())?;
    reader.read_value(&mut bytes.as_slice()).map_err(|e| format!("not a DW Value: {e}"))
}

/// How deep `Value`s may nest in a payload the server decodes (arrays and maps in arrays and
/// maps). Decoding recurses per level, so the limit keeps a hostile payload from overflowing
/// the stack.
pub const MAX_DEPTH: usize = 32;

/// Walks a frame's `Value` body without building it: every union branch known, every length
/// and block count within the bytes left (an item takes at least one byte), nesting within
/// [`MAX_DEPTH`], nothing after the value. apache-avro reserves room for a block's claimed
/// count before it reads the items and recurses per level, so an unchecked payload of a few
/// bytes can ask for gigabytes (an allocation failure aborts the process) or overflow the stack.
fn check_shape(bytes: &[u8]) -> Result<(), String> {
    const HEADER: usize = 10;
    if bytes.len() < HEADER {
        return Err("not a DW Value: the frame is shorter than its header".into());
    }
    let mut body = Body {
        bytes: &bytes[HEADER..],
        at: 0,
    };
    body.value(1)?;
    if body.at != body.bytes.len() {
        return Err(format!("not a DW Value: {} bytes after the value", body.bytes.len() - body.at));
    }
    Ok(())
}

struct Body<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Body<'_> {
    fn left(&self) -> usize {
        self.bytes.len() - self.at
    }

    fn skip(&mut self, n: usize, what: &str) -> Result<(), String> {
        if n > self.left() {
            return Err(format!("not a DW Value: {what} of {n} bytes, {} left", self.left()));
        }
        self.at += n;
        Ok(())
    }

    fn long(&mut self) -> Result<i64, String> {
        let mut raw: u64 = 0;
        for shift in (0..64).step_by(7) {
            let byte = *self.bytes.get(self.at).ok_or("not a DW Value: the body ends inside a number")?;
            self.at += 1;
            raw |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok((raw >> 1) as i64 ^ -((raw & 1) as i64));
            }
        }
        Err("not a DW Value: a number longer than ten bytes".into())
    }

    /// A length or count that the bytes left can hold, `min_item` bytes per item.
    fn count(&mut self, min_item: usize, what: &str) -> Result<usize, String> {
        let n = self.long()?;
        let n = usize::try_from(n).map_err(|_| format!("not a DW Value: a negative {what}"))?;
        if n.saturating_mul(min_item) > self.left() {
            return Err(format!("not a DW Value: a {what} of {n} with {} bytes left", self.left()));
        }
        Ok(n)
    }

    /// Array and map blocks: a count (negative: followed by the block's byte size), 0 ends.
    fn blocks(&mut self, min_item: usize, mut item: impl FnMut(&mut Self) -> Result<(), String>) -> Result<(), String> {
        loop {
            let n = self.long()?;
            if n == 0 {
                return Ok(());
            }
            let n = if n < 0 {
                self.long()?;
                n.checked_neg().ok_or("not a DW Value: a block count out of range")?
            } else {
                n
            } as u64;
            if n.saturating_mul(min_item as u64) > self.left() as u64 {
                return Err(format!("not a DW Value: a block of {n} items with {} bytes left", self.left()));
            }
            for _ in 0..n {
                item(self)?;
            }
        }
    }

    fn value(&mut self, depth: usize) -> Result<(), String> {
        if depth > MAX_DEPTH {
            return Err(format!("not a DW Value: nested deeper than {MAX_DEPTH} levels"));
        }
        match self.long()? {
            0 => Ok(()),
            1 => self.skip(1, "a boolean"),
            2 => self.long().map(|_| ()),
            3 => self.skip(8, "a double"),
            4 | 5 => {
                let n = self.count(1, "length")?;
                self.skip(n, "a string")
            }
            6 => self.blocks(1, |body| body.value(depth + 1)),
            7 => self.blocks(2, |body| {
                let n = body.count(1, "key length")?;
                body.skip(n, "a key")?;
                body.value(depth + 1)
            }),
            other => Err(format!("not a DW Value: union branch {other}")),
        }
    }
}

/// The inner value of a `Value` record: `(union branch, inner record)`.
fn branch(value: &AvroValue) -> Option<(u32, &AvroValue)> {
    match value {
        AvroValue::Record(fields) => match fields.first() {
            Some((_, AvroValue::Union(index, inner))) => Some((*index, inner.as_ref())),
            _ => None,
        },
        _ => None,
    }
}

fn field(record: &AvroValue) -> Option<&AvroValue> {
    match record {
        AvroValue::Record(fields) => fields.first().map(|(_, v)| v),
        _ => None,
    }
}

fn decode_map(payload: &Payload) -> Result<BTreeMap<String, AvroValue>, String> {
    let value = decode(payload)?;
    match branch(&value) {
        Some((7, inner)) => match field(inner) {
            Some(AvroValue::Map(entries)) => Ok(entries.iter().map(|(k, v)| (k.clone(), v.clone())).collect()),
            _ => Err("malformed map value".into()),
        },
        _ => Err("entries must encode a map".into()),
    }
}

fn is_null(value: &AvroValue) -> bool {
    matches!(branch(value), Some((0, _)))
}

/// Plain JSON (a start memo) as a `Value`.
fn from_json(json: &Json) -> AvroValue {
    match json {
        Json::Null => wrap(0, AvroValue::Null),
        Json::Bool(b) => wrap(1, AvroValue::Record(vec![("boolean".into(), AvroValue::Boolean(*b))])),
        Json::Number(n) => match n.as_i64() {
            Some(i) => wrap(2, AvroValue::Record(vec![("long".into(), AvroValue::Long(i))])),
            None => wrap(
                3,
                AvroValue::Record(vec![("double".into(), AvroValue::Double(n.as_f64().unwrap_or(0.0)))]),
            ),
        },
        Json::String(s) => wrap(5, AvroValue::Record(vec![("string".into(), AvroValue::String(s.clone()))])),
        Json::Array(items) => wrap(
            6,
            AvroValue::Record(vec![("items".into(), AvroValue::Array(items.iter().map(from_json).collect()))]),
        ),
        Json::Object(map) => wrap(
            7,
            AvroValue::Record(vec![(
                "entries".into(),
                AvroValue::Map(map.iter().map(|(k, v)| (k.clone(), from_json(v))).collect()),
            )]),
        ),
    }
}

/// The JSON projection DW shows for a `Value`: bytes as `{"$type": "bytes", "base64": …}`, an
/// integral double as an integer.
fn project(value: &AvroValue) -> Json {
    let Some((index, inner)) = branch(value) else { return Json::Null };
    match (index, field(inner)) {
        (1, Some(AvroValue::Boolean(b))) => Json::Bool(*b),
        (2, Some(AvroValue::Long(i))) => Json::from(*i),
        (3, Some(AvroValue::Double(d))) if d.fract() == 0.0 && d.abs() < 9.0e15 => Json::from(*d as i64),
        (3, Some(AvroValue::Double(d))) => serde_json::Number::from_f64(*d).map(Json::Number).unwrap_or(Json::Null),
        (4, Some(AvroValue::Bytes(b))) => {
            serde_json::json!({"$type": "bytes", "base64": base64::engine::general_purpose::STANDARD.encode(b)})
        }
        (5, Some(AvroValue::String(s))) => Json::String(s.clone()),
        (6, Some(AvroValue::Array(items))) => Json::Array(items.iter().map(project).collect()),
        (7, Some(AvroValue::Map(entries))) => {
            let sorted: BTreeMap<_, _> = entries.iter().collect();
            Json::Object(sorted.into_iter().map(|(k, v)| (k.clone(), project(v))).collect())
        }
        _ => Json::Null,
    }
}

fn zigzag(value: i64, out: &mut Vec<u8>) {
    let mut n = ((value << 1) ^ (value >> 63)) as u64;
    while n >= 0x80 {
        out.push((n as u8 & 0x7f) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

/// Writes one `Value` datum canonically: like any Avro writer, except that map entries are in
/// key order at every depth (`apache-avro` writes its `HashMap`s in arbitrary order), so equal
/// memos always encode to equal bytes — the SDKs compare merged memos byte for byte.
fn write_canonical(value: &AvroValue, out: &mut Vec<u8>) -> Result<(), String> {
    let (index, inner) = branch(value).ok_or("not a DW Value record")?;
    zigzag(index as i64, out);
    match (index, field(inner)) {
        (0, _) => {}
        (1, Some(AvroValue::Boolean(b))) => out.push(u8::from(*b)),
        (2, Some(AvroValue::Long(i))) => zigzag(*i, out),
        (3, Some(AvroValue::Double(d))) => out.extend_from_slice(&d.to_le_bytes()),
        (4, Some(AvroValue::Bytes(b))) => {
            zigzag(b.len() as i64, out);
            out.extend_from_slice(b);
        }
        (5, Some(AvroValue::String(text))) => {
            zigzag(text.len() as i64, out);
            out.extend_from_slice(text.as_bytes());
        }
        (6, Some(AvroValue::Array(items))) => {
            if !items.is_empty() {
                zigzag(items.len() as i64, out);
                for item in items {
                    write_canonical(item, out)?;
                }
            }
            zigzag(0, out);
        }
        (7, Some(AvroValue::Map(entries))) => {
            let sorted: BTreeMap<&String, &AvroValue> = entries.iter().collect();
            write_map(&sorted, out)?;
        }
        (index, other) => return Err(format!("unexpected Value branch {index}: {other:?}")),
    }
    Ok(())
}

fn write_map(entries: &BTreeMap<&String, &AvroValue>, out: &mut Vec<u8>) -> Result<(), String> {
    if !entries.is_empty() {
        zigzag(entries.len() as i64, out);
        for (key, value) in entries {
            zigzag(key.len() as i64, out);
            out.extend_from_slice(key.as_bytes());
            write_canonical(value, out)?;
        }
    }
    zigzag(0, out);
    Ok(())
}

/// The canonical single-object encoding of a map value, with each entry's encoded size.
fn encode_sorted_map(entries: &BTreeMap<String, AvroValue>) -> Result<(Vec<u8>, Vec<usize>), String> {
    let header = base64::engine::general_purpose::STANDARD.decode(null_blob()).expect("built-in")[..10].to_vec();
    let mut out = header;
    zigzag(7, &mut out);
    let mut sizes = Vec::with_capacity(entries.len());
    for value in entries.values() {
        let mut datum = Vec::new();
        write_canonical(value, &mut datum)?;
        sizes.push(datum.len());
    }
    write_map(&entries.iter().collect(), &mut out)?;
    Ok((out, sizes))
}

impl MemoCodec for AvroMemo {
    fn json_to_payload(&self, value: &Json) -> Result<Payload, String> {
        Ok(Payload::avro(encode_json(value)))
    }

    fn to_json(&self, payload: &Payload) -> Result<Json, String> {
        if payload.codec != capstan_engine::payload::AVRO_CODEC {
            return Err(format!("codec {:?} is not supported", payload.codec));
        }
        Ok(project(&decode(payload)?))
    }

    fn merge(&self, base: MemoBase<'_>, entries: &Payload) -> Result<MergedMemo, String> {
        if entries.codec != capstan_engine::payload::AVRO_CODEC {
            return Err(format!("codec {:?} is not supported", entries.codec));
        }
        let updates = decode_map(entries)?;
        if let Some(bad) = updates.keys().find(|k| !valid_memo_key(k)) {
            return Err(format!("memo key {bad:?} is not valid"));
        }
        let mut memo: BTreeMap<String, AvroValue> = match base {
            MemoBase::Start(json) => json.iter().map(|(k, v)| (k.clone(), from_json(v))).collect(),
            MemoBase::Merged(payload) => decode_map(payload)?,
        };
        for (key, value) in updates {
            if is_null(&value) {
                memo.remove(&key);
            } else {
                memo.insert(key, value);
            }
        }
        if memo.len() > MEMO_ENTRIES_MAX {
            return Err(format!("the memo would hold {} entries (at most {MEMO_ENTRIES_MAX})", memo.len()));
        }
        let (bytes, sizes) = encode_sorted_map(&memo)?;
        if sizes.iter().any(|s| *s > MEMO_VALUE_BYTES_MAX) || bytes.len() > MEMO_TOTAL_BYTES_MAX {
            return Err(format!(
                "memo values are limited to {MEMO_VALUE_BYTES_MAX} bytes each and {MEMO_TOTAL_BYTES_MAX} in all"
            ));
        }
        let projection: Map<String, Json> = memo.iter().map(|(k, v)| (k.clone(), project(v))).collect();
        Ok(MergedMemo {
            merged: Payload::avro(base64::engine::general_purpose::STANDARD.encode(bytes)),
            projection,
        })
    }
}

#[cfg(test)]
mod memo_tests {
    use super::*;

    fn map_payload(entries: Vec<(&str, AvroValue)>) -> Payload {
        let map = entries.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
        Payload::avro(encode(wrap(7, AvroValue::Record(vec![("entries".into(), AvroValue::Map(map))]))))
    }

    fn long(i: i64) -> AvroValue {
        wrap(2, AvroValue::Record(vec![("long".into(), AvroValue::Long(i))]))
    }

    #[test]
    fn matches_the_sdk_golden_empty_map() {
        let merged = AVRO_MEMO.merge(MemoBase::Start(&Map::new()), &map_payload(vec![])).unwrap();
        assert_eq!(merged.merged.blob, "wwHioz3/VYAiNw4A");
    }

    #[test]
    fn merges_sorted_deletes_nulls_and_projects_types() {
        let start: Map<String, Json> = serde_json::from_str(r#"{"b": "kept", "gone": 1}"#).unwrap();
        let entries = map_payload(vec![
            ("a", long(7)),
            ("gone", wrap(0, AvroValue::Null)),
            ("d", wrap(3, AvroValue::Record(vec![("double".into(), AvroValue::Double(7.0))]))),
            (
                "raw",
                wrap(4, AvroValue::Record(vec![("bytes".into(), AvroValue::Bytes(vec![0, 255]))])),
            ),
        ]);
        let merged = AVRO_MEMO.merge(MemoBase::Start(&start), &entries).unwrap();
        assert_eq!(
            Json::Object(merged.projection.clone()),
            serde_json::json!({"a": 7, "b": "kept", "d": 7, "raw": {"$type": "bytes", "base64": "AP8="}})
        );
        // The merged blob decodes to the same map, and merging it again is stable.
        let again = AVRO_MEMO.merge(MemoBase::Merged(&merged.merged), &map_payload(vec![])).unwrap();
        assert_eq!(again.merged, merged.merged);
        assert_eq!(
            decode_map(&merged.merged).unwrap().keys().cloned().collect::<Vec<_>>(),
            ["a", "b", "d", "raw"]
        );
    }

    #[test]
    fn nested_maps_encode_in_key_order_and_scalars_match_apache_avro() {
        let nested = |order: &[&str]| {
            let map = order.iter().map(|k| (k.to_string(), long(1))).collect();
            wrap(7, AvroValue::Record(vec![("entries".into(), AvroValue::Map(map))]))
        };
        let (a, _) = encode_sorted_map(&BTreeMap::from([("n".to_string(), nested(&["alpha", "beta", "gamma", "delta"]))])).unwrap();
        let (b, _) = encode_sorted_map(&BTreeMap::from([("n".to_string(), nested(&["delta", "gamma", "beta", "alpha"]))])).unwrap();
        assert_eq!(a, b);
        for value in [
            long(-7),
            wrap(5, AvroValue::Record(vec![("string".into(), AvroValue::String("héllo".into()))])),
        ] {
            let mut ours = Vec::new();
            write_canonical(&value, &mut ours).unwrap();
            assert_eq!(ours, apache_avro::to_avro_datum(schema(), value).unwrap());
        }
    }

    #[test]
    fn refuses_bad_keys_and_non_maps() {
        assert!(AVRO_MEMO
            .merge(MemoBase::Start(&Map::new()), &map_payload(vec![("12", long(1))]))
            .is_err());
        assert!(AVRO_MEMO
            .merge(MemoBase::Start(&Map::new()), &map_payload(vec![("has space", long(1))]))
            .is_err());
        assert!(AVRO_MEMO.merge(MemoBase::Start(&Map::new()), &Payload::avro(null_blob())).is_err());
    }
}
