//! Named credentials managed over the admin API: one row per principal, its grants and secret
//! digests in a JSON document, changed under the row's lock.

use crate::tx::{args, locking, Locking, Row, Tx};
use crate::*;
use capstan_engine::Principal;
use serde::{Deserialize, Serialize};
use serde_json::Value;

const LOCK_CREDENTIAL: Locking = locking!("SELECT doc FROM credentials WHERE principal = $1", "FOR UPDATE");

/// The stored document: a principal is kept in its wire form (`{"type", "id"}`).
#[derive(Serialize, Deserialize)]
struct Document {
    principal: String,
    roles: Vec<String>,
    namespaces: Option<Vec<String>>,
    secrets: Vec<SecretDocument>,
    created_at: Millis,
    created_by: Value,
    updated_at: Millis,
    updated_by: Value,
}

#[derive(Serialize, Deserialize)]
struct SecretDocument {
    secret_id: String,
    digest: String,
    created_at: Millis,
    created_by: Value,
}

fn principal_json(principal: &Option<Principal>) -> Value {
    principal.as_ref().map_or(Value::Null, Principal::to_json)
}

impl From<&CredentialRecord> for Document {
    fn from(record: &CredentialRecord) -> Self {
        Self {
            principal: record.principal.clone(),
            roles: record.roles.clone(),
            namespaces: record.namespaces.clone(),
            secrets: record
                .secrets
                .iter()
                .map(|secret| SecretDocument {
                    secret_id: secret.secret_id.clone(),
                    digest: secret.digest.clone(),
                    created_at: secret.created_at,
                    created_by: principal_json(&secret.created_by),
                })
                .collect(),
            created_at: record.created_at,
            created_by: principal_json(&record.created_by),
            updated_at: record.updated_at,
            updated_by: principal_json(&record.updated_by),
        }
    }
}

impl From<Document> for CredentialRecord {
    fn from(doc: Document) -> Self {
        Self {
            principal: doc.principal,
            roles: doc.roles,
            namespaces: doc.namespaces,
            secrets: doc
                .secrets
                .into_iter()
                .map(|secret| CredentialSecret {
                    secret_id: secret.secret_id,
                    digest: secret.digest,
                    created_at: secret.created_at,
                    created_by: Principal::from_json(&secret.created_by),
                })
                .collect(),
            created_at: doc.created_at,
            created_by: Principal::from_json(&doc.created_by),
            updated_at: doc.updated_at,
            updated_by: Principal::from_json(&doc.updated_by),
        }
    }
}

fn record_of(row: &Row) -> StoreResult<CredentialRecord> {
    let doc: Document = serde_json::from_str(row.str(0)?)?;
    Ok(doc.into())
}

fn credential_missing(principal: &str) -> StoreError {
    Refusal::new(
        Reason::CredentialNotFound,
        format!("No credential of principal {principal:?} is managed over the API."),
    )
    .with("principal", principal)
    .into()
}

pub(crate) async fn credentials<T: Tx>(tx: &mut T) -> StoreResult<Vec<CredentialRecord>> {
    let rows = tx.query("SELECT doc FROM credentials ORDER BY principal", &[]).await?;
    rows.iter().map(record_of).collect()
}

pub(crate) async fn create_credential<T: Tx>(tx: &mut T, record: CredentialRecord) -> StoreResult<CredentialRecord> {
    let doc = serde_json::to_string(&Document::from(&record))?;
    let sql = "INSERT INTO credentials (principal, created_at, doc) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING";
    let inserted = tx.execute(sql, &args![&record.principal, record.created_at, doc.as_str()]).await?;
    if inserted == 0 {
        return Err(Refusal::new(
            Reason::CredentialAlreadyExists,
            format!("A credential of principal {:?} exists.", record.principal),
        )
        .with("principal", record.principal.clone())
        .into());
    }
    let first_secret = record.secrets.first().map(|secret| secret.secret_id.clone());
    let (by, now) = (record.created_by.clone(), record.created_at);
    record_event(tx, &record, CredentialAction::Created, first_secret, &by, now).await?;
    Ok(record)
}

pub(crate) async fn change_credential<T: Tx>(
    tx: &mut T,
    principal: &str,
    change: CredentialChange,
    by: Option<Principal>,
    now: Millis,
) -> StoreResult<CredentialRecord> {
    let row = tx.query_opt(LOCK_CREDENTIAL.sql(tx.dialect()), &args![principal]).await?;
    let mut record = row
        .as_ref()
        .map(record_of)
        .transpose()?
        .ok_or_else(|| credential_missing(principal))?;
    let (action, secret_id) = match &change {
        CredentialChange::Grants { .. } => (CredentialAction::Regranted, None),
        CredentialChange::AddSecret(secret) => (CredentialAction::SecretAdded, Some(secret.secret_id.clone())),
        CredentialChange::RemoveSecret { secret_id } => (CredentialAction::SecretRemoved, Some(secret_id.clone())),
    };
    apply(&mut record, change)?;
    record.updated_at = now;
    record.updated_by = by.clone();
    let doc = serde_json::to_string(&Document::from(&record))?;
    tx.execute(
        "UPDATE credentials SET doc = $2 WHERE principal = $1",
        &args![principal, doc.as_str()],
    )
    .await?;
    record_event(tx, &record, action, secret_id, &by, now).await?;
    Ok(record)
}

fn apply(record: &mut CredentialRecord, change: CredentialChange) -> StoreResult<()> {
    match change {
        CredentialChange::Grants { roles, namespaces } => {
            record.roles = roles;
            record.namespaces = namespaces;
        }
        CredentialChange::AddSecret(secret) => {
            if record.secrets.len() >= MAX_CREDENTIAL_SECRETS {
                return Err(Refusal::new(
                    Reason::CredentialSecretLimitReached,
                    format!("A credential holds at most {MAX_CREDENTIAL_SECRETS} secrets; remove one first."),
                )
                .with("principal", record.principal.clone())
                .with("limit", MAX_CREDENTIAL_SECRETS)
                .into());
            }
            record.secrets.push(secret);
        }
        CredentialChange::RemoveSecret { secret_id } => {
            let Some(index) = record.secrets.iter().position(|secret| secret.secret_id == secret_id) else {
                return Err(Refusal::new(
                    Reason::CredentialSecretNotFound,
                    format!("Credential {:?} has no secret {secret_id:?}.", record.principal),
                )
                .with("principal", record.principal.clone())
                .with("secret_id", secret_id)
                .into());
            };
            if record.secrets.len() == 1 {
                return Err(Refusal::new(
                    Reason::CredentialNeedsASecret,
                    "The last secret of a credential stays; delete the credential to stop it acting.",
                )
                .with("principal", record.principal.clone())
                .with("secret_id", secret_id)
                .into());
            }
            record.secrets.remove(index);
        }
    }
    Ok(())
}

pub(crate) async fn delete_credential<T: Tx>(
    tx: &mut T,
    principal: &str,
    by: Option<Principal>,
    now: Millis,
) -> StoreResult<CredentialRecord> {
    let row = tx.query_opt(LOCK_CREDENTIAL.sql(tx.dialect()), &args![principal]).await?;
    let record = row
        .as_ref()
        .map(record_of)
        .transpose()?
        .ok_or_else(|| credential_missing(principal))?;
    tx.execute("DELETE FROM credentials WHERE principal = $1", &args![principal])
        .await?;
    record_event(tx, &record, CredentialAction::Deleted, None, &by, now).await?;
    Ok(record)
}

/// What an event keeps of the credential besides who and what: its grants.
#[derive(Serialize, Deserialize)]
struct EventDetail {
    roles: Vec<String>,
    namespaces: Option<Vec<String>>,
}

async fn record_event<T: Tx>(
    tx: &mut T,
    record: &CredentialRecord,
    action: CredentialAction,
    secret_id: Option<String>,
    by: &Option<Principal>,
    now: Millis,
) -> StoreResult<()> {
    let detail = serde_json::to_string(&EventDetail {
        roles: record.roles.clone(),
        namespaces: record.namespaces.clone(),
    })?;
    let by = by.as_ref().map(|principal| principal.to_json().to_string());
    let sql = "INSERT INTO credential_events (principal, action, secret_id, by_principal, recorded_at, detail)
               VALUES ($1, $2, $3, $4, $5, $6)";
    let args = args![
        record.principal.as_str(),
        action.as_str(),
        secret_id.as_deref(),
        by.as_deref(),
        now,
        detail.as_str()
    ];
    tx.execute(sql, &args).await?;
    Ok(())
}

pub(crate) async fn credential_events<T: Tx>(
    tx: &mut T,
    principal: Option<&str>,
    before: Option<i64>,
    limit: usize,
) -> StoreResult<Vec<CredentialEvent>> {
    let sql = "SELECT sequence, principal, action, secret_id, by_principal, recorded_at, detail FROM credential_events
               WHERE (CAST($1 AS TEXT) IS NULL OR principal = $1) AND (CAST($2 AS BIGINT) IS NULL OR sequence < $2)
               ORDER BY sequence DESC LIMIT $3";
    let rows = tx.query(sql, &args![principal, before, limit as i64]).await?;
    rows.iter()
        .map(|row| {
            let detail: EventDetail = serde_json::from_str(row.str(6)?)?;
            let by = row.opt_str(4)?.map(serde_json::from_str::<Value>).transpose()?;
            Ok(CredentialEvent {
                sequence: row.int(0)?,
                principal: row.text(1)?,
                action: row.text(2)?,
                secret_id: row.opt_str(3)?.map(str::to_string),
                roles: detail.roles,
                namespaces: detail.namespaces,
                by: by.as_ref().and_then(Principal::from_json),
                recorded_at: row.int(5)?,
            })
        })
        .collect()
}
