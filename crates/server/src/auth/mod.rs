//! Bearer-token authentication with DW's three roles, named credentials and the principal a
//! request acts as.

use crate::error::ApiError;
use axum::http::{HeaderMap, StatusCode};
use capstan_engine::Reason;

mod credentials;

/// The header the server itself sets to the principal a connection's verified client
/// certificate maps to (`routes::certify`). Whatever a client sends under this name is removed
/// before anything reads it.
pub const CERTIFIED_PRINCIPAL: &str = "x-capstan-certified-principal";

use credentials::constant_time_eq;
pub use credentials::{generate_secret, stored_form, Credential, Credentials};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    Worker,
    Operator,
    Admin,
}

impl Role {
    pub fn named(name: &str) -> Option<Role> {
        match name {
            "worker" => Some(Role::Worker),
            "operator" => Some(Role::Operator),
            "admin" => Some(Role::Admin),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Worker => "worker",
            Role::Operator => "operator",
            Role::Admin => "admin",
        }
    }
}

pub use capstan_engine::Principal;

/// An authenticated request's principal, roles and namespaces.
#[derive(Clone, Debug)]
pub struct Caller {
    pub principal: Principal,
    pub roles: Vec<Role>,
    /// The namespaces it may act in; `None` for every namespace.
    pub namespaces: Option<std::collections::BTreeSet<String>>,
}

impl Caller {
    fn everyone() -> Self {
        Self {
            principal: Principal::anonymous(),
            roles: vec![Role::Worker, Role::Operator, Role::Admin],
            namespaces: None,
        }
    }

    /// 403 unless the caller may act in `namespace`.
    pub fn require_namespace(&self, namespace: &str) -> Result<(), ApiError> {
        match &self.namespaces {
            Some(allowed) if !allowed.contains(namespace) => Err(ApiError::new(
                StatusCode::FORBIDDEN,
                Reason::Forbidden,
                "The credential may not act in this namespace.",
            )
            .with("namespace", namespace)),
            _ => Ok(()),
        }
    }
}

#[derive(Clone, Debug, Default)]
pub enum AuthConfig {
    /// No authentication: every caller holds every role, as the anonymous principal.
    #[default]
    None,
    /// Bearer tokens: named credentials (`credentials`), and the unnamed shortcuts of the
    /// command line. A shared token acts as every role; role tokens only as their role (admin
    /// also as operator). A shortcut's principal is DW's subject for it: `legacy-token` for the
    /// shared token, `role:worker`, `role:operator`, `role:admin` for the role tokens.
    Token {
        shared: Option<String>,
        worker: Option<String>,
        operator: Option<String>,
        admin: Option<String>,
        credentials: Credentials,
    },
}

/// The shortcut principals (DW's subjects for its legacy and role tokens), in the order of
/// `--token`, `--worker-token`, `--operator-token`, `--admin-token`.
const SHORTCUTS: [(&str, &[Role]); 4] = [
    ("legacy-token", &[Role::Worker, Role::Operator, Role::Admin]),
    ("role:worker", &[Role::Worker]),
    ("role:operator", &[Role::Operator]),
    ("role:admin", &[Role::Operator, Role::Admin]),
];

impl AuthConfig {
    /// Who the request's credentials say the caller is, or 401.
    pub fn authenticate(&self, headers: &HeaderMap) -> Result<Caller, ApiError> {
        let AuthConfig::Token {
            shared,
            worker,
            operator,
            admin,
            credentials,
        } = self
        else {
            return Ok(Caller::everyone());
        };
        let Some(token) = bearer_token(headers) else {
            // A verified client certificate mapped to a credential (`crate::tls`) stands for one.
            let certified = headers.get(CERTIFIED_PRINCIPAL).and_then(|v| v.to_str().ok());
            if let Some(credential) = certified.and_then(|principal| credentials.by_principal(principal)) {
                return Ok(Caller {
                    principal: Principal::certificate(&credential.principal),
                    roles: credential.roles.iter().copied().collect(),
                    namespaces: credential.namespaces.clone(),
                });
            }
            return Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                Reason::Unauthorized,
                "A bearer token, or a client certificate a credential names, is required.",
            ));
        };
        if let Some(credential) = credentials.find(token) {
            return Ok(Caller {
                principal: Principal::token(&credential.principal),
                roles: credential.roles.iter().copied().collect(),
                namespaces: credential.namespaces.clone(),
            });
        }
        // Every shortcut is compared, matched or not.
        let matched = [shared, worker, operator, admin]
            .iter()
            .zip(SHORTCUTS)
            .fold(None, |found, (configured, shortcut)| {
                let matches = configured
                    .as_deref()
                    .is_some_and(|c| constant_time_eq(c.as_bytes(), token.as_bytes()));
                found.or(matches.then_some(shortcut))
            });
        let Some((name, roles)) = matched else {
            return Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                Reason::Unauthorized,
                "The bearer token is not valid.",
            ));
        };
        Ok(Caller {
            principal: Principal::token(name),
            roles: roles.to_vec(),
            namespaces: None,
        })
    }

    /// 401 without valid credentials, 403 when none of them grants `needed`; the caller. For
    /// endpoints that show nothing of any namespace (cluster info); the others use
    /// [`require`](Self::require) or [`require_in`](Self::require_in).
    pub fn require_role(&self, headers: &HeaderMap, needed: &[Role]) -> Result<Caller, ApiError> {
        let caller = self.authenticate(headers)?;
        if needed.iter().any(|role| caller.roles.contains(role)) {
            Ok(caller)
        } else {
            Err(ApiError::new(
                StatusCode::FORBIDDEN,
                Reason::Forbidden,
                "The token's role may not call this endpoint.",
            ))
        }
    }

    /// For an endpoint that spans namespaces (the server, every namespace): 401 without valid
    /// credentials, 403 when none of them grants `needed` or the credential is bound to
    /// namespaces; the caller.
    pub fn require(&self, headers: &HeaderMap, needed: &[Role]) -> Result<Caller, ApiError> {
        let caller = self.require_role(headers, needed)?;
        if caller.namespaces.is_some() {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                Reason::Forbidden,
                "The credential is bound to namespaces; this endpoint spans them.",
            ));
        }
        Ok(caller)
    }

    /// For an endpoint in `namespace`: as [`require`](Self::require), and 403 unless the
    /// caller may act in `namespace`.
    pub fn require_in(&self, headers: &HeaderMap, needed: &[Role], namespace: &str) -> Result<Caller, ApiError> {
        let caller = self.require_role(headers, needed)?;
        caller.require_namespace(namespace)?;
        Ok(caller)
    }

    /// The named credentials, if any are configured.
    pub fn credentials(&self) -> Option<&Credentials> {
        match self {
            AuthConfig::Token { credentials, .. } => Some(credentials),
            AuthConfig::None => None,
        }
    }
}

/// How often the credentials file and the database's credentials are read again.
const CREDENTIALS_RECHECK: std::time::Duration = std::time::Duration::from_secs(2);

/// The principals the command-line tokens act as: reserved, no named credential takes them.
pub fn shortcut_principal(principal: &str) -> bool {
    SHORTCUTS.iter().any(|(name, _)| *name == principal)
}

/// Puts the database's credentials (those managed over the API) in force on this node. A
/// record this build cannot read is logged and left out.
pub async fn load_managed_credentials<S: capstan_store::Store>(credentials: &Credentials, store: &S) -> capstan_store::StoreResult<usize> {
    let records = store.credentials().await?;
    for principal in credentials.set_managed(&records) {
        tracing::error!(%principal, "stored credential unreadable (unknown role or malformed digest); it does not authenticate");
    }
    Ok(records.len())
}

/// Keeps the credentials in force current for as long as the server runs: the file is read
/// again whenever it changes (a rotation), the database's credentials every
/// [`CREDENTIALS_RECHECK`] (a change made over the API on another node). An invalid file, or a
/// database that does not answer, is logged and the credentials in force stay.
pub async fn follow_credentials<S: capstan_store::Store>(credentials: Credentials, state: crate::Shared<S>) {
    let path = credentials.path().map(|p| p.display().to_string());
    if let Some(path) = &path {
        tracing::info!(file = %path, credentials = credentials.len(), "named credentials loaded");
    }
    loop {
        tokio::time::sleep(CREDENTIALS_RECHECK).await;
        match (credentials.reload_if_changed(), &path) {
            (Ok(Some(count)), Some(path)) => tracing::info!(file = %path, credentials = count, "named credentials reloaded"),
            (Err(error), Some(path)) => {
                tracing::error!(file = %path, %error, "credentials file refused; the previous credentials stay in force")
            }
            _ => {}
        }
        if let Err(error) = load_managed_credentials(&credentials, &state.store).await {
            tracing::warn!(%error, "stored credentials not read; the previous ones stay in force");
        }
    }
}

fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
        .map(str::trim)
        .filter(|t| !t.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(token: Option<&str>) -> HeaderMap {
        let mut headers = HeaderMap::new();
        if let Some(token) = token {
            headers.insert("authorization", format!("Bearer {token}").parse().unwrap());
        }
        headers
    }

    #[test]
    fn role_tokens_grant_only_their_role() {
        let auth = AuthConfig::Token {
            shared: None,
            worker: Some("w".into()),
            operator: Some("o".into()),
            admin: Some("a".into()),
            credentials: Credentials::default(),
        };
        assert!(auth.require(&headers(Some("w")), &[Role::Worker]).is_ok());
        assert_eq!(
            auth.require(&headers(Some("w")), &[Role::Operator]).unwrap_err().status,
            StatusCode::FORBIDDEN
        );
        assert!(auth.require(&headers(Some("a")), &[Role::Operator]).is_ok());
        assert_eq!(
            auth.require(&headers(Some("x")), &[Role::Worker]).unwrap_err().status,
            StatusCode::UNAUTHORIZED
        );
        assert_eq!(
            auth.require(&headers(None), &[Role::Worker]).unwrap_err().status,
            StatusCode::UNAUTHORIZED
        );
    }
}
