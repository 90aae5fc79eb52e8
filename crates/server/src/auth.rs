//! Bearer-token authentication with DW's three roles.

use crate::error::ApiError;
use axum::http::{HeaderMap, StatusCode};
use capstan_engine::Reason;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    Worker,
    Operator,
    Admin,
}

#[derive(Clone, Debug, Default)]
pub enum AuthConfig {
    /// No authentication: every caller holds every role.
    #[default]
    None,
    /// Bearer tokens. A shared token acts as every role; role tokens only as their role
    /// (admin also as operator).
    Token {
        shared: Option<String>,
        worker: Option<String>,
        operator: Option<String>,
        admin: Option<String>,
    },
}

impl AuthConfig {
    /// The roles the request's credentials grant, or 401.
    pub fn roles(&self, headers: &HeaderMap) -> Result<Vec<Role>, ApiError> {
        let AuthConfig::Token {
            shared,
            worker,
            operator,
            admin,
        } = self
        else {
            return Ok(vec![Role::Worker, Role::Operator, Role::Admin]);
        };
        let token = headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| ApiError::new(StatusCode::UNAUTHORIZED, Reason::Unauthorized, "A bearer token is required."))?;
        let matches = |candidate: &Option<String>| {
            candidate
                .as_deref()
                .is_some_and(|c| constant_time_eq(c.as_bytes(), token.as_bytes()))
        };
        let mut roles = Vec::new();
        if matches(shared) {
            roles.extend([Role::Worker, Role::Operator, Role::Admin]);
        }
        if matches(worker) {
            roles.push(Role::Worker);
        }
        if matches(operator) {
            roles.push(Role::Operator);
        }
        if matches(admin) {
            roles.extend([Role::Operator, Role::Admin]);
        }
        if roles.is_empty() {
            return Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                Reason::Unauthorized,
                "The bearer token is not valid.",
            ));
        }
        Ok(roles)
    }

    /// 401 without valid credentials, 403 when none of them grants `needed`.
    pub fn require(&self, headers: &HeaderMap, needed: &[Role]) -> Result<(), ApiError> {
        let roles = self.roles(headers)?;
        if needed.iter().any(|role| roles.contains(role)) {
            Ok(())
        } else {
            Err(ApiError::new(
                StatusCode::FORBIDDEN,
                Reason::Forbidden,
                "The token's role may not call this endpoint.",
            ))
        }
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
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
