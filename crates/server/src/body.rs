//! The JSON body extractor: bounded size, and DW-shaped errors for every way a body can be bad.

use crate::error::ApiError;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use capstan_engine::Reason;
use serde_json::{Map, Value};

/// Request bodies larger than this are refused with 413 before parsing. Payload blobs inside are
/// further bounded by `Limits::payload_bytes_max`.
pub const BODY_BYTES_MAX: usize = 8 * 1024 * 1024;

/// The answer to a body over [`BODY_BYTES_MAX`].
pub fn too_large() -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        Reason::PayloadTooLarge,
        format!("The request body exceeds {BODY_BYTES_MAX} bytes."),
    )
    .with("limit_bytes", BODY_BYTES_MAX)
}

/// A JSON object body; an empty body reads as `{}`.
pub struct JsonObject(pub Map<String, Value>);

#[axum::async_trait]
impl<S: Send + Sync> FromRequest<S> for JsonObject {
    type Rejection = ApiError;

    async fn from_request(request: Request, _state: &S) -> Result<Self, ApiError> {
        let bytes = axum::body::to_bytes(request.into_body(), BODY_BYTES_MAX)
            .await
            .map_err(|_| too_large())?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(JsonObject(Map::new()));
        }
        match serde_json::from_slice::<Value>(&bytes) {
            Ok(Value::Object(map)) => Ok(JsonObject(map)),
            Ok(_) => Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                Reason::InvalidJson,
                "The request body must be a JSON object.",
            )),
            Err(error) => Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                Reason::InvalidJson,
                format!("The request body is not valid JSON: {error}"),
            )),
        }
    }
}
