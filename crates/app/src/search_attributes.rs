//! What a start, an upsert or a schedule may set as search attributes: bounded in number and
//! size, each a defined custom attribute of the namespace with a value of its type.

use crate::{AppError, AppResult, Services};
use capstan_engine::visibility::system_attribute;
use capstan_engine::{Reason, Refusal};
use capstan_store::prelude::*;
use serde_json::{Map, Value};

pub const ATTRIBUTES_MAX: usize = 100;
pub const KEY_MAX: usize = 128;
pub const VALUE_BYTES_MAX: usize = 2048;

/// The count and size bounds (no store read).
pub fn check_bounds(field: &str, attributes: &Map<String, Value>) -> AppResult<()> {
    if attributes.len() > ATTRIBUTES_MAX {
        return Err(AppError::invalid(field, format!("At most {ATTRIBUTES_MAX} search attributes.")));
    }
    for (key, value) in attributes {
        if key.is_empty() || key.len() > KEY_MAX {
            return Err(AppError::invalid(
                field,
                format!("Search attribute keys are 1 to {KEY_MAX} characters."),
            ));
        }
        if value.as_str().is_some_and(|v| v.len() > VALUE_BYTES_MAX) || value.is_object() {
            return Err(AppError::invalid(
                field,
                format!("Search attribute {key:?} must be a scalar or a list, strings at most {VALUE_BYTES_MAX} bytes."),
            ));
        }
    }
    Ok(())
}

/// Every key must be a defined custom attribute and every value of its type: nothing with an
/// undefined key or a wrong-typed value is recorded.
pub async fn check_defined<V: Services>(services: &V, namespace: &str, field: &str, attributes: &Map<String, Value>) -> AppResult<()> {
    if attributes.is_empty() {
        return Ok(());
    }
    let defined = services.store().search_attribute_definitions(namespace).await?;
    for (key, value) in attributes {
        let at = format!("{field}.{key}");
        if system_attribute(key).is_some() {
            return Err(Refusal::new(
                Reason::SearchAttributeReserved,
                format!("{key} is a system search attribute; it cannot be set."),
            )
            .with("field", at)
            .into());
        }
        let Some(kind) = defined.get(key) else {
            return Err(Refusal::new(
                Reason::UnknownSearchAttribute,
                format!("{key} is not a search attribute of this namespace; define it first (POST /api/search-attributes)."),
            )
            .with("field", at)
            .into());
        };
        if !kind.accepts(value) {
            return Err(Refusal::new(
                Reason::InvalidSearchAttributeValue,
                format!("{key} is a {} attribute; {value} is not a value of that type.", kind.as_str()),
            )
            .with("field", at)
            .into());
        }
    }
    Ok(())
}
