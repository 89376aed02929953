//! Follow-up questions written by a model acting as the user: any OpenAI-compatible endpoint
//! is shown the conversation so far and asked for the user's next short question. When it
//! fails or answers nothing usable, the built-in generator's question is used instead (the
//! turn goes on; the failure is logged).

use crate::check_url;
use crate::conversations::truncate;
use crate::LoadgenError;
use kvroute_workload::ChatTurn;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Where the user model is and how it is asked.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct UserModelConfig {
    /// Base URL of an OpenAI-compatible endpoint (`/v1/chat/completions` is appended).
    pub url: String,
    /// Its `model`.
    pub model: String,
    /// Bearer key, if it needs one.
    pub key: Option<String>,
    /// Most tokens of a question.
    pub max_tokens: u32,
    /// Seconds a question may take.
    pub timeout_secs: f64,
    /// Longest part of each earlier message shown to it, in bytes.
    pub max_context_bytes: usize,
}

impl Default for UserModelConfig {
    fn default() -> Self {
        Self {
            url: String::new(),
            model: String::new(),
            key: None,
            max_tokens: 64,
            timeout_secs: 30.0,
            max_context_bytes: 4096,
        }
    }
}

impl UserModelConfig {
    /// Checks the settings.
    pub fn validate(&self) -> Result<(), LoadgenError> {
        check_url("user model url", &self.url)?;
        if self.model.is_empty() {
            return Err(LoadgenError::Config(
                "the user model needs a model name".into(),
            ));
        }
        if self.max_tokens == 0 || !(self.timeout_secs.is_finite() && self.timeout_secs > 0.0) {
            return Err(LoadgenError::Config(
                "user model max_tokens and timeout_secs must be > 0".into(),
            ));
        }
        Ok(())
    }
}

/// The instruction the user model gets.
const INSTRUCTION: &str = "You play the user in a conversation with an assistant about a \
document. Given the conversation so far, write the user's next message: one short follow-up \
question about the document or the last answer. Reply with the question only.";

/// The longest question taken from the user model, in bytes.
const MAX_QUESTION_BYTES: usize = 2048;

/// A configured user model.
pub(crate) struct UserModel {
    config: UserModelConfig,
    url: String,
    client: reqwest::Client,
}

impl UserModel {
    pub fn new(config: UserModelConfig, client: reqwest::Client) -> Self {
        let url = format!("{}/v1/chat/completions", config.url.trim_end_matches('/'));
        Self {
            config,
            url,
            client,
        }
    }

    /// The user's next question after `turn` was answered with `answer`, or `None` (use the
    /// built-in question).
    pub async fn follow_up(&self, turn: &ChatTurn, answer: &str) -> Option<String> {
        match self.ask(turn, answer).await {
            Ok(q) => Some(q),
            Err(why) => {
                tracing::warn!(conversation = turn.conversation, turn = turn.turn, error = %why, "user model gave no question; using the built-in one");
                None
            }
        }
    }

    async fn ask(&self, turn: &ChatTurn, answer: &str) -> Result<String, String> {
        let max = self.config.max_context_bytes;
        let mut transcript = String::new();
        for m in &turn.messages {
            transcript.push_str(&format!("{}: {}\n\n", m.role, truncate(&m.content, max)));
        }
        transcript.push_str(&format!("assistant: {}\n", truncate(answer, max)));
        let body = serde_json::json!({
            "model": self.config.model,
            "messages": [
                {"role": "system", "content": INSTRUCTION},
                {"role": "user", "content": transcript},
            ],
            "max_tokens": self.config.max_tokens,
            "stream": false,
        });
        let mut req = self.client.post(&self.url).json(&body);
        if let Some(key) = &self.config.key {
            req = req.bearer_auth(key);
        }
        let timeout = Duration::from_secs_f64(self.config.timeout_secs);
        let resp = tokio::time::timeout(timeout, req.send())
            .await
            .map_err(|_| "timeout".to_string())?
            .map_err(|e| e.to_string())?;
        if !resp.status().is_success() {
            return Err(format!("answered {}", resp.status()));
        }
        let bytes = tokio::time::timeout(timeout, resp.bytes())
            .await
            .map_err(|_| "timeout".to_string())?
            .map_err(|e| e.to_string())?;
        if bytes.len() > 1 << 20 {
            return Err("answer larger than 1 MiB".into());
        }
        let v: serde_json::Value =
            serde_json::from_slice(&bytes).map_err(|e| format!("not JSON: {e}"))?;
        let text = v["choices"][0]["message"]["content"]
            .as_str()
            .map(str::trim)
            .unwrap_or_default();
        if text.is_empty() {
            return Err("empty question".into());
        }
        Ok(truncate(text, MAX_QUESTION_BYTES))
    }
}
