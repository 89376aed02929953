//! The OpenAI API as the gateway and the simulated worker speak it: reading requests (kept as
//! JSON objects so that fields we do not know are forwarded unchanged), the response and
//! stream-chunk bodies, server-sent events, and error objects with their HTTP status.

pub mod continuation;
mod error;
#[cfg(feature = "axum")]
pub mod http;
mod request;
mod response;
mod sse;

pub use error::{ApiError, ErrorBody, ErrorKind, ErrorObject};
pub use request::{parse_request, Endpoint, PromptInput, RequestView, MAX_TOKEN_ID};
pub use response::{
    ChatChoice, ChatChunk, ChatChunkChoice, ChatCompletion, ChatMessageOut, Completion,
    CompletionChoice, CompletionChunk, Delta, ModelCard, ModelList, PromptTokensDetails, Usage,
};
pub use sse::{SseError, SseEvent, SseParser, MAX_SSE_LINE};
