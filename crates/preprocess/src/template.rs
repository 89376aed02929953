//! Chat template rendering with minijinja, configured like Hugging Face's
//! Jinja environment, and validation/normalization of OpenAI `messages`.

use std::collections::BTreeMap;

use minijinja::{Environment, Value};
use serde_json::Value as Json;

use crate::jinja;
use crate::PreprocessError;

/// Name of the single template registered in the environment.
const TEMPLATE_NAME: &str = "chat";

/// A compiled chat template plus the special tokens it may reference.
pub(crate) struct ChatTemplate {
    env: Environment<'static>,
    bos_token: Option<String>,
    eos_token: Option<String>,
}

impl ChatTemplate {
    /// Compiles `source`. `origin` names the template in errors.
    pub(crate) fn new(
        source: String,
        bos_token: Option<String>,
        eos_token: Option<String>,
        origin: &str,
    ) -> Result<Self, PreprocessError> {
        let mut env = Environment::new();
        // Hugging Face renders with trim_blocks=True, lstrip_blocks=True and
        // the default keep_trailing_newline=False (minijinja's default too).
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        // Python string/dict methods: .strip(), .startswith(), .items(), ...
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", jinja::raise_exception);
        env.add_function("strftime_now", jinja::strftime_now);
        env.add_filter("tojson", jinja::tojson);
        env.add_template_owned(TEMPLATE_NAME, source).map_err(|e| {
            PreprocessError::Config(format!("{origin}: chat template does not compile: {e}"))
        })?;
        Ok(Self {
            env,
            bos_token,
            eos_token,
        })
    }

    /// Renders normalized messages (see [`normalize_messages`]).
    pub(crate) fn render(
        &self,
        messages: &[Json],
        tools: Option<&[Json]>,
        add_generation_prompt: bool,
    ) -> Result<String, PreprocessError> {
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| PreprocessError::Template(e.to_string()))?;
        let mut ctx: BTreeMap<&str, Value> = BTreeMap::new();
        ctx.insert("messages", Value::from_serialize(messages));
        ctx.insert("add_generation_prompt", Value::from(add_generation_prompt));
        ctx.insert(
            "tools",
            tools.map_or(Value::from(()), Value::from_serialize),
        );
        ctx.insert("documents", Value::from(()));
        // Absent tokens stay undefined (render as ""), like in transformers.
        if let Some(bos) = &self.bos_token {
            ctx.insert("bos_token", Value::from(bos.as_str()));
        }
        if let Some(eos) = &self.eos_token {
            ctx.insert("eos_token", Value::from(eos.as_str()));
        }
        template
            .render(ctx)
            .map_err(|e| PreprocessError::Template(e.to_string()))
    }
}

/// Checks that `messages` is a non-empty list of objects with a string
/// `role`, and returns copies where `content` given as a list of text parts
/// (`[{"type": "text", "text": "..."}, ...]`) is replaced by the texts joined
/// with `"\n"` (what vLLM does for templates that expect string content).
/// Content lists with any other kind of part are passed through unchanged.
pub(crate) fn normalize_messages(messages: &[Json]) -> Result<Vec<Json>, PreprocessError> {
    if messages.is_empty() {
        return Err(PreprocessError::Invalid(
            "messages must be a non-empty array".into(),
        ));
    }
    messages
        .iter()
        .enumerate()
        .map(|(i, message)| {
            let Json::Object(map) = message else {
                return Err(PreprocessError::Invalid(format!(
                    "messages[{i}] must be an object"
                )));
            };
            match map.get("role") {
                Some(Json::String(_)) => {}
                Some(_) => {
                    return Err(PreprocessError::Invalid(format!(
                        "messages[{i}].role must be a string"
                    )))
                }
                None => {
                    return Err(PreprocessError::Invalid(format!(
                        "messages[{i}] has no role"
                    )))
                }
            }
            let mut map = map.clone();
            if let Some(Json::Array(parts)) = map.get("content") {
                if let Some(text) = join_text_parts(parts) {
                    map.insert("content".into(), Json::String(text));
                }
            }
            Ok(Json::Object(map))
        })
        .collect()
}

/// The texts of `parts` joined with `"\n"` when every part is
/// `{"type": "text", "text": <string>}`; `None` otherwise.
fn join_text_parts(parts: &[Json]) -> Option<String> {
    let mut texts = Vec::with_capacity(parts.len());
    for part in parts {
        if part.get("type").and_then(Json::as_str) != Some("text") {
            return None;
        }
        texts.push(part.get("text").and_then(Json::as_str)?);
    }
    Some(texts.join("\n"))
}
