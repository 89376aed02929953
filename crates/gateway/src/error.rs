//! The gateway's errors, and the one place where they become HTTP answers (OpenAI error
//! objects with their status, `Retry-After` on 503, the request id header).

use axum::http::HeaderValue;
use axum::response::{IntoResponse, Response};
use kvroute_core::RejectReason;
use kvroute_preprocess::PreprocessError;
use kvroute_protocol::openai::{ApiError, ErrorKind};

/// Why a request failed in the gateway.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// The request is invalid (already an API error).
    #[error(transparent)]
    Api(#[from] ApiError),
    /// Templating or tokenizing the prompt failed.
    #[error("preprocessing failed: {0}")]
    Preprocess(#[from] PreprocessError),
    /// Admission refused it.
    #[error("rejected: {}", .0.as_str())]
    Rejected(RejectReason),
    /// Refused with a wait of its own: a tenant over a limit (429 `tenant_limit`, the wait
    /// its limit gives), a predicted miss (503, the predicted drain).
    #[error("rejected: {}", reason.as_str())]
    RejectedFor {
        /// Why.
        reason: RejectReason,
        /// How long until the request would be let in (or meet its objective).
        retry_after: std::time::Duration,
    },
    /// The worker could not be reached or failed before answering.
    #[error("worker {worker}: {message}")]
    Upstream {
        /// The worker's name.
        worker: String,
        /// What went wrong.
        message: String,
        /// It did not answer in time.
        timeout: bool,
    },
    /// A bug or an impossible state.
    #[error("internal error: {0}")]
    Internal(String),
}

impl From<kvroute_fleet::bookings::AdmitError> for GatewayError {
    fn from(e: kvroute_fleet::bookings::AdmitError) -> Self {
        use kvroute_fleet::bookings::AdmitError;
        match e {
            AdmitError::Rejected(reason, None) => GatewayError::Rejected(reason),
            AdmitError::Rejected(reason, Some(retry_after)) => GatewayError::RejectedFor {
                reason,
                retry_after,
            },
            AdmitError::Internal(m) => GatewayError::Internal(m),
        }
    }
}

impl GatewayError {
    /// The OpenAI error answer.
    pub fn to_api(&self) -> ApiError {
        match self {
            GatewayError::Api(e) => e.clone(),
            GatewayError::Preprocess(e) => e.to_api_error(),
            GatewayError::Rejected(reason) => {
                let (code, message) = match reason {
                    RejectReason::NoWorkers => (
                        "no_healthy_workers",
                        "no healthy worker can take the request (none is up and able to decode: a prefill-only worker serves no request whole)",
                    ),
                    RejectReason::AllWorkersBusy => {
                        ("all_workers_busy", "every worker is busy; retry later")
                    }
                    RejectReason::QueueFull => (
                        "queue_full",
                        "every worker is busy and the admission queue is full",
                    ),
                    RejectReason::QueueTimeout => (
                        "queue_timeout",
                        "every worker stayed busy for the longest queue wait",
                    ),
                    RejectReason::Deadline => (
                        "deadline",
                        "every worker stayed busy until the request's time-to-first-token objective passed",
                    ),
                    RejectReason::Shed => (
                        "shed",
                        "the admission queue was full and a request of a higher priority band took this one's place",
                    ),
                    RejectReason::TenantLimit => (
                        "tenant_limit",
                        "the tenant is over its concurrency or token limit; retry after the time given",
                    ),
                    RejectReason::PredictedMiss => (
                        "predicted_miss",
                        "the request is predicted to miss its time-to-first-token objective on every worker",
                    ),
                };
                let mut api = ApiError::unavailable(code, message, reason.retry_after_secs());
                if reason.is_caller_limit() {
                    api.kind = ErrorKind::Overloaded;
                }
                api
            }
            GatewayError::RejectedFor {
                reason,
                retry_after,
            } => {
                let mut api = GatewayError::Rejected(*reason).to_api();
                // Whole seconds, rounded up: a client coming back sooner is refused again.
                api.retry_after_secs = Some(retry_after.as_secs_f64().ceil().max(1.0) as u64);
                api
            }
            GatewayError::Upstream {
                worker,
                message,
                timeout,
            } => {
                let kind = if *timeout {
                    ErrorKind::Timeout
                } else {
                    ErrorKind::Upstream
                };
                ApiError::new(kind, format!("worker {worker}: {message}")).with_code(if *timeout {
                    "upstream_timeout"
                } else {
                    "upstream_failed"
                })
            }
            GatewayError::Internal(m) => ApiError::new(ErrorKind::Internal, m.clone()),
        }
    }
}

/// An OpenAI error answer, carrying the request id.
impl GatewayError {
    /// The error as the endpoint picker answers it: a request shed for load (every worker
    /// busy, the queue full, or its wait over) is 429, as the Gateway API's endpoint picker
    /// protocol has it; 503 stays for no eligible worker at all.
    pub fn to_picker_api(&self) -> ApiError {
        let mut api = self.to_api();
        if let GatewayError::Rejected(r) | GatewayError::RejectedFor { reason: r, .. } = self {
            if *r != RejectReason::NoWorkers {
                api.kind = ErrorKind::Overloaded;
            }
        }
        api
    }
}

pub fn error_response(e: &ApiError, request_id: &str) -> Response {
    let mut resp = kvroute_protocol::openai::http::error_response(e);
    if let Ok(v) = HeaderValue::from_str(request_id) {
        resp.headers_mut()
            .insert(kvroute_fleet::headers::REQUEST_ID_HEADER, v);
    }
    resp
}

impl IntoResponse for GatewayError {
    fn into_response(self) -> Response {
        error_response(&self.to_api(), "")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_has_its_status() {
        let cases = [
            (GatewayError::Rejected(RejectReason::AllWorkersBusy), 503),
            (GatewayError::Rejected(RejectReason::NoWorkers), 503),
            (GatewayError::Api(ApiError::model_not_found("x")), 404),
            (
                GatewayError::Upstream {
                    worker: "w".into(),
                    message: "refused".into(),
                    timeout: false,
                },
                502,
            ),
            (
                GatewayError::Upstream {
                    worker: "w".into(),
                    message: "slow".into(),
                    timeout: true,
                },
                504,
            ),
            (GatewayError::Internal("x".into()), 500),
        ];
        // The endpoint picker: shed requests are 429, no worker at all 503.
        for (reason, status) in [
            (RejectReason::NoWorkers, 503),
            (RejectReason::AllWorkersBusy, 429),
            (RejectReason::QueueFull, 429),
            (RejectReason::QueueTimeout, 429),
        ] {
            let api = GatewayError::Rejected(reason).to_picker_api();
            assert_eq!(api.status(), status, "{reason:?}");
            assert!(api.retry_after_secs.is_some() || status == 503);
        }
        // A refusal with a wait of its own says it, in whole seconds rounded up.
        let e = GatewayError::RejectedFor {
            reason: RejectReason::PredictedMiss,
            retry_after: std::time::Duration::from_millis(2_300),
        };
        let api = e.to_api();
        assert_eq!((api.status(), api.retry_after_secs), (503, Some(3)));
        assert_eq!(api.code.as_deref(), Some("predicted_miss"));
        assert_eq!(e.to_picker_api().status(), 429);
        for (e, status) in cases {
            let api = e.to_api();
            assert_eq!(api.status(), status, "{e}");
            let resp = error_response(&api, "id-1");
            assert_eq!(resp.status().as_u16(), status);
            assert_eq!(
                resp.headers()[kvroute_fleet::headers::REQUEST_ID_HEADER],
                "id-1"
            );
            assert_eq!(
                resp.headers().contains_key(axum::http::header::RETRY_AFTER),
                status == 503
            );
        }
    }
}
