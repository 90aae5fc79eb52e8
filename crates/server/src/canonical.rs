//! `json-recursive-ksort-v1`: the canonical JSON the DW history-export checksum is taken over.
//! Object keys sorted, no whitespace, non-ASCII escaped as UTF-16 `\uXXXX` (PHP's encoding),
//! floats in PHP's notation.

use serde_json::{Map, Value};
use std::fmt::Write;

pub fn canonical_json(value: &Value) -> String {
    let mut out = String::new();
    write_value(value, &mut out);
    out
}

/// The canonical text of `map` as if it had no member `left_out` (a bundle without its
/// `integrity`), without copying the map.
pub fn canonical_object_without(map: &Map<String, Value>, left_out: &str) -> String {
    let mut out = String::new();
    write_object(map, Some(left_out), &mut out);
    out
}

fn write_object(map: &Map<String, Value>, left_out: Option<&str>, out: &mut String) {
    let mut keys: Vec<&String> = map.keys().filter(|key| Some(key.as_str()) != left_out).collect();
    keys.sort();
    out.push('{');
    for (i, key) in keys.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        write_string(key, out);
        out.push(':');
        write_value(&map[*key], out);
    }
    out.push('}');
}

fn write_value(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => write_object(map, None, out),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_value(item, out);
            }
            out.push(']');
        }
        Value::String(s) => write_string(s, out),
        Value::Number(n) if n.is_f64() => write_float(n.as_f64().unwrap_or(0.0), out),
        other => out.push_str(&other.to_string()),
    }
}

fn write_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if (c as u32) < 0x80 => out.push(c),
            c => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{:04x}", unit);
                }
            }
        }
    }
    out.push('"');
}

/// Shortest round-trip digits; fixed notation (with a `.0`) for exponents in -4..17, like PHP.
fn write_float(value: f64, out: &mut String) {
    if value.fract() == 0.0 && value.abs() < 1e17 {
        let _ = write!(out, "{value:.1}");
        return;
    }
    let text = format!("{value:e}");
    let (mantissa, exponent) = text.split_once('e').unwrap_or((&text, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    if (-4..17).contains(&exponent) {
        let _ = write!(out, "{value}");
    } else {
        let mantissa = if mantissa.contains('.') {
            mantissa.to_string()
        } else {
            format!("{mantissa}.0")
        };
        let _ = write!(out, "{mantissa}e{exponent:+}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn sorts_keys_and_escapes_like_the_reference() {
        let value = json!({"b": [1, 2.5, 3.0], "a": {"z": "é/\u{1f600}", "y": null, "x": true}});
        assert_eq!(
            canonical_json(&value),
            r#"{"a":{"x":true,"y":null,"z":"\u00e9/\ud83d\ude00"},"b":[1,2.5,3.0]}"#
        );
    }
}
