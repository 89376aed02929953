//! The HTTP edge of the OpenAI API for axum servers (the gateway, the worker, the dashboard):
//! an API error as an answer, a request body read under a size and time limit, refused with
//! the API's errors. The server loop, access control and TLS are `kvroute_runtime`'s.

use super::ApiError;
use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http_body_util::BodyExt;

/// An OpenAI error answer: its status, the JSON body, `Retry-After` when the error has a
/// retry delay.
pub fn error_response(e: &ApiError) -> Response {
    let status = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut resp = (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        e.to_json(),
    )
        .into_response();
    if let Some(secs) = e.retry_after_secs {
        resp.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(secs));
    }
    resp
}

/// Reads a body of at most `limit` bytes within `timeout`: 413 beyond (at once when
/// `Content-Length` says so), 408 when it is not all there in time, 400 when the connection
/// breaks.
pub async fn read_body(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
    timeout: std::time::Duration,
) -> Result<Bytes, ApiError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(ApiError::body_too_large(limit));
    }
    let read = http_body_util::Limited::new(body, limit).collect();
    let Ok(read) = tokio::time::timeout(timeout, read).await else {
        return Err(ApiError::body_timeout(timeout));
    };
    match read {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            Err(ApiError::body_too_large(limit))
        }
        Err(e) => Err(ApiError::invalid(format!(
            "could not read the request body: {e}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn bodies_over_the_limit_are_413_and_errors_carry_retry_after() {
        let t = std::time::Duration::from_secs(5);
        let ok = read_body(&HeaderMap::new(), Body::from("12345"), 5, t).await;
        assert_eq!(ok.unwrap(), Bytes::from("12345"));
        let e = read_body(&HeaderMap::new(), Body::from("123456"), 5, t)
            .await
            .unwrap_err();
        assert_eq!(e.status(), 413);
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_LENGTH, HeaderValue::from(100u64));
        assert_eq!(
            read_body(&h, Body::empty(), 5, t)
                .await
                .unwrap_err()
                .status(),
            413
        );
        let r = error_response(&ApiError::unavailable("busy", "later", 3));
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(r.headers()[header::RETRY_AFTER], "3");
    }
}
