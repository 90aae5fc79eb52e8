//! Suite checks of the named credentials managed over the admin API.

use super::NOW;
use crate::*;
use capstan_engine::Principal;

fn secret(id: &str, at: Millis) -> CredentialSecret {
    CredentialSecret {
        secret_id: id.into(),
        digest: format!("sha256:{}", id.repeat(64 / id.len().max(1))),
        created_at: at,
        created_by: Some(Principal::token("root")),
    }
}

fn credential(principal: &str) -> CredentialRecord {
    CredentialRecord {
        principal: principal.into(),
        roles: vec!["worker".into()],
        namespaces: Some(vec!["billing".into()]),
        secrets: vec![secret("s1", NOW)],
        created_at: NOW,
        created_by: Some(Principal::token("root")),
        updated_at: NOW,
        updated_by: Some(Principal::token("root")),
    }
}

fn reason<T: std::fmt::Debug>(result: StoreResult<T>) -> Reason {
    match result.unwrap_err() {
        StoreError::Refused(refusal) => refusal.reason,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

pub async fn credentials_are_created_rotated_and_deleted<S: Store>(store: S) {
    assert!(store.credentials().await.unwrap().is_empty());
    store.create_credential(credential("zed")).await.unwrap();
    store.create_credential(credential("alice")).await.unwrap();
    assert_eq!(
        reason(store.create_credential(credential("alice")).await),
        Reason::CredentialAlreadyExists
    );
    let all = store.credentials().await.unwrap();
    assert_eq!(all.iter().map(|c| c.principal.as_str()).collect::<Vec<_>>(), ["alice", "zed"]);
    assert_eq!(all[0], credential("alice"), "read back as written");

    // Grants change; who and when are stamped.
    let by = Some(Principal::token("carol"));
    let grants = CredentialChange::Grants {
        roles: vec!["operator".into(), "worker".into()],
        namespaces: None,
    };
    let changed = store.change_credential("alice", grants, by.clone(), NOW + 1).await.unwrap();
    assert_eq!((changed.roles.len(), changed.namespaces.clone()), (2, None));
    assert_eq!((changed.updated_at, changed.updated_by.clone()), (NOW + 1, by.clone()));
    assert_eq!(changed.created_by, Some(Principal::token("root")), "creation is kept");

    // A rotation: add the new secret, remove the old one; the last one stays.
    let added = CredentialChange::AddSecret(secret("s2", NOW + 2));
    let rotated = store.change_credential("alice", added, by.clone(), NOW + 2).await.unwrap();
    assert_eq!(rotated.secrets.len(), 2);
    let remove = |id: &str| CredentialChange::RemoveSecret { secret_id: id.into() };
    let rotated = store.change_credential("alice", remove("s1"), by.clone(), NOW + 3).await.unwrap();
    assert_eq!(rotated.secrets, vec![secret("s2", NOW + 2)]);
    assert_eq!(
        reason(store.change_credential("alice", remove("s1"), by.clone(), NOW + 4).await),
        Reason::CredentialSecretNotFound
    );
    assert_eq!(
        reason(store.change_credential("alice", remove("s2"), by.clone(), NOW + 4).await),
        Reason::CredentialNeedsASecret
    );
    for n in 3..=MAX_CREDENTIAL_SECRETS + 1 {
        store
            .change_credential("alice", CredentialChange::AddSecret(secret(&format!("s{n}"), NOW)), None, NOW + 5)
            .await
            .unwrap();
    }
    let over = CredentialChange::AddSecret(secret("s9", NOW));
    assert_eq!(
        reason(store.change_credential("alice", over, None, NOW + 6).await),
        Reason::CredentialSecretLimitReached
    );
    let stored = store.credentials().await.unwrap();
    assert_eq!(stored[0].secrets.len(), MAX_CREDENTIAL_SECRETS, "a refused change writes nothing");
    assert_eq!(stored[0].updated_by, None, "the last committed change's author");

    assert_eq!(
        reason(store.change_credential("nobody", remove("s1"), None, NOW).await),
        Reason::CredentialNotFound
    );
    assert_eq!(store.delete_credential("zed", by.clone(), NOW + 7).await.unwrap().principal, "zed");
    assert_eq!(
        reason(store.delete_credential("zed", None, NOW + 8).await),
        Reason::CredentialNotFound
    );
    assert_eq!(store.credentials().await.unwrap().len(), 1);

    // The trail: every committed change, newest first; refused ones left nothing.
    let trail = store.credential_events(None, None, 100).await.unwrap();
    let summary: Vec<(&str, &str, Option<&str>)> = trail
        .iter()
        .map(|e| (e.principal.as_str(), e.action.as_str(), e.secret_id.as_deref()))
        .collect();
    let added: Vec<String> = (3..=MAX_CREDENTIAL_SECRETS + 1).rev().map(|n| format!("s{n}")).collect();
    let mut expected = vec![("zed", "credential.deleted", None)];
    expected.extend(added.iter().map(|id| ("alice", "credential.secret_added", Some(id.as_str()))));
    expected.extend([
        ("alice", "credential.secret_removed", Some("s1")),
        ("alice", "credential.secret_added", Some("s2")),
        ("alice", "credential.regranted", None),
        ("alice", "credential.created", Some("s1")),
        ("zed", "credential.created", Some("s1")),
    ]);
    assert_eq!(summary, expected);
    assert!(trail.windows(2).all(|pair| pair[0].sequence > pair[1].sequence), "newest first");
    let deleted = &trail[0];
    assert_eq!((deleted.by.clone(), deleted.recorded_at), (by.clone(), NOW + 7));
    assert_eq!(deleted.namespaces, Some(vec!["billing".to_string()]), "the grants it had");
    let regranted = trail.iter().find(|e| e.action == "credential.regranted").unwrap();
    assert_eq!(
        (regranted.roles.len(), regranted.namespaces.clone(), regranted.by.clone()),
        (2, None, by)
    );
    let created = trail.last().unwrap();
    assert_eq!((created.by.clone(), created.recorded_at), (Some(Principal::token("root")), NOW));

    // One principal's, a page at a time.
    let first = store.credential_events(Some("alice"), None, 2).await.unwrap();
    assert_eq!(first.len(), 2);
    let rest = store.credential_events(Some("alice"), Some(first[1].sequence), 100).await.unwrap();
    assert_eq!(first.len() + rest.len(), trail.iter().filter(|e| e.principal == "alice").count());
    assert!(rest.iter().all(|e| e.principal == "alice" && e.sequence < first[1].sequence));
}
