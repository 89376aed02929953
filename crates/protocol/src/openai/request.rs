//! Reading an OpenAI request: the body stays a JSON object (forwarded to the engine as it
//! came, unknown fields included) and [`RequestView`] holds the fields routing needs, checked.

use super::error::{ApiError, ErrorKind};
use serde_json::{Map, Value};

/// The largest token id accepted in a token-id prompt.
pub const MAX_TOKEN_ID: u64 = u32::MAX as u64;

/// Which API a request came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Endpoint {
    /// `POST /v1/chat/completions`.
    Chat,
    /// `POST /v1/completions`.
    Completions,
}

impl Endpoint {
    /// The path, as engines serve it.
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::Chat => "/v1/chat/completions",
            Endpoint::Completions => "/v1/completions",
        }
    }

    /// A short label for metrics and logs.
    pub fn label(self) -> &'static str {
        match self {
            Endpoint::Chat => "chat",
            Endpoint::Completions => "completions",
        }
    }
}

/// The prompt of a request.
#[derive(Clone, Debug, PartialEq)]
pub enum PromptInput {
    /// Chat messages, as given (each a JSON object with a string `role`).
    Messages(Vec<Value>),
    /// Chat messages whose final one, the assistant's, the answer continues
    /// (`continue_final_message`, vLLM's and Hugging Face's): rendered without a generation
    /// prompt and cut right after that message's text.
    Continue(Vec<Value>),
    /// A text prompt.
    Text(String),
    /// A prompt of token ids.
    Tokens(Vec<u32>),
}

/// The checked fields of a request that routing and accounting use.
#[derive(Clone, Debug, PartialEq)]
pub struct RequestView {
    /// Chat or completions.
    pub endpoint: Endpoint,
    /// The `model` field.
    pub model: String,
    /// The prompt.
    pub input: PromptInput,
    /// `stream`.
    pub stream: bool,
    /// `stream_options.include_usage` (only meaningful when streaming).
    pub include_usage: bool,
    /// `max_completion_tokens`, else `max_tokens`.
    pub max_tokens: Option<u32>,
    /// `user`.
    pub user: Option<String>,
    /// vLLM's `cache_salt`.
    pub cache_salt: Option<String>,
    /// vLLM's and SGLang's `priority` (the gateway picks the class whose engine priority
    /// it is).
    pub priority: Option<i64>,
}

/// Parses and checks a request body. Returns the body as a JSON object (to forward) and the
/// checked view. `max_prompt_tokens` bounds token-id prompts.
pub fn parse_request(
    endpoint: Endpoint,
    body: &[u8],
    max_prompt_tokens: usize,
) -> Result<(Map<String, Value>, RequestView), ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::invalid(format!("the body is not valid JSON: {e}")))?;
    let Value::Object(obj) = value else {
        return Err(ApiError::invalid("the body must be a JSON object"));
    };
    let view = view(endpoint, &obj, max_prompt_tokens)?;
    Ok((obj, view))
}

fn view(
    endpoint: Endpoint,
    obj: &Map<String, Value>,
    max_prompt_tokens: usize,
) -> Result<RequestView, ApiError> {
    let model = match obj.get("model") {
        Some(Value::String(m)) if !m.is_empty() => m.clone(),
        Some(_) => return Err(ApiError::invalid_param("model", "`model` must be a string")),
        None => return Err(ApiError::invalid_param("model", "`model` is required")),
    };
    let stream = opt_bool(obj, "stream")?.unwrap_or(false);
    let include_usage = match obj.get("stream_options") {
        None | Some(Value::Null) => false,
        Some(Value::Object(o)) => match o.get("include_usage") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => {
                return Err(ApiError::invalid_param(
                    "stream_options",
                    "`stream_options.include_usage` must be a boolean",
                ))
            }
        },
        Some(_) => {
            return Err(ApiError::invalid_param(
                "stream_options",
                "`stream_options` must be an object",
            ))
        }
    };
    let max_tokens = match opt_u32(obj, "max_completion_tokens")? {
        Some(n) => Some(n),
        None => opt_u32(obj, "max_tokens")?,
    };
    if max_tokens == Some(0) {
        return Err(ApiError::invalid_param(
            "max_tokens",
            "`max_tokens` must be at least 1",
        ));
    }
    let input = match endpoint {
        Endpoint::Chat => chat_input(obj)?,
        Endpoint::Completions => prompt(obj, max_prompt_tokens)?,
    };
    Ok(RequestView {
        endpoint,
        model,
        input,
        stream,
        include_usage: stream && include_usage,
        max_tokens,
        user: opt_string(obj, "user")?,
        cache_salt: opt_string(obj, "cache_salt")?,
        priority: match obj.get("priority") {
            None | Some(Value::Null) => None,
            Some(v) => Some(v.as_i64().ok_or_else(|| {
                ApiError::invalid_param("priority", "`priority` must be an integer")
            })?),
        },
    })
}

fn opt_bool(obj: &Map<String, Value>, key: &str) -> Result<Option<bool>, ApiError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(ApiError::invalid_param(
            key,
            format!("`{key}` must be a boolean"),
        )),
    }
}

fn opt_string(obj: &Map<String, Value>, key: &str) -> Result<Option<String>, ApiError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(ApiError::invalid_param(
            key,
            format!("`{key}` must be a string"),
        )),
    }
}

fn opt_u32(obj: &Map<String, Value>, key: &str) -> Result<Option<u32>, ApiError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| {
                ApiError::invalid_param(
                    key,
                    format!("`{key}` must be a non-negative integer below 2^32"),
                )
            }),
    }
}

/// A chat request's messages, continued (`continue_final_message`) or answered.
fn chat_input(obj: &Map<String, Value>) -> Result<PromptInput, ApiError> {
    let list = messages(obj)?;
    if opt_bool(obj, "continue_final_message")? != Some(true) {
        return Ok(PromptInput::Messages(list));
    }
    if opt_bool(obj, "add_generation_prompt")? == Some(true) {
        return Err(ApiError::invalid_param(
            "continue_final_message",
            "`continue_final_message` and `add_generation_prompt` cannot both be true",
        ));
    }
    let last = list.last().and_then(Value::as_object);
    if last.and_then(|m| m.get("role")).and_then(Value::as_str) != Some("assistant") {
        return Err(ApiError::invalid_param(
            "continue_final_message",
            "`continue_final_message` needs an assistant message last",
        ));
    }
    Ok(PromptInput::Continue(list))
}

fn messages(obj: &Map<String, Value>) -> Result<Vec<Value>, ApiError> {
    let list = match obj.get("messages") {
        Some(Value::Array(a)) => a,
        Some(_) => {
            return Err(ApiError::invalid_param(
                "messages",
                "`messages` must be an array",
            ))
        }
        None => {
            return Err(ApiError::invalid_param(
                "messages",
                "`messages` is required",
            ))
        }
    };
    if list.is_empty() {
        return Err(ApiError::invalid_param(
            "messages",
            "`messages` must not be empty",
        ));
    }
    for (i, m) in list.iter().enumerate() {
        let role = m.as_object().and_then(|o| o.get("role"));
        if !matches!(role, Some(Value::String(_))) {
            return Err(ApiError::invalid_param(
                "messages",
                format!("`messages[{i}]` must be an object with a string `role`"),
            ));
        }
    }
    Ok(list.clone())
}

fn prompt(obj: &Map<String, Value>, max_prompt_tokens: usize) -> Result<PromptInput, ApiError> {
    let bad = |m: &str| ApiError::invalid_param("prompt", m.to_string());
    let p = obj
        .get("prompt")
        .ok_or_else(|| bad("`prompt` is required"))?;
    let input =
        match p {
            Value::String(s) => PromptInput::Text(s.clone()),
            Value::Array(a) if a.is_empty() => return Err(bad("`prompt` must not be empty")),
            Value::Array(a) if a.iter().all(Value::is_number) => token_ids(a, max_prompt_tokens)?,
            Value::Array(a) if a.len() == 1 => match &a[0] {
                Value::String(s) => PromptInput::Text(s.clone()),
                Value::Array(ids) => token_ids(ids, max_prompt_tokens)?,
                _ => return Err(bad(
                    "`prompt` must be a string, an array of token ids, or one of those in an array",
                )),
            },
            Value::Array(_) => {
                return Err(bad(
                    "batched prompts (more than one prompt per request) are not supported",
                ))
            }
            _ => {
                return Err(bad(
                    "`prompt` must be a string, an array of token ids, or one of those in an array",
                ))
            }
        };
    let empty = match &input {
        PromptInput::Text(t) => t.is_empty(),
        PromptInput::Tokens(t) => t.is_empty(),
        PromptInput::Messages(m) | PromptInput::Continue(m) => m.is_empty(),
    };
    if empty {
        return Err(bad("`prompt` must not be empty"));
    }
    Ok(input)
}

fn token_ids(a: &[Value], max_prompt_tokens: usize) -> Result<PromptInput, ApiError> {
    if a.len() > max_prompt_tokens {
        return Err(ApiError::new(
            ErrorKind::TooLarge,
            format!(
                "the prompt has {} tokens, more than the limit of {max_prompt_tokens}",
                a.len()
            ),
        )
        .with_param("prompt")
        .with_code("context_length_exceeded"));
    }
    a.iter()
        .map(|v| {
            v.as_u64()
                .filter(|&n| n <= MAX_TOKEN_ID)
                .map(|n| n as u32)
                .ok_or_else(|| {
                    ApiError::invalid_param(
                        "prompt",
                        format!("token ids must be integers in 0..=4294967295, got {v}"),
                    )
                })
        })
        .collect::<Result<Vec<u32>, _>>()
        .map(PromptInput::Tokens)
}

#[cfg(test)]
mod tests;
