//! `/auth/credentials`: named credentials an admin manages over the API, beside the credentials
//! file. A secret is generated here, answered once, and kept only as its digest; every change
//! takes effect on this node at once and on the others within seconds (they read the database
//! again). Only an admin bound to no namespace may call these routes: anything less could
//! grant itself more.

use crate::auth::{self, Caller, Credential, Role};
use crate::body::JsonObject;
use crate::error::{ApiError, ApiResult};
use crate::wire::{refuse_unknown_fields, Fields};
use crate::{render, Shared};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use capstan_app::credentials::{self as use_case, Grants};
use capstan_engine::{principal, Reason, Refusal};
use capstan_store::{CredentialAction, CredentialRecord, Store};
use serde_json::{json, Map, Value};

const GRANT_FIELDS: &[&str] = &["roles", "namespaces"];

fn admin<S: Store>(state: &Shared<S>, headers: &HeaderMap) -> ApiResult<Caller> {
    state.config.auth.require(headers, &[Role::Admin])
}

fn stored_json(record: &CredentialRecord) -> Value {
    let secrets: Vec<Value> = record
        .secrets
        .iter()
        .map(|secret| {
            json!({
                "secret_id": secret.secret_id,
                "created_at": render::time(secret.created_at),
                "created_by": principal::recorded(secret.created_by.as_ref()),
            })
        })
        .collect();
    json!({
        "principal": record.principal,
        "source": "api",
        "roles": record.roles,
        "namespaces": record.namespaces,
        "secret_count": secrets.len(),
        "secrets": secrets,
        "created_at": render::time(record.created_at),
        "created_by": principal::recorded(record.created_by.as_ref()),
        "updated_at": render::time(record.updated_at),
        "updated_by": principal::recorded(record.updated_by.as_ref()),
    })
}

/// A credential of the file: its secrets have no ids (the file is their source).
fn file_json(credential: &Credential) -> Value {
    json!({
        "principal": credential.principal,
        "source": "file",
        "roles": credential.roles.iter().map(|role| role.as_str()).collect::<Vec<_>>(),
        "namespaces": credential.namespaces,
        "secret_count": credential.secret_count(),
    })
}

/// The answer to a change that made a secret: the only time the secret is shown.
fn with_secret(record: &CredentialRecord, secret_id: &str, secret: &str) -> Response {
    let body = json!({
        "credential": stored_json(record),
        "secret": {"secret_id": secret_id, "token": secret},
    });
    (StatusCode::CREATED, Json(body)).into_response()
}

fn grants(body: &Map<String, Value>) -> ApiResult<Grants> {
    let f = Fields::new(body);
    if !body.contains_key("roles") {
        return Err(ApiError::validation("roles", "The roles field is required."));
    }
    let namespaces = match body.get("namespaces") {
        None | Some(Value::Null) => None,
        Some(_) => Some(f.string_list("namespaces")?.into_iter().map(|n| n.to_lowercase()).collect()),
    };
    Ok(Grants {
        roles: f.string_list("roles")?,
        namespaces,
    })
}

fn new_secret() -> ApiResult<String> {
    auth::generate_secret().map_err(|message| {
        tracing::error!(%message, "no secret generated");
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, Reason::InternalError, message)
    })
}

/// Puts the database's credentials in force on this node now (the others follow within
/// seconds). The change is committed already: a failed read is logged, not answered, and the
/// next periodic read puts it in force. Without authentication there is nothing to put in force.
async fn refresh<S: Store>(state: &Shared<S>) {
    if let Some(credentials) = state.config.auth.credentials() {
        if let Err(error) = auth::load_managed_credentials(credentials, &state.store).await {
            tracing::warn!(%error, "stored credentials not read after a change; the next periodic read applies it");
        }
    }
}

/// 409 when the file or a command-line token defines `principal`: the API manages only its own.
fn refuse_reserved<S: Store>(state: &Shared<S>, principal: &str) -> ApiResult<()> {
    let in_file = state.config.auth.credentials().is_some_and(|c| c.file_defines(principal));
    if in_file || auth::shortcut_principal(principal) {
        let source = if in_file { "the credentials file" } else { "a command-line token" };
        return Err(Refusal::new(
            Reason::CredentialManagedByFile,
            format!("Principal {principal:?} is defined by {source}; change it there."),
        )
        .with("principal", principal)
        .into());
    }
    Ok(())
}

/// The log line of a committed change (the audit trail holds it too).
fn audit_log(action: CredentialAction, principal: &str, by: &Caller, secret_id: Option<&str>) {
    let action = action.as_str();
    tracing::info!(action, %principal, by = %by.principal.id, secret_id, "credential changed");
}

/// `GET /auth/credentials`: every named credential, the file's and the API's; never a secret
/// or a digest.
pub async fn list<S: Store>(State(state): State<Shared<S>>, headers: HeaderMap) -> ApiResult<Json<Value>> {
    admin(&state, &headers)?;
    let mut credentials: Vec<Value> = match state.config.auth.credentials() {
        Some(configured) => configured.of_file().iter().map(file_json).collect(),
        None => vec![],
    };
    credentials.extend(state.store.credentials().await?.iter().map(stored_json));
    Ok(Json(json!({"credentials": credentials})))
}

/// `POST /auth/credentials` `{principal, roles, namespaces?}`: a new credential with one
/// generated secret, answered once.
pub async fn create<S: Store>(State(state): State<Shared<S>>, headers: HeaderMap, JsonObject(body): JsonObject) -> ApiResult<Response> {
    let caller = admin(&state, &headers)?;
    refuse_unknown_fields(&body, &[&["principal"], GRANT_FIELDS], "", "credentials")?;
    let principal = Fields::new(&body).req_str("principal", use_case::PRINCIPAL_MAX)?;
    use_case::check_principal(&principal)?;
    refuse_reserved(&state, &principal)?;
    let secret = new_secret()?;
    let digest = auth::stored_form(&secret);
    let record = use_case::create(&*state, &principal, grants(&body)?, digest, &caller.principal).await?;
    refresh(&state).await;
    let secret_id = &record.secrets[0].secret_id;
    audit_log(CredentialAction::Created, &principal, &caller, Some(secret_id));
    Ok(with_secret(&record, secret_id, &secret))
}

/// `GET /auth/credentials/{principal}`.
pub async fn describe<S: Store>(
    State(state): State<Shared<S>>,
    headers: HeaderMap,
    Path(principal): Path<String>,
) -> ApiResult<Json<Value>> {
    admin(&state, &headers)?;
    if let Some(record) = state.store.credentials().await?.iter().find(|c| c.principal == principal) {
        return Ok(Json(stored_json(record)));
    }
    let configured = state.config.auth.credentials();
    match configured.and_then(|c| c.of_file().iter().find(|c| c.principal == principal).cloned()) {
        Some(credential) => Ok(Json(file_json(&credential))),
        None => Err(not_found(&principal)),
    }
}

fn not_found(principal: &str) -> ApiError {
    Refusal::new(Reason::CredentialNotFound, format!("No credential of principal {principal:?}."))
        .with("principal", principal)
        .into()
}

/// `PUT /auth/credentials/{principal}` `{roles, namespaces}`: replaces what it may do.
pub async fn regrant<S: Store>(
    State(state): State<Shared<S>>,
    headers: HeaderMap,
    Path(principal): Path<String>,
    JsonObject(body): JsonObject,
) -> ApiResult<Json<Value>> {
    let caller = admin(&state, &headers)?;
    refuse_unknown_fields(&body, &[GRANT_FIELDS], "", "credential grants")?;
    refuse_reserved(&state, &principal)?;
    let record = use_case::regrant(&*state, &principal, grants(&body)?, &caller.principal).await?;
    refresh(&state).await;
    audit_log(CredentialAction::Regranted, &principal, &caller, None);
    Ok(Json(stored_json(&record)))
}

/// `DELETE /auth/credentials/{principal}`: none of its secrets authenticates any more.
pub async fn delete<S: Store>(State(state): State<Shared<S>>, headers: HeaderMap, Path(principal): Path<String>) -> ApiResult<Json<Value>> {
    let caller = admin(&state, &headers)?;
    refuse_reserved(&state, &principal)?;
    let record = use_case::delete(&*state, &principal, &caller.principal).await?;
    refresh(&state).await;
    audit_log(CredentialAction::Deleted, &principal, &caller, None);
    let mut body = stored_json(&record);
    body["status"] = json!("deleted");
    Ok(Json(body))
}

/// `POST /auth/credentials/{principal}/secrets`: a new secret beside the others (a rotation's
/// first half), answered once.
pub async fn add_secret<S: Store>(
    State(state): State<Shared<S>>,
    headers: HeaderMap,
    Path(principal): Path<String>,
) -> ApiResult<Response> {
    let caller = admin(&state, &headers)?;
    refuse_reserved(&state, &principal)?;
    let secret = new_secret()?;
    let digest = auth::stored_form(&secret);
    let (record, secret_id) = use_case::add_secret(&*state, &principal, digest, &caller.principal).await?;
    refresh(&state).await;
    audit_log(CredentialAction::SecretAdded, &principal, &caller, Some(&secret_id));
    Ok(with_secret(&record, &secret_id, &secret))
}

/// `DELETE /auth/credentials/{principal}/secrets/{secret_id}`: a retired secret (a rotation's
/// second half); it stops authenticating at once here, within seconds on the other nodes.
pub async fn remove_secret<S: Store>(
    State(state): State<Shared<S>>,
    headers: HeaderMap,
    Path((principal, secret_id)): Path<(String, String)>,
) -> ApiResult<Json<Value>> {
    let caller = admin(&state, &headers)?;
    refuse_reserved(&state, &principal)?;
    let record = use_case::remove_secret(&*state, &principal, &secret_id, &caller.principal).await?;
    refresh(&state).await;
    audit_log(CredentialAction::SecretRemoved, &principal, &caller, Some(&secret_id));
    Ok(Json(stored_json(&record)))
}
