//! Named credentials managed over the admin API: validated grants, secrets kept only as
//! digests (the secret itself never reaches this layer), every change stamped with who made it.

use crate::{AppError, AppResult, Services};
use capstan_engine::{Principal, Reason, Refusal};
use capstan_store::prelude::*;
use capstan_store::{CredentialChange, CredentialRecord, CredentialSecret};

/// The roles a credential may hold.
pub const ROLES: [&str; 3] = ["worker", "operator", "admin"];
/// The longest principal id.
pub const PRINCIPAL_MAX: usize = 128;
/// The most namespaces one credential is bound to.
pub const NAMESPACES_MAX: usize = 100;

/// What a credential may do: its roles, and the namespaces it may act in (`None`: every one).
#[derive(Clone, Debug)]
pub struct Grants {
    pub roles: Vec<String>,
    pub namespaces: Option<Vec<String>>,
}

/// A principal id is 1 to 128 printable characters without surrounding spaces.
pub fn check_principal(principal: &str) -> AppResult<()> {
    let printable = !principal.chars().any(char::is_control) && principal.trim() == principal;
    if principal.is_empty() || principal.len() > PRINCIPAL_MAX || !printable {
        return Err(AppError::invalid(
            "principal",
            format!("A principal is 1 to {PRINCIPAL_MAX} printable characters, without surrounding spaces."),
        ));
    }
    Ok(())
}

/// Known roles, at least one; namespaces that exist, at least one when bound. Sorted, without
/// repeats.
async fn checked<V: Services>(services: &V, grants: Grants) -> AppResult<Grants> {
    let mut roles = grants.roles;
    roles.sort();
    roles.dedup();
    if roles.is_empty() {
        return Err(AppError::invalid("roles", "A credential holds at least one role."));
    }
    if let Some(unknown) = roles.iter().find(|role| !ROLES.contains(&role.as_str())) {
        return Err(AppError::invalid(
            "roles",
            format!("Unknown role {unknown:?}; the roles are worker, operator and admin."),
        ));
    }
    let namespaces = match grants.namespaces {
        None => None,
        Some(mut names) => {
            names.sort();
            names.dedup();
            if names.is_empty() || names.len() > NAMESPACES_MAX {
                return Err(AppError::invalid(
                    "namespaces",
                    format!("Bind 1 to {NAMESPACES_MAX} namespaces, or leave namespaces null for every one."),
                ));
            }
            for name in &names {
                if !services.store().namespace_exists(name).await? {
                    return Err(
                        Refusal::new(Reason::NamespaceNotFound, format!("Namespace {name:?} does not exist."))
                            .with("namespace", name.clone())
                            .into(),
                    );
                }
            }
            Some(names)
        }
    };
    Ok(Grants { roles, namespaces })
}

fn new_secret<V: Services>(services: &V, digest: String, by: &Principal) -> CredentialSecret {
    CredentialSecret {
        secret_id: services.new_id(),
        digest,
        created_at: services.now(),
        created_by: Some(by.clone()),
    }
}

/// Stores a new credential with one secret (`digest`).
pub async fn create<V: Services>(
    services: &V,
    principal: &str,
    grants: Grants,
    digest: String,
    by: &Principal,
) -> AppResult<CredentialRecord> {
    check_principal(principal)?;
    let grants = checked(services, grants).await?;
    let now = services.now();
    let record = CredentialRecord {
        principal: principal.to_string(),
        roles: grants.roles,
        namespaces: grants.namespaces,
        secrets: vec![new_secret(services, digest, by)],
        created_at: now,
        created_by: Some(by.clone()),
        updated_at: now,
        updated_by: Some(by.clone()),
    };
    Ok(services.store().create_credential(record).await?)
}

/// Replaces a credential's roles and namespaces.
pub async fn regrant<V: Services>(services: &V, principal: &str, grants: Grants, by: &Principal) -> AppResult<CredentialRecord> {
    let grants = checked(services, grants).await?;
    let change = CredentialChange::Grants {
        roles: grants.roles,
        namespaces: grants.namespaces,
    };
    let store = services.store();
    Ok(store.change_credential(principal, change, Some(by.clone()), services.now()).await?)
}

/// Adds a secret (`digest`) to a credential: the first half of a rotation. The new secret's id.
pub async fn add_secret<V: Services>(
    services: &V,
    principal: &str,
    digest: String,
    by: &Principal,
) -> AppResult<(CredentialRecord, String)> {
    let secret = new_secret(services, digest, by);
    let secret_id = secret.secret_id.clone();
    let change = CredentialChange::AddSecret(secret);
    let record = services
        .store()
        .change_credential(principal, change, Some(by.clone()), services.now())
        .await?;
    Ok((record, secret_id))
}

/// Removes a secret from a credential: the second half of a rotation.
pub async fn remove_secret<V: Services>(services: &V, principal: &str, secret_id: &str, by: &Principal) -> AppResult<CredentialRecord> {
    let change = CredentialChange::RemoveSecret {
        secret_id: secret_id.to_string(),
    };
    let store = services.store();
    Ok(store.change_credential(principal, change, Some(by.clone()), services.now()).await?)
}

/// Removes a credential: none of its secrets authenticates any more.
pub async fn delete<V: Services>(services: &V, principal: &str, by: &Principal) -> AppResult<CredentialRecord> {
    Ok(services
        .store()
        .delete_credential(principal, Some(by.clone()), services.now())
        .await?)
}
