//! The error type of the crate.

use kvroute_protocol::openai::{ApiError, ErrorKind};
use std::path::PathBuf;

/// Everything that can go wrong while loading a tokenizer, rendering a chat
/// template or tokenizing.
///
/// [`PreprocessError::is_client_error`] tells which errors are caused by the
/// request (HTTP 400) rather than by the deployment (HTTP 500).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PreprocessError {
    /// A file could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// `tokenizer.json` (or the embedded tokenizer) could not be parsed.
    #[error("invalid tokenizer file: {0}")]
    TokenizerFile(String),
    /// Invalid or incomplete configuration (`tokenizer_config.json`, a chat
    /// template that does not compile, no chat template at all).
    #[error("tokenizer configuration: {0}")]
    Config(String),
    /// The request is malformed, e.g. `messages` is empty or a message has no
    /// string `role`.
    #[error("invalid request: {0}")]
    Invalid(String),
    /// Rendering the chat template failed. This includes the messages of
    /// `raise_exception(...)` calls in the template (e.g. "Conversation roles
    /// must alternate user/assistant/user/assistant/...").
    #[error("chat template: {0}")]
    Template(String),
    /// The tokenizer failed to encode the text.
    #[error("encoding failed: {0}")]
    Encode(String),
    /// The tokenizer failed to decode the ids.
    #[error("decoding failed: {0}")]
    Decode(String),
    /// The input text is larger than the configured cap (in bytes).
    #[error("input too long: {got} bytes, the limit is {limit} bytes")]
    TooLong {
        /// The cap, in bytes.
        limit: usize,
        /// The size of the input, in bytes.
        got: usize,
    },
    /// Every tokenizing thread is busy and `queue` jobs are already waiting: try again
    /// shortly (503 with `Retry-After`).
    #[error("the tokenizer is busy: {queue} prompts are already waiting")]
    Busy {
        /// The bound on waiting prompts.
        queue: usize,
    },
    /// The operation is not available in this mode (e.g. decoding in
    /// approximate mode).
    #[error("not supported: {0}")]
    NotSupported(&'static str),
}

impl PreprocessError {
    /// True when the request itself is at fault (invalid messages, a template
    /// rejecting the conversation, input too long): the gateway answers 400.
    /// Other errors are deployment or internal problems (500).
    pub fn is_client_error(&self) -> bool {
        matches!(
            self,
            Self::Invalid(_) | Self::Template(_) | Self::TooLong { .. }
        )
    }

    /// The answer to a request that failed here: 413 for input over the limit, 400 for what
    /// the request or the chat template got wrong (a missing template included, as vLLM
    /// answers), 500 for the rest (a broken tokenizer).
    pub fn to_api_error(&self) -> ApiError {
        match self {
            Self::TooLong { .. } => ApiError::new(ErrorKind::TooLarge, self.to_string())
                .with_code("context_length_exceeded"),
            Self::Invalid(_) | Self::Template(_) | Self::Config(_) => {
                ApiError::invalid(self.to_string())
            }
            Self::Busy { .. } => ApiError::unavailable("tokenizer_busy", self.to_string(), 1),
            _ => ApiError::new(ErrorKind::Internal, self.to_string()),
        }
    }
}
