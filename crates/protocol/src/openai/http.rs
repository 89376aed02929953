//! The HTTP edge of the OpenAI API for axum servers (the gateway and the worker): an error as
//! an answer, a request body read under a size limit, and the listener they serve on.

use super::ApiError;
use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http_body_util::BodyExt;
use tokio::net::{TcpListener, TcpStream};

/// `listener` for `axum::serve`, with `TCP_NODELAY` on every accepted connection: a stream
/// writes one small chunk per token, and Nagle's algorithm would hold a chunk back until the
/// client acknowledged the one before (up to the client's delayed-ACK time, 40 ms on Linux).
pub fn nodelay_listener(
    listener: TcpListener,
) -> axum::serve::TapIo<TcpListener, fn(&mut TcpStream)> {
    use axum::serve::ListenerExt;
    fn set_nodelay(stream: &mut TcpStream) {
        // A connection that cannot take the option still works, only with Nagle's delays.
        let _ = stream.set_nodelay(true);
    }
    listener.tap_io(set_nodelay as fn(&mut TcpStream))
}

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

/// Reads a body of at most `limit` bytes: 413 beyond (at once when `Content-Length` says
/// so), 400 when the connection breaks.
pub async fn read_body(headers: &HeaderMap, body: Body, limit: usize) -> Result<Bytes, ApiError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(ApiError::body_too_large(limit));
    }
    match http_body_util::Limited::new(body, limit).collect().await {
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
    async fn served_connections_have_nodelay_and_plain_ones_do_not() {
        use axum::serve::Listener;
        for wrap in [false, true] {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let client = tokio::spawn(TcpStream::connect(addr));
            let accepted = if wrap {
                nodelay_listener(listener).accept().await.0
            } else {
                Listener::accept(&mut { listener }).await.0
            };
            assert_eq!(accepted.nodelay().unwrap(), wrap);
            drop(client.await.unwrap().unwrap());
        }
    }

    #[tokio::test]
    async fn bodies_over_the_limit_are_413_and_errors_carry_retry_after() {
        let ok = read_body(&HeaderMap::new(), Body::from("12345"), 5).await;
        assert_eq!(ok.unwrap(), Bytes::from("12345"));
        let e = read_body(&HeaderMap::new(), Body::from("123456"), 5)
            .await
            .unwrap_err();
        assert_eq!(e.status(), 413);
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_LENGTH, HeaderValue::from(100u64));
        assert_eq!(
            read_body(&h, Body::empty(), 5).await.unwrap_err().status(),
            413
        );
        let r = error_response(&ApiError::unavailable("busy", "later", 3));
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(r.headers()[header::RETRY_AFTER], "3");
    }
}
