//! Every refusal the agent's API sends is an [`ApiError`] as JSON, with
//! the status of its kind: also those made by the HTTP layer before any
//! handler runs (a body over the size limit, a path the API does not
//! have, a method a path does not take), which axum answers in plain
//! text. A client, and docs/api/openapi.json, then meet one error shape.
//! (The one refusal left as it is: the dashboard's login form, in HTML.)

use crate::model::ApiError;
use axum::http::header;
use axum::response::{IntoResponse, Response};

/// How much of a plain-text refusal is kept as the message.
const MESSAGE_LIMIT: usize = 512;

/// The response as it is when it is a success or already JSON; else the
/// refusal it stands for, as an [`ApiError`].
pub async fn as_json(response: Response) -> Response {
    let status = response.status();
    let content_type = response.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    let json = content_type.starts_with("application/json");
    // An HTML refusal is the dashboard's login form, written for a person.
    let html = content_type.starts_with("text/html");
    if !(status.is_client_error() || status.is_server_error()) || json || html {
        return response;
    }
    let mut headers = response.headers().clone();
    let body = axum::body::to_bytes(response.into_body(), MESSAGE_LIMIT * 4).await.unwrap_or_default();
    let text = String::from_utf8_lossy(&body);
    let said = text.lines().next().unwrap_or("").trim();
    let mut message = match said {
        "" => status.canonical_reason().unwrap_or("refused").to_lowercase(),
        _ => said.to_string(),
    };
    message.truncate(MESSAGE_LIMIT);
    let error = match status.as_u16() {
        401 => ApiError::Unauthorized(message),
        404 => ApiError::NotFound(message),
        409 => ApiError::Conflict(message),
        422 => ApiError::Refused(message),
        503 => ApiError::Unavailable(message),
        // 405, 413, 415 and the like: a request the API cannot take.
        400..=499 => ApiError::BadRequest(message),
        _ => ApiError::Internal(message),
    };
    let mut out = error.into_response();
    // What the refusal said about the request's method (Allow) stays.
    if let Some(allow) = headers.remove(header::ALLOW) {
        out.headers_mut().insert(header::ALLOW, allow);
    }
    out
}
