//! The planes a request enters by (DW's order: auth → role → version → namespace): the
//! worker plane, the control plane, the namespace routes and the payload plane, each a
//! middleware that authenticates the caller, checks the protocol version, resolves the
//! [`Namespace`] and hands both to the handler as extensions. Worker-plane responses get the
//! protocol members every SDK expects.

use crate::auth::Role;
use crate::error::ApiError;
use crate::{AppState, Shared, CONTROL_PLANE_VERSION, WORKER_PROTOCOL_MINOR, WORKER_PROTOCOL_VERSION};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use capstan_engine::Reason;
use capstan_store::Store;
use serde_json::json;

mod capabilities;

pub use capabilities::server_capabilities;

/// The namespace a request addresses, resolved by the plane middleware.
#[derive(Clone, Debug)]
pub struct Namespace(pub String);

/// `X-Namespace`, else `?namespace=`, else `default`; lower-cased.
fn namespace_of(request: &Request) -> String {
    let from_header = request
        .headers()
        .get("x-namespace")
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|s| !s.is_empty());
    let from_query = || {
        request.uri().query().and_then(|q| {
            q.split('&')
                .find_map(|pair| pair.strip_prefix("namespace=").filter(|v| !v.is_empty()).map(|v| v.to_string()))
        })
    };
    from_header
        .map(str::to_string)
        .or_else(from_query)
        .unwrap_or_else(|| "default".into())
        .to_lowercase()
}

async fn require_namespace<S: Store>(state: &AppState<S>, namespace: &str) -> Result<(), ApiError> {
    if state.store.namespace_exists(namespace).await? {
        Ok(())
    } else {
        Err(ApiError::new(
            StatusCode::NOT_FOUND,
            Reason::NamespaceNotFound,
            format!("Namespace {namespace:?} does not exist."),
        )
        .with("namespace", namespace))
    }
}

/// Accepts `1.N` for N ≤ the advertised minor.
fn check_worker_version(headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(raw) = headers.get("x-durable-workflow-protocol-version") else {
        return Err(version_error(
            Reason::MissingProtocolVersion,
            "The X-Durable-Workflow-Protocol-Version header is required.",
            WORKER_PROTOCOL_VERSION,
            None,
        ));
    };
    let requested = raw.to_str().unwrap_or("").trim().to_string();
    let supported = requested
        .split_once('.')
        .and_then(|(major, minor)| Some((major.parse::<u32>().ok()?, minor.parse::<u32>().ok()?)))
        .is_some_and(|(major, minor)| major == 1 && minor <= WORKER_PROTOCOL_MINOR);
    if supported {
        Ok(())
    } else {
        Err(version_error(
            Reason::UnsupportedProtocolVersion,
            "Unsupported worker protocol version.",
            WORKER_PROTOCOL_VERSION,
            Some(requested),
        ))
    }
}

fn check_control_version(headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(raw) = headers.get("x-durable-workflow-control-plane-version") else {
        return Err(version_error(
            Reason::MissingControlPlaneVersion,
            "The X-Durable-Workflow-Control-Plane-Version header is required.",
            CONTROL_PLANE_VERSION,
            None,
        ));
    };
    let requested = raw.to_str().unwrap_or("").trim().to_string();
    if requested == CONTROL_PLANE_VERSION {
        Ok(())
    } else {
        Err(version_error(
            Reason::UnsupportedControlPlaneVersion,
            "Unsupported control plane version.",
            CONTROL_PLANE_VERSION,
            Some(requested),
        ))
    }
}

fn version_error(reason: Reason, message: &str, supported: &str, requested: Option<String>) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, reason, message)
        .with("supported_version", supported)
        .with("requested_version", requested)
        .with("remediation", format!("Send version {supported}."))
}

pub(crate) async fn worker_plane<S: Store>(State(state): State<Shared<S>>, mut request: Request, next: Next) -> Response {
    let namespace = namespace_of(&request);
    let headers = request.headers().clone();
    let deferred = success_proves_namespace(request.uri().path());
    let checked = async {
        let caller = state.config.auth.require_in(&headers, &[Role::Worker], &namespace)?;
        check_worker_version(&headers)?;
        if !deferred {
            require_namespace(&state, &namespace).await?;
        }
        Ok::<_, ApiError>(caller)
    }
    .await;
    let response = match checked {
        Ok(caller) => {
            request.extensions_mut().insert(Namespace(namespace.clone()));
            request.extensions_mut().insert(caller);
            let response = next.run(request).await;
            match require_namespace_if_refused(&state, &namespace, deferred, response.status()).await {
                Err(error) => error.into_response(),
                Ok(()) => response,
            }
        }
        Err(error) => error.into_response(),
    };
    decorate_worker_response(response).await
}

/// Worker calls whose success already proves their namespace exists: a poll needs the worker's
/// registration and a task report an open task, and a namespace is deleted only when it has no
/// workflows, its registrations with it. These skip the namespace lookup (one read fewer on the
/// hottest calls) unless they are refused, when it decides which error to give.
fn success_proves_namespace(path: &str) -> bool {
    path.ends_with("/workflow-tasks/poll")
        || path.ends_with("/activity-tasks/poll")
        || path.contains("/workflow-tasks/")
        || path.contains("/activity-tasks/")
}

async fn require_namespace_if_refused<S: Store>(
    state: &AppState<S>,
    namespace: &str,
    deferred: bool,
    status: StatusCode,
) -> Result<(), ApiError> {
    if deferred && !status.is_success() {
        require_namespace(state, namespace).await?;
    }
    Ok(())
}

/// Every worker-plane body carries `protocol_version` and `server_capabilities`; every response
/// carries the protocol header. The two members are written into the object as it came from
/// the handler, without parsing it again: a poll's body holds a whole history page, and no
/// worker-plane handler writes either member itself.
async fn decorate_worker_response(response: Response) -> Response {
    let (mut parts, body) = response.into_parts();
    parts.headers.insert(
        "x-durable-workflow-protocol-version",
        HeaderValue::from_static(WORKER_PROTOCOL_VERSION),
    );
    let Ok(bytes) = axum::body::to_bytes(body, crate::body::BODY_BYTES_MAX * 2).await else {
        return (StatusCode::INTERNAL_SERVER_ERROR, "response too large").into_response();
    };
    let body = match decorated(&bytes) {
        Some(decorated) => axum::body::Body::from(decorated),
        None => axum::body::Body::from(bytes),
    };
    parts.headers.remove(axum::http::header::CONTENT_LENGTH);
    Response::from_parts(parts, body)
}

/// A JSON object body with the worker-plane members first; `None` for anything else.
fn decorated(body: &[u8]) -> Option<Vec<u8>> {
    static MEMBERS: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let members = MEMBERS.get_or_init(|| {
        let object = json!({
            "protocol_version": WORKER_PROTOCOL_VERSION,
            "server_capabilities": server_capabilities(),
        })
        .to_string();
        // The members without the braces around them.
        object[1..object.len() - 1].to_string()
    });
    let rest = body.strip_prefix(b"{")?;
    let empty = rest.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'}');
    let mut out = Vec::with_capacity(body.len() + members.len() + 2);
    out.push(b'{');
    out.extend_from_slice(members.as_bytes());
    if !empty {
        out.push(b',');
    }
    out.extend_from_slice(rest);
    Some(out)
}

/// The namespace routes: the control plane's auth and version checks, without requiring the
/// `X-Namespace` to exist (the namespace is the path).
/// Namespace administration: a credential bound to namespaces sees and administers only its
/// own (the handlers check; creating and deleting namespaces spans them).
pub(crate) async fn namespace_plane<S: Store>(State(state): State<Shared<S>>, mut request: Request, next: Next) -> Response {
    let headers = request.headers().clone();
    let checked = state
        .config
        .auth
        .require_role(&headers, &[Role::Operator, Role::Admin])
        .and_then(|caller| check_control_version(&headers).map(|()| caller));
    let mut response = match checked {
        Ok(caller) => {
            request.extensions_mut().insert(caller);
            next.run(request).await
        }
        Err(error) => error.into_response(),
    };
    response.headers_mut().insert(
        "x-durable-workflow-control-plane-version",
        HeaderValue::from_static(CONTROL_PLANE_VERSION),
    );
    response
}

pub(crate) async fn payload_plane<S: Store>(State(state): State<Shared<S>>, mut request: Request, next: Next) -> Response {
    let namespace = namespace_of(&request);
    let headers = request.headers().clone();
    let checked = async {
        let caller = state
            .config
            .auth
            .require_in(&headers, &[Role::Worker, Role::Operator, Role::Admin], &namespace)?;
        require_namespace(&state, &namespace).await?;
        Ok::<_, ApiError>(caller)
    }
    .await;
    match checked {
        Ok(caller) => {
            request.extensions_mut().insert(Namespace(namespace));
            request.extensions_mut().insert(caller);
            next.run(request).await
        }
        Err(error) => error.into_response(),
    }
}

pub(crate) async fn control_plane<S: Store>(State(state): State<Shared<S>>, mut request: Request, next: Next) -> Response {
    let namespace = namespace_of(&request);
    let headers = request.headers().clone();
    let checked = async {
        let caller = state.config.auth.require_in(&headers, &[Role::Operator, Role::Admin], &namespace)?;
        check_control_version(&headers)?;
        require_namespace(&state, &namespace).await?;
        Ok::<_, ApiError>(caller)
    }
    .await;
    let mut response = match checked {
        Ok(caller) => {
            request.extensions_mut().insert(Namespace(namespace));
            request.extensions_mut().insert(caller);
            next.run(request).await
        }
        Err(error) => error.into_response(),
    };
    response.headers_mut().insert(
        "x-durable-workflow-control-plane-version",
        HeaderValue::from_static(CONTROL_PLANE_VERSION),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Map, Value};

    fn members(body: &[u8]) -> Map<String, Value> {
        let text = String::from_utf8(decorated(body).expect("an object")).unwrap();
        assert_eq!(text.matches("\"protocol_version\":").count(), 1, "{text}");
        serde_json::from_str(&text).expect("still JSON")
    }

    #[test]
    fn worker_bodies_get_the_protocol_members_without_a_reparse() {
        let empty = members(b"{}");
        assert_eq!(empty.len(), 2);
        assert_eq!(empty["protocol_version"], WORKER_PROTOCOL_VERSION);
        assert_eq!(empty["server_capabilities"], server_capabilities());
        let task = members(br#"{"task":{"history_events":[{"sequence":1}]},"poll_status":"leased"}"#);
        assert_eq!(task["task"]["history_events"][0]["sequence"], 1);
        assert_eq!(task["poll_status"], "leased");
        assert!(decorated(b"[1,2]").is_none() && decorated(b"").is_none());
    }
}
