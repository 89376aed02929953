//! Continuing an answer that broke off mid-stream on another engine: what the client has
//! been sent so far ([`Streamed`], read from the stream's `data:` payloads), the request for
//! the rest ([`continuation`]: the prompt plus the text already streamed, chat answers through
//! `continue_final_message`, token limits reduced), and the continuation's chunks made to read
//! as the same answer ([`rewrite_continued`]: the first stream's id, no second role, usage
//! counted from the original prompt).

use super::request::{Endpoint, PromptInput, RequestView};
use serde::de::IgnoredAny;
use serde::Deserialize;
use serde_json::{Map, Value};
use std::borrow::Cow;

/// Why a broken answer cannot be continued elsewhere.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NotContinuable {
    /// More than one choice (`n` or `best_of` above 1).
    #[error("the request asked for more than one choice")]
    Choices,
    /// `echo`: a continuation would echo the prompt again.
    #[error("the request asked for its prompt echoed")]
    Echo,
    /// The answer was calling tools when it broke off.
    #[error("the answer was calling tools")]
    Tools,
    /// The answer was streaming reasoning, which a continuation cannot resume.
    #[error("the answer was streaming reasoning")]
    Reasoning,
    /// A token-id prompt, and the streamed text could not be turned into token ids.
    #[error("a token-id prompt cannot be continued without a tokenizer")]
    TokenIds,
    /// The message being continued has content other than text.
    #[error("the message being continued is not text")]
    Content,
}

impl NotContinuable {
    /// A short label for metrics.
    pub fn label(self) -> &'static str {
        match self {
            Self::Choices => "choices",
            Self::Echo => "echo",
            Self::Tools => "tools",
            Self::Reasoning => "reasoning",
            Self::TokenIds => "token_ids",
            Self::Content => "content",
        }
    }
}

/// What a stream has carried to the client so far.
#[derive(Clone, Debug, Default)]
pub struct Streamed {
    id: Option<String>,
    /// The first chunk's `object`, `created` and `model` (for chunks the gateway writes).
    object: Option<String>,
    created: Option<u64>,
    model: Option<String>,
    /// A chunk with `usage` went by.
    usage_sent: bool,
    text: String,
    chunks: u32,
    finished: bool,
    blocked: Option<NotContinuable>,
}

#[derive(Deserialize)]
struct ChunkIn<'a> {
    #[serde(borrow, default)]
    id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    object: Option<Cow<'a, str>>,
    #[serde(default)]
    created: Option<u64>,
    #[serde(borrow, default)]
    model: Option<Cow<'a, str>>,
    #[serde(default)]
    usage: Option<IgnoredAny>,
    #[serde(default)]
    choices: Vec<ChoiceIn<'a>>,
}

#[derive(Deserialize)]
struct ChoiceIn<'a> {
    #[serde(default)]
    index: u32,
    #[serde(borrow, default)]
    text: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    delta: Option<DeltaIn<'a>>,
    #[serde(default)]
    finish_reason: Option<IgnoredAny>,
}

#[derive(Deserialize)]
struct DeltaIn<'a> {
    #[serde(borrow, default)]
    content: Option<Cow<'a, str>>,
    #[serde(default)]
    tool_calls: Option<IgnoredAny>,
    #[serde(borrow, default)]
    reasoning_content: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    reasoning: Option<Cow<'a, str>>,
}

impl Streamed {
    /// Nothing streamed yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Reads one `data:` payload the client was sent (payloads that are not chunks, such as
    /// error events, change nothing).
    pub fn observe(&mut self, payload: &str) {
        let Ok(chunk) = serde_json::from_str::<ChunkIn>(payload) else {
            return;
        };
        if self.id.is_none() {
            self.id = chunk.id.map(Cow::into_owned);
            self.object = chunk.object.map(Cow::into_owned);
            self.created = chunk.created;
            self.model = chunk.model.map(Cow::into_owned);
        }
        self.usage_sent |= chunk.usage.is_some();
        for choice in chunk.choices {
            if choice.index != 0 {
                self.blocked = Some(NotContinuable::Choices);
                continue;
            }
            let mut text = choice.text;
            if let Some(delta) = choice.delta {
                if delta.tool_calls.is_some() {
                    self.blocked = Some(NotContinuable::Tools);
                }
                let thinking = [&delta.reasoning_content, &delta.reasoning];
                if thinking
                    .iter()
                    .any(|r| r.as_ref().is_some_and(|r| !r.is_empty()))
                {
                    self.blocked = Some(NotContinuable::Reasoning);
                }
                text = text.or(delta.content);
            }
            if let Some(t) = text.filter(|t| !t.is_empty()) {
                self.text.push_str(&t);
                self.chunks += 1;
            }
            if choice.finish_reason.is_some() {
                self.finished = true;
            }
        }
    }

    /// The first chunk's `id`.
    pub fn id(&self) -> Option<&str> {
        self.id.as_deref()
    }

    /// The answer's text so far.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Chunks that carried text (engines send about one token per chunk).
    pub fn chunks(&self) -> u32 {
        self.chunks
    }

    /// A choice's `finish_reason` went by: the answer is whole.
    pub fn finished(&self) -> bool {
        self.finished
    }

    /// Why what was streamed cannot be continued, if it cannot.
    pub fn blocked(&self) -> Option<NotContinuable> {
        self.blocked
    }

    /// The chunks that close an answer whose every token was streamed when its stream broke
    /// (before `[DONE]`), as the engine would have sent them: a `finish_reason` of `length`
    /// when none went by (the answer reached its token limit), and, when the request asked
    /// for `stream_options.include_usage` and no usage went by, the usage (`prompt_tokens`
    /// as the gateway counted them, `completion_tokens` those streamed).
    pub fn closing(
        &self,
        view: &RequestView,
        prompt_tokens: u64,
        completion_tokens: u64,
    ) -> Vec<String> {
        let chat = view.endpoint == Endpoint::Chat;
        let head = |choices: Value| {
            let mut c = Map::new();
            if let Some(id) = &self.id {
                c.insert("id".into(), Value::from(id.as_str()));
            }
            let object = if chat {
                "chat.completion.chunk"
            } else {
                "text_completion"
            };
            c.insert(
                "object".into(),
                Value::from(self.object.as_deref().unwrap_or(object)),
            );
            if let Some(t) = self.created {
                c.insert("created".into(), Value::from(t));
            }
            c.insert(
                "model".into(),
                Value::from(self.model.as_deref().unwrap_or(&view.model)),
            );
            c.insert("choices".into(), choices);
            c
        };
        let mut out = Vec::new();
        if !self.finished {
            let choice = if chat {
                serde_json::json!({"index": 0, "delta": {}, "finish_reason": "length"})
            } else {
                serde_json::json!({"index": 0, "text": "", "finish_reason": "length"})
            };
            out.push(Value::Object(head(Value::Array(vec![choice]))).to_string());
        }
        if view.include_usage && !self.usage_sent {
            let mut c = head(Value::Array(Vec::new()));
            c.insert(
                "usage".into(),
                serde_json::json!({
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": completion_tokens,
                    "total_tokens": prompt_tokens + completion_tokens,
                }),
            );
            out.push(Value::Object(c).to_string());
        }
        out
    }
}

/// What a continuation carries on from.
#[derive(Clone, Copy, Debug)]
pub struct Carried<'a> {
    /// What was streamed.
    pub streamed: &'a Streamed,
    /// How many tokens that was (what the token limits are reduced by).
    pub tokens: u32,
    /// The streamed text as token ids, for a token-id prompt.
    pub token_ids: Option<&'a [u32]>,
}

/// The request for the rest of an answer: the client's body `obj` (checked as `view`) with
/// the streamed text added to the prompt (chat: as the assistant's message to continue,
/// `continue_final_message`; completions: appended to the text or the token ids), its token
/// limits (`max_tokens`, `max_completion_tokens`, `min_tokens`) reduced by what was streamed.
/// `Ok(None)` when the answer already has every token it asked for.
pub fn continuation(
    obj: &Map<String, Value>,
    view: &RequestView,
    carried: Carried<'_>,
) -> Result<Option<Map<String, Value>>, NotContinuable> {
    if let Some(reason) = carried.streamed.blocked() {
        return Err(reason);
    }
    for key in ["n", "best_of"] {
        if obj.get(key).and_then(Value::as_u64).is_some_and(|n| n > 1) {
            return Err(NotContinuable::Choices);
        }
    }
    if obj.get("echo") == Some(&Value::Bool(true)) {
        return Err(NotContinuable::Echo);
    }
    let mut out = obj.clone();
    for key in ["max_tokens", "max_completion_tokens", "min_tokens"] {
        if let Some(n) = out.get(key).and_then(Value::as_u64) {
            let left = n.saturating_sub(u64::from(carried.tokens));
            if left == 0 && key != "min_tokens" {
                return Ok(None);
            }
            out.insert(key.into(), Value::from(left));
        }
    }
    let text = carried.streamed.text();
    match (view.endpoint, &view.input) {
        (Endpoint::Chat, PromptInput::Continue(messages)) => {
            let mut messages = messages.clone();
            let last = messages
                .last_mut()
                .and_then(Value::as_object_mut)
                .ok_or(NotContinuable::Content)?;
            match last.get_mut("content") {
                Some(Value::String(s)) => s.push_str(text),
                None | Some(Value::Null) => {
                    last.insert("content".into(), Value::from(text));
                }
                Some(_) => return Err(NotContinuable::Content),
            }
            out.insert("messages".into(), Value::Array(messages));
        }
        (Endpoint::Chat, PromptInput::Messages(messages)) => {
            let mut messages = messages.clone();
            messages.push(serde_json::json!({"role": "assistant", "content": text}));
            out.insert("messages".into(), Value::Array(messages));
            out.insert("continue_final_message".into(), Value::Bool(true));
            out.insert("add_generation_prompt".into(), Value::Bool(false));
        }
        (_, PromptInput::Text(prompt)) => {
            out.insert("prompt".into(), Value::from(format!("{prompt}{text}")));
        }
        (_, PromptInput::Tokens(ids)) => {
            let more = carried.token_ids.ok_or(NotContinuable::TokenIds)?;
            let all: Vec<Value> = ids.iter().chain(more).map(|&t| Value::from(t)).collect();
            out.insert("prompt".into(), Value::Array(all));
        }
        (Endpoint::Completions, PromptInput::Messages(_) | PromptInput::Continue(_)) => {
            return Err(NotContinuable::Content)
        }
    }
    Ok(Some(out))
}

/// One `data:` payload of a continuation, made to read as part of the first stream: its
/// `id` replaced by `id`, the role dropped from chat deltas (the client had it), and usage
/// counted from the original prompt (`carried` tokens move from the prompt to the
/// completion). `None` when the payload is not a JSON object (sent on unchanged).
pub fn rewrite_continued(payload: &str, id: Option<&str>, carried: u32) -> Option<String> {
    let Ok(Value::Object(mut chunk)) = serde_json::from_str::<Value>(payload) else {
        return None;
    };
    if let (Some(id), Some(slot)) = (id, chunk.get_mut("id")) {
        *slot = Value::from(id);
    }
    if let Some(Value::Array(choices)) = chunk.get_mut("choices") {
        for c in choices {
            if let Some(Value::Object(delta)) = c.get_mut("delta") {
                delta.remove("role");
            }
        }
    }
    if let Some(Value::Object(usage)) = chunk.get_mut("usage") {
        let carried = u64::from(carried);
        if let Some(p) = usage.get("prompt_tokens").and_then(Value::as_u64) {
            usage.insert("prompt_tokens".into(), p.saturating_sub(carried).into());
        }
        if let Some(c) = usage.get("completion_tokens").and_then(Value::as_u64) {
            usage.insert("completion_tokens".into(), (c + carried).into());
        }
    }
    serde_json::to_string(&chunk).ok()
}

#[cfg(test)]
mod tests;
