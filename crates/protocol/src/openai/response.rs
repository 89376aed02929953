//! Response bodies and stream chunks of the OpenAI API (what the simulated worker writes and
//! the gateway reads back for usage and first-token accounting).

use serde::{Deserialize, Serialize};

/// Token counts of a request.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: u64,
    /// Generated tokens.
    pub completion_tokens: u64,
    /// Sum of both.
    pub total_tokens: u64,
    /// Cached prompt tokens, when the engine reports them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_tokens_details: Option<PromptTokensDetails>,
}

impl Usage {
    /// Usage of a request with `prompt`, `completion` and `cached` tokens.
    pub fn new(prompt: u64, completion: u64, cached: u64) -> Self {
        Self {
            prompt_tokens: prompt,
            completion_tokens: completion,
            total_tokens: prompt + completion,
            prompt_tokens_details: Some(PromptTokensDetails {
                cached_tokens: cached,
            }),
        }
    }

    /// The cached prompt tokens (0 when not reported).
    pub fn cached_tokens(&self) -> u64 {
        self.prompt_tokens_details
            .as_ref()
            .map_or(0, |d| d.cached_tokens)
    }
}

/// `usage.prompt_tokens_details`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PromptTokensDetails {
    /// Prompt tokens served from the prefix cache.
    #[serde(default)]
    pub cached_tokens: u64,
}

/// A message of a chat answer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ChatMessageOut {
    /// Always `assistant`.
    pub role: String,
    /// The text.
    pub content: String,
}

/// One choice of a chat answer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ChatChoice {
    /// Choice index.
    pub index: u32,
    /// The message.
    pub message: ChatMessageOut,
    /// `stop` or `length`.
    pub finish_reason: Option<String>,
}

/// `chat.completion`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ChatCompletion {
    /// Request id.
    pub id: String,
    /// `chat.completion`.
    pub object: String,
    /// Unix seconds.
    pub created: u64,
    /// The model.
    pub model: String,
    /// The choices.
    pub choices: Vec<ChatChoice>,
    /// Token counts.
    pub usage: Option<Usage>,
}

/// The incremental part of a chat stream chunk.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Delta {
    /// `assistant` on the first chunk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    /// New text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
}

/// One choice of a chat stream chunk.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ChatChunkChoice {
    /// Choice index.
    pub index: u32,
    /// The new part.
    pub delta: Delta,
    /// Set on the last chunk of the choice.
    pub finish_reason: Option<String>,
}

/// `chat.completion.chunk`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ChatChunk {
    /// Request id.
    pub id: String,
    /// `chat.completion.chunk`.
    pub object: String,
    /// Unix seconds.
    pub created: u64,
    /// The model.
    pub model: String,
    /// The choices (empty on the usage chunk).
    pub choices: Vec<ChatChunkChoice>,
    /// Token counts, on the last chunk when `include_usage` was asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

/// One choice of a text completion (also of its stream chunks).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CompletionChoice {
    /// Choice index.
    pub index: u32,
    /// The text (new text, in a chunk).
    pub text: String,
    /// `stop` or `length`.
    pub finish_reason: Option<String>,
}

/// `text_completion`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Completion {
    /// Request id.
    pub id: String,
    /// `text_completion`.
    pub object: String,
    /// Unix seconds.
    pub created: u64,
    /// The model.
    pub model: String,
    /// The choices.
    pub choices: Vec<CompletionChoice>,
    /// Token counts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

/// A stream chunk of a text completion has the same shape.
pub type CompletionChunk = Completion;

/// One entry of `GET /v1/models`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelCard {
    /// The model name.
    pub id: String,
    /// `model`.
    pub object: String,
    /// Unix seconds.
    pub created: u64,
    /// Who serves it.
    pub owned_by: String,
    /// The base model, when this entry is a LoRA adapter (vLLM lists each adapter it serves
    /// with its base model as `parent`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
}

/// `GET /v1/models`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelList {
    /// `list`.
    pub object: String,
    /// The models.
    pub data: Vec<ModelCard>,
}

impl ModelList {
    /// A list of the given model names.
    pub fn of(names: &[String], created: u64, owned_by: &str) -> Self {
        Self::with_adapters(names, None, &[], created, owned_by)
    }

    /// A list of the given model names and of LoRA adapters of `base` (listed with it as
    /// their `parent`).
    pub fn with_adapters(
        names: &[String],
        base: Option<&str>,
        adapters: &[String],
        created: u64,
        owned_by: &str,
    ) -> Self {
        let card = |id: &String, parent: Option<&str>| ModelCard {
            id: id.clone(),
            object: "model".into(),
            created,
            owned_by: owned_by.into(),
            parent: parent.map(str::to_string),
        };
        Self {
            object: "list".into(),
            data: names
                .iter()
                .map(|n| card(n, None))
                .chain(adapters.iter().map(|a| card(a, base)))
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_serialises_like_openai() {
        let u = Usage::new(10, 3, 8);
        let v = serde_json::to_value(&u).unwrap();
        assert_eq!(v["total_tokens"], 13);
        assert_eq!(v["prompt_tokens_details"]["cached_tokens"], 8);
        let bare: Usage =
            serde_json::from_str(r#"{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}"#)
                .unwrap();
        assert_eq!(bare.cached_tokens(), 0);
    }

    #[test]
    fn chunks_omit_absent_usage_and_deltas() {
        let c = ChatChunk {
            id: "x".into(),
            object: "chat.completion.chunk".into(),
            created: 1,
            model: "m".into(),
            choices: vec![ChatChunkChoice {
                index: 0,
                delta: Delta {
                    role: None,
                    content: Some("hi".into()),
                },
                finish_reason: None,
            }],
            usage: None,
        };
        let s = serde_json::to_string(&c).unwrap();
        assert!(!s.contains("usage") && !s.contains("role"), "{s}");
        assert!(s.contains(r#""finish_reason":null"#), "{s}");
    }
}
