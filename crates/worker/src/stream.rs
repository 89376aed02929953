//! Streaming answers: server-sent events as OpenAI (and vLLM) write them.
//!
//! Chat: at the first token a chunk with `delta.role = "assistant"` and empty content, then
//! one chunk per token with its text; the last token's chunk carries
//! `finish_reason: "length"` (the engine always generates `max_tokens` tokens). Completions:
//! one chunk per token, the last with `finish_reason`. Then, when
//! `stream_options.include_usage` was asked, a chunk with `choices: []` and `usage`, and
//! `data: [DONE]`. Tokens already waiting are written together. If the worker shuts down
//! mid-stream, an error event (`data: {"error": ...}`) precedes `[DONE]`.
//!
//! The stream owns the request's [`AbortGuard`]: when the client goes away, the server drops
//! the stream and the engine request is aborted.

use crate::driver::Reply;
use crate::generate::{usage, AbortGuard};
use crate::http::driver_gone;
use crate::text::OutputText;
use axum::body::Body;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use kvroute_engine::Finished;
use kvroute_protocol::openai::{
    ChatChunk, ChatChunkChoice, Completion, CompletionChoice, Delta, Endpoint, Usage,
};
use serde::Serialize;
use std::convert::Infallible;
use tokio::sync::mpsc;

/// Messages written together at most.
const MAX_COALESCED: usize = 64;

/// What a response needs to know about its request.
pub(crate) struct StreamCtx {
    /// `chatcmpl-...` or `cmpl-...`.
    pub(crate) id: String,
    /// Unix seconds.
    pub(crate) created: u64,
    /// The served model name.
    pub(crate) model: String,
    /// Chat or completions.
    pub(crate) endpoint: Endpoint,
    /// Send a usage chunk before `[DONE]`.
    pub(crate) include_usage: bool,
    /// Tokens the engine will generate.
    pub(crate) max_tokens: u32,
    /// Token text.
    pub(crate) text: OutputText,
    /// A prefill leg: what its answer carries (whole answers only).
    pub(crate) prefill_leg: Option<crate::kv_transfer::PrefillLeg>,
}

struct StreamState {
    ctx: StreamCtx,
    rx: mpsc::UnboundedReceiver<Reply>,
    guard: AbortGuard,
    sent: u32,
    finish_sent: bool,
    done: bool,
}

/// The streaming answer of an accepted request.
pub(crate) fn sse_response(
    ctx: StreamCtx,
    rx: mpsc::UnboundedReceiver<Reply>,
    guard: AbortGuard,
) -> Response {
    let state = StreamState {
        ctx,
        rx,
        guard,
        sent: 0,
        finish_sent: false,
        done: false,
    };
    let stream = futures_util::stream::unfold(state, |mut st| async move {
        if st.done {
            return None;
        }
        let bytes = st.next_bytes().await;
        Some((Ok::<Bytes, Infallible>(bytes), st))
    });
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(stream),
    )
        .into_response()
}

fn push_event(buf: &mut String, value: &impl Serialize) {
    // Response structs of plain data always serialise.
    if let Ok(json) = serde_json::to_string(value) {
        buf.push_str("data: ");
        buf.push_str(&json);
        buf.push_str("\n\n");
    }
}

impl StreamState {
    /// The bytes of the next message and of those already waiting behind it.
    async fn next_bytes(&mut self) -> Bytes {
        let mut buf = String::new();
        let first = self.rx.recv().await;
        self.on_message(first, &mut buf);
        for _ in 1..MAX_COALESCED {
            if self.done {
                break;
            }
            match self.rx.try_recv() {
                Ok(m) => self.on_message(Some(m), &mut buf),
                Err(_) => break,
            }
        }
        Bytes::from(buf)
    }

    fn on_message(&mut self, msg: Option<Reply>, buf: &mut String) {
        match msg {
            Some(Reply::Token(t)) => self.on_token(t, buf),
            Some(Reply::Finished(f)) => self.on_finished(&f, buf),
            Some(Reply::Accepted | Reply::Rejected(_)) => {}
            None => {
                push_event(buf, &driver_gone().body());
                buf.push_str("data: [DONE]\n\n");
                self.done = true;
            }
        }
    }

    fn on_token(&mut self, token: u32, buf: &mut String) {
        if self.finish_sent {
            return;
        }
        if self.sent == 0 && self.ctx.endpoint == Endpoint::Chat {
            push_event(
                buf,
                &self.chat_chunk(Some("assistant"), String::new(), None),
            );
        }
        self.sent += 1;
        let last = self.sent >= self.ctx.max_tokens;
        let text = self.ctx.text.piece(token).to_string();
        self.push_text(text, last, buf);
    }

    fn push_text(&mut self, text: String, last: bool, buf: &mut String) {
        let finish = last.then(|| "length".to_string());
        self.finish_sent |= last;
        match self.ctx.endpoint {
            Endpoint::Chat => push_event(buf, &self.chat_chunk(None, text, finish)),
            Endpoint::Completions => push_event(buf, &self.completion_chunk(text, finish)),
        }
    }

    fn on_finished(&mut self, f: &Finished, buf: &mut String) {
        self.guard.disarm();
        if !self.finish_sent {
            self.push_text(String::new(), true, buf);
        }
        if self.ctx.include_usage {
            let u = usage(f);
            match self.ctx.endpoint {
                Endpoint::Chat => push_event(buf, &self.chat_usage(u)),
                Endpoint::Completions => push_event(buf, &self.completion_usage(u)),
            }
        }
        buf.push_str("data: [DONE]\n\n");
        self.done = true;
    }

    fn chat_chunk(&self, role: Option<&str>, content: String, finish: Option<String>) -> ChatChunk {
        ChatChunk {
            id: self.ctx.id.clone(),
            object: "chat.completion.chunk".into(),
            created: self.ctx.created,
            model: self.ctx.model.clone(),
            choices: vec![ChatChunkChoice {
                index: 0,
                delta: Delta {
                    role: role.map(str::to_string),
                    content: Some(content),
                },
                finish_reason: finish,
            }],
            usage: None,
        }
    }

    fn chat_usage(&self, u: Usage) -> ChatChunk {
        ChatChunk {
            id: self.ctx.id.clone(),
            object: "chat.completion.chunk".into(),
            created: self.ctx.created,
            model: self.ctx.model.clone(),
            choices: Vec::new(),
            usage: Some(u),
        }
    }

    fn completion_chunk(&self, text: String, finish: Option<String>) -> Completion {
        Completion {
            id: self.ctx.id.clone(),
            object: "text_completion".into(),
            created: self.ctx.created,
            model: self.ctx.model.clone(),
            choices: vec![CompletionChoice {
                index: 0,
                text,
                finish_reason: finish,
            }],
            usage: None,
        }
    }

    fn completion_usage(&self, u: Usage) -> Completion {
        Completion {
            choices: Vec::new(),
            usage: Some(u),
            ..self.completion_chunk(String::new(), None)
        }
    }
}
