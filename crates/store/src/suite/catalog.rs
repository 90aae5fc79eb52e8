//! The Nexus service catalog: a child needs its parent, keys are unique per level, listings are
//! per level and namespace, a parent with children stays, updates replace the document.

use super::*;

fn key(endpoint: &str, service: Option<&str>, operation: Option<&str>) -> CatalogKey {
    CatalogKey {
        namespace: "default".into(),
        endpoint: endpoint.into(),
        service: service.map(str::to_string),
        operation: operation.map(str::to_string),
    }
}

fn entry(key: CatalogKey, id: &str) -> CatalogEntry {
    CatalogEntry {
        key,
        id: id.into(),
        doc: json!({"description": id}).as_object().unwrap().clone(),
        created_at: NOW,
        updated_at: NOW,
    }
}

pub async fn the_service_catalog_nests_endpoints_services_and_operations<S: Store>(store: S) {
    let billing = key("billing", None, None);
    let invoices = key("billing", Some("invoices"), None);
    let create = key("billing", Some("invoices"), Some("create"));
    assert_eq!(
        reason(store.create_catalog_entry(entry(invoices.clone(), "s1")).await),
        Reason::EndpointNotFound
    );
    store.create_catalog_entry(entry(billing.clone(), "e1")).await.unwrap();
    assert_eq!(
        reason(store.create_catalog_entry(entry(billing.clone(), "e2")).await),
        Reason::EndpointAlreadyExists
    );
    assert_eq!(
        reason(store.create_catalog_entry(entry(create.clone(), "o1")).await),
        Reason::ServiceNotFound
    );
    store.create_catalog_entry(entry(invoices.clone(), "s1")).await.unwrap();
    store.create_catalog_entry(entry(create.clone(), "o1")).await.unwrap();
    store
        .create_catalog_entry(entry(key("billing", Some("invoices"), Some("void")), "o2"))
        .await
        .unwrap();
    assert_eq!(
        reason(store.create_catalog_entry(entry(create.clone(), "o3")).await),
        Reason::OperationAlreadyExists
    );
    store.create_catalog_entry(entry(key("audit", None, None), "e3")).await.unwrap();

    let names = |entries: Vec<CatalogEntry>| entries.into_iter().map(|e| e.id).collect::<Vec<_>>();
    assert_eq!(names(store.catalog_children("default", None).await.unwrap()), ["e3", "e1"]);
    assert!(store.catalog_children("other", None).await.unwrap().is_empty(), "per namespace");
    assert_eq!(
        names(store.catalog_children("default", Some(billing.clone())).await.unwrap()),
        ["s1"]
    );
    assert_eq!(
        names(store.catalog_children("default", Some(invoices.clone())).await.unwrap()),
        ["o1", "o2"]
    );

    let doc = json!({"operation_mode": "sync"}).as_object().unwrap().clone();
    let updated = store.update_catalog_entry(create.clone(), doc.clone(), NOW + 9).await.unwrap();
    assert_eq!((updated.doc.clone(), updated.created_at, updated.updated_at), (doc, NOW, NOW + 9));
    assert_eq!(store.catalog_entry(create.clone()).await.unwrap(), Some(updated));
    assert_eq!(
        reason(
            store
                .update_catalog_entry(key("billing", Some("x"), Some("y")), Map::new(), NOW)
                .await
        ),
        Reason::OperationNotFound
    );

    assert_eq!(
        reason(store.delete_catalog_entry(billing.clone()).await),
        Reason::EndpointHasServices
    );
    assert_eq!(
        reason(store.delete_catalog_entry(invoices.clone()).await),
        Reason::ServiceHasOperations
    );
    store.delete_catalog_entry(create.clone()).await.unwrap();
    store
        .delete_catalog_entry(key("billing", Some("invoices"), Some("void")))
        .await
        .unwrap();
    assert_eq!(reason(store.delete_catalog_entry(create).await), Reason::OperationNotFound);
    store.delete_catalog_entry(invoices).await.unwrap();
    store.delete_catalog_entry(billing.clone()).await.unwrap();
    assert_eq!(store.catalog_entry(billing).await.unwrap(), None);
}
