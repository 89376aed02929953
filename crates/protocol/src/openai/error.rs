//! OpenAI error objects (`{"error": {"message", "type", "param", "code"}}`) and the HTTP
//! status each kind of error maps to: the one place where errors become statuses.

use serde::{Deserialize, Serialize};

/// The kinds of error an OpenAI-compatible server answers with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// Malformed or invalid request (400).
    InvalidRequest,
    /// No valid key (401).
    Unauthorized,
    /// A key, origin or host that may not do this (403).
    Forbidden,
    /// Unknown model or route (404).
    NotFound,
    /// A known route asked with another method (405).
    MethodNotAllowed,
    /// The client did not send its request in time (408).
    RequestTimeout,
    /// Body or prompt too large (413).
    TooLarge,
    /// Overloaded or no healthy worker (503, with `Retry-After`).
    Unavailable,
    /// Shed for load, as an endpoint picker says it (429, with `Retry-After`).
    Overloaded,
    /// A worker failed or answered garbage (502).
    Upstream,
    /// A worker did not answer in time (504).
    Timeout,
    /// A bug or an unexpected state of ours (500).
    Internal,
}

impl ErrorKind {
    /// The HTTP status.
    pub fn status(self) -> u16 {
        match self {
            ErrorKind::InvalidRequest => 400,
            ErrorKind::Unauthorized => 401,
            ErrorKind::Forbidden => 403,
            ErrorKind::NotFound => 404,
            ErrorKind::MethodNotAllowed => 405,
            ErrorKind::RequestTimeout => 408,
            ErrorKind::TooLarge => 413,
            ErrorKind::Unavailable => 503,
            ErrorKind::Overloaded => 429,
            ErrorKind::Upstream => 502,
            ErrorKind::Timeout => 504,
            ErrorKind::Internal => 500,
        }
    }

    /// The `type` field of the error object.
    pub fn type_name(self) -> &'static str {
        match self {
            ErrorKind::InvalidRequest
            | ErrorKind::NotFound
            | ErrorKind::MethodNotAllowed
            | ErrorKind::RequestTimeout
            | ErrorKind::TooLarge => "invalid_request_error",
            ErrorKind::Unavailable => "service_unavailable",
            ErrorKind::Overloaded => "rate_limit_error",
            ErrorKind::Upstream | ErrorKind::Timeout => "upstream_error",
            ErrorKind::Unauthorized => "authentication_error",
            ErrorKind::Forbidden => "permission_error",
            ErrorKind::Internal => "server_error",
        }
    }
}

/// An error answer: status, message, and the optional `param` and `code` fields.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    /// What kind of error (decides the status).
    pub kind: ErrorKind,
    /// Human-readable message.
    pub message: String,
    /// The request field at fault.
    pub param: Option<String>,
    /// A stable machine-readable code (e.g. `model_not_found`, `all_workers_busy`).
    pub code: Option<String>,
    /// Seconds after which a retry may succeed (sent as `Retry-After` on 503).
    pub retry_after_secs: Option<u64>,
}

/// The JSON shape of an error answer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// The error object.
    pub error: ErrorObject,
}

/// The error object inside [`ErrorBody`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ErrorObject {
    /// Human-readable message.
    pub message: String,
    /// The error type.
    #[serde(rename = "type")]
    pub kind: String,
    /// The request field at fault.
    pub param: Option<String>,
    /// A stable code.
    pub code: Option<String>,
}

impl ApiError {
    /// An error of `kind` with `message`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            param: None,
            code: None,
            retry_after_secs: None,
        }
    }

    /// 400 invalid request.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidRequest, message)
    }

    /// 400 about one field.
    pub fn invalid_param(param: &str, message: impl Into<String>) -> Self {
        Self::invalid(message).with_param(param)
    }

    /// 404 for a path no route serves.
    pub fn no_route(method: &str, path: &str) -> Self {
        Self::new(ErrorKind::NotFound, format!("no route for {method} {path}"))
            .with_code("not_found")
    }

    /// 405 for a route asked with a method it does not take.
    pub fn method_not_allowed(method: &str, path: &str) -> Self {
        Self::new(
            ErrorKind::MethodNotAllowed,
            format!("{path} does not take {method}"),
        )
        .with_code("method_not_allowed")
    }

    /// 404 for a model nobody serves.
    pub fn model_not_found(model: &str) -> Self {
        Self::new(
            ErrorKind::NotFound,
            format!("the model `{model}` does not exist"),
        )
        .with_param("model")
        .with_code("model_not_found")
    }

    /// 503 with a reason code and a retry delay.
    pub fn unavailable(code: &str, message: impl Into<String>, retry_after_secs: u64) -> Self {
        let mut e = Self::new(ErrorKind::Unavailable, message).with_code(code);
        e.retry_after_secs = Some(retry_after_secs.max(1));
        e
    }

    /// 408 for a request body that did not arrive within `timeout`.
    pub fn body_timeout(timeout: std::time::Duration) -> Self {
        Self::new(
            ErrorKind::RequestTimeout,
            format!("the request body did not arrive within {timeout:?}"),
        )
        .with_code("body_timeout")
    }

    /// 413 for a request body over `limit` bytes.
    pub fn body_too_large(limit: usize) -> Self {
        Self::new(
            ErrorKind::TooLarge,
            format!("the request body is larger than the limit of {limit} bytes"),
        )
        .with_code("request_too_large")
    }

    /// 413 for a prompt of `got` tokens over `limit`.
    pub fn prompt_too_long(got: usize, limit: usize) -> Self {
        Self::new(
            ErrorKind::TooLarge,
            format!("the prompt has {got} tokens, more than the limit of {limit}"),
        )
        .with_code("context_length_exceeded")
    }

    /// Sets `param`.
    pub fn with_param(mut self, param: &str) -> Self {
        self.param = Some(param.to_string());
        self
    }

    /// Sets `code`.
    pub fn with_code(mut self, code: &str) -> Self {
        self.code = Some(code.to_string());
        self
    }

    /// The HTTP status.
    pub fn status(&self) -> u16 {
        self.kind.status()
    }

    /// The JSON body.
    pub fn body(&self) -> ErrorBody {
        ErrorBody {
            error: ErrorObject {
                message: self.message.clone(),
                kind: self.kind.type_name().to_string(),
                param: self.param.clone(),
                code: self.code.clone(),
            },
        }
    }

    /// The JSON body as text.
    pub fn to_json(&self) -> String {
        // Serialising plain strings and options cannot fail.
        serde_json::to_string(&self.body()).unwrap_or_else(|_| "{}".to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_and_bodies() {
        let e = ApiError::model_not_found("m");
        assert_eq!(e.status(), 404);
        let v: serde_json::Value = serde_json::from_str(&e.to_json()).unwrap();
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(v["error"]["code"], "model_not_found");
        assert_eq!(v["error"]["param"], "model");
        let u = ApiError::unavailable("all_workers_busy", "busy", 0);
        assert_eq!((u.status(), u.retry_after_secs), (503, Some(1)));
        assert_eq!(ApiError::invalid("x").body().error.code, None);
        assert_eq!(ErrorKind::TooLarge.status(), 413);
    }
}
