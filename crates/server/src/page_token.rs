//! Opaque list page tokens: base64url JSON of where a page ended, which a list issues and reads
//! back. Each list decides what its token binds (namespace, filters) and how it refuses one.

use base64::Engine as _;
use serde_json::Value;

pub(crate) fn issue(doc: &Value) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(doc.to_string())
}

/// The token's document; `None` for anything a list did not issue.
pub(crate) fn read(token: &str) -> Option<Value> {
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(token).ok()?;
    serde_json::from_slice(&bytes).ok()
}
