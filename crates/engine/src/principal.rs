//! Who caused a fact: the principal the server authenticated, recorded on every history event a
//! request causes. Server-originated events (a timer firing, a lease expiring) carry none, and
//! are rendered with `principal: null`.

use serde_json::{json, Value};

/// An authenticated actor, in DW's shape: `{"type": "auth:token", "id": "alice"}`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Principal {
    /// `auth:token` for a bearer token, `auth:mtls` for a client certificate; `server` for the
    /// anonymous caller of a server without authentication.
    #[serde(rename = "type")]
    pub kind: String,
    pub id: String,
}

impl Principal {
    /// A bearer token's principal.
    pub fn token(id: &str) -> Self {
        Self {
            kind: "auth:token".into(),
            id: id.to_string(),
        }
    }

    /// A client certificate's principal: the named credential its certificate's name maps to.
    pub fn certificate(id: &str) -> Self {
        Self {
            kind: "auth:mtls".into(),
            id: id.to_string(),
        }
    }

    /// Every request to a server without authentication.
    pub fn anonymous() -> Self {
        Self {
            kind: "server".into(),
            id: "anonymous".into(),
        }
    }

    /// A principal as [`to_json`](Self::to_json) writes it; `None` for anything else (`null`).
    pub fn from_json(value: &Value) -> Option<Self> {
        Some(Self {
            kind: value.get("type")?.as_str()?.to_string(),
            id: value.get("id")?.as_str()?.to_string(),
        })
    }

    pub fn to_json(&self) -> Value {
        json!({"type": self.kind, "id": self.id})
    }
}

/// The `principal` member of an event: the actor, or `null` when the server caused it.
pub fn recorded(principal: Option<&Principal>) -> Value {
    principal.map_or(Value::Null, Principal::to_json)
}
