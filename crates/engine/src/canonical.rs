//! The canonical JSON the hash chains are computed over: compact, object keys sorted by their
//! UTF-8 bytes.
//!
//! The order is imposed here rather than left to `serde_json::Map`, whose iteration order is
//! sorted only while no crate in the build enables serde_json's `preserve_order` feature; one
//! that did would otherwise change every hash. Scalars (strings, numbers, booleans, null) are
//! still written by serde_json, whose output for them does not depend on features.

use serde_json::{Map, Value};

/// The value of one member of an object written by [`object`].
pub(crate) enum Member<'a> {
    Value(Value),
    Object(&'a Map<String, Value>),
}

/// The canonical text of `value`.
pub(crate) fn to_string(value: &Value) -> String {
    let mut out = Vec::new();
    write_value(&mut out, value);
    into_string(out)
}

/// The canonical text of an object with these members (in any order).
pub(crate) fn object(members: Vec<(&str, Member<'_>)>) -> String {
    object_measuring(members, "").0
}

/// [`object`], with the length of the text written for the member named `measured` (0 when
/// there is none): what a caller would otherwise serialize a second time to learn.
pub(crate) fn object_measuring(members: Vec<(&str, Member<'_>)>, measured: &str) -> (String, usize) {
    let mut out = Vec::new();
    let mut length = 0;
    write_sorted(&mut out, members, |out, key, member| {
        let start = out.len();
        match member {
            Member::Value(value) => write_value(out, value),
            Member::Object(map) => write_map(out, map),
        }
        if key == measured {
            length = out.len() - start;
        }
    });
    (into_string(out), length)
}

fn into_string(out: Vec<u8>) -> String {
    String::from_utf8(out).expect("JSON text is UTF-8")
}

fn write_value(out: &mut Vec<u8>, value: &Value) {
    match value {
        Value::Array(items) => {
            out.push(b'[');
            for (index, item) in items.iter().enumerate() {
                if index > 0 {
                    out.push(b',');
                }
                write_value(out, item);
            }
            out.push(b']');
        }
        Value::Object(map) => write_map(out, map),
        scalar => write_scalar(out, scalar),
    }
}

fn write_map(out: &mut Vec<u8>, map: &Map<String, Value>) {
    write_sorted(
        out,
        map.iter().map(|(key, value)| (key.as_str(), value)).collect(),
        |out, _, value| write_value(out, value),
    );
}

/// `{"key":value,…}` with the members sorted by key bytes.
fn write_sorted<T>(out: &mut Vec<u8>, mut members: Vec<(&str, T)>, mut write: impl FnMut(&mut Vec<u8>, &str, &T)) {
    members.sort_by(|(a, _), (b, _)| a.as_bytes().cmp(b.as_bytes()));
    out.push(b'{');
    for (index, (key, value)) in members.iter().enumerate() {
        if index > 0 {
            out.push(b',');
        }
        write_scalar(out, *key);
        out.push(b':');
        write(out, key, value);
    }
    out.push(b'}');
}

fn write_scalar<T: serde::Serialize + ?Sized>(out: &mut Vec<u8>, scalar: &T) {
    serde_json::to_writer(&mut *out, scalar).expect("writing JSON into memory cannot fail");
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn members_given_out_of_order_are_written_sorted_by_bytes() {
        let nested = json!({"b": 1, "a": 2});
        let members = vec![
            ("zeta", Member::Value(json!(1))),
            ("é", Member::Value(json!("non-ASCII sorts after ASCII"))),
            ("Alpha", Member::Value(json!(null))),
            ("nested", Member::Object(nested.as_object().unwrap())),
            ("10", Member::Value(json!([3, 1, 2]))),
            ("9", Member::Value(json!(-0.5))),
        ];
        assert_eq!(
            object(members),
            r#"{"10":[3,1,2],"9":-0.5,"Alpha":null,"nested":{"a":2,"b":1},"zeta":1,"é":"non-ASCII sorts after ASCII"}"#
        );
    }

    #[test]
    fn a_map_built_in_unsorted_order_is_written_sorted() {
        let mut inner = Map::new();
        for key in ["y", "b", "a"] {
            inner.insert(key.to_string(), json!(key));
        }
        let mut outer = Map::new();
        outer.insert("z".into(), json!([Value::Object(inner.clone()), {}, []]));
        outer.insert("m".into(), Value::Object(inner));
        outer.insert("a".into(), json!("line\n\"quoted\" \u{1}"));
        assert_eq!(
            to_string(&Value::Object(outer)),
            r#"{"a":"line\n\"quoted\" \u0001","m":{"a":"a","b":"b","y":"y"},"z":[{"a":"a","b":"b","y":"y"},{},[]]}"#
        );
    }

    /// Scalars and nesting are serde_json's own compact output: on a value whose keys are
    /// already in order (so either map build agrees), the two must match byte for byte.
    #[test]
    fn agrees_with_serde_json_on_already_sorted_input() {
        let value = json!({
            "numbers": [0, -1, i64::MIN, u64::MAX, 0.1, -2.5e-8, 1e300, 100.0],
            "other": [true, false, null, {}, [], {"k": {"j": [{}]}}],
            "strings": ["naïve ☃ 𝄞", "tab\tcr\rnul\u{0}", "</slash>", "\u{7f}\u{2028}"],
        });
        assert_eq!(to_string(&value), value.to_string());
    }
}
