//! The Nexus service catalog an operator keeps: endpoints, their services and operations. An
//! entry is created under an existing parent with a minted id, changed in place (never renamed)
//! and deleted only once it has no children.

use crate::{AppResult, Services};
use capstan_store::prelude::*;
use capstan_store::{CatalogEntry, CatalogKey};
use serde_json::{Map, Value};

/// Creates the entry at `key` with its document; an existing one is `…_already_exists`.
pub async fn create_entry<V: Services>(services: &V, key: CatalogKey, doc: Map<String, Value>) -> AppResult<CatalogEntry> {
    let now = services.now();
    let entry = CatalogEntry {
        key,
        id: services.new_id(),
        doc,
        created_at: now,
        updated_at: now,
    };
    Ok(services.store().create_catalog_entry(entry).await?)
}

/// Replaces the document of the entry at `key`; no entry is `…_not_found`.
pub async fn update_entry<V: Services>(services: &V, key: CatalogKey, doc: Map<String, Value>) -> AppResult<CatalogEntry> {
    Ok(services.store().update_catalog_entry(key, doc, services.now()).await?)
}

/// Deletes the entry at `key`; one with children is refused.
pub async fn delete_entry<V: Services>(services: &V, key: CatalogKey) -> AppResult<CatalogEntry> {
    Ok(services.store().delete_catalog_entry(key).await?)
}
