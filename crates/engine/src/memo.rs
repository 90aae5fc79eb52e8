//! Memo upserts. The memo is a map of typed values kept in the payload codec's encoding; merging
//! needs that codec, so the engine takes it as an input (like ids and time): the server provides
//! an Avro implementation, tests a fake one.

use crate::payload::Payload;
use serde_json::{Map, Value};

/// What an upsert merges into.
pub enum MemoBase<'a> {
    /// No upsert yet: the start memo (plain JSON).
    Start(&'a Map<String, Value>),
    /// The last merged memo (an encoded map).
    Merged(&'a Payload),
}

/// The result of a merge: the canonical encoded map (keys sorted) and its JSON projection for
/// describe and list.
pub struct MergedMemo {
    pub merged: Payload,
    pub projection: Map<String, Value>,
}

pub trait MemoCodec: Sync {
    /// Merges `entries` (an encoded map; a null value deletes its key) into `base`. An `Err` is
    /// a human-readable reason the entries are not acceptable.
    fn merge(&self, base: MemoBase<'_>, entries: &Payload) -> Result<MergedMemo, String>;

    /// A payload's value as JSON, for checks that read it (action pins and result
    /// verification). The default knows no codec.
    fn to_json(&self, payload: &Payload) -> Result<Value, String> {
        Err(format!("cannot decode {} payloads", payload.codec))
    }

    /// A JSON value as a payload of this codec (an atomic action's result).
    fn json_to_payload(&self, value: &Value) -> Result<Payload, String> {
        let _ = value;
        Err("this codec cannot encode values".into())
    }
}
