//! Reading a Hugging Face tokenizer directory: `tokenizer.json`,
//! `tokenizer_config.json` and, when the config has no `chat_template`,
//! the newer stand-alone `chat_template.jinja` / `chat_template.json` files.

use std::path::Path;

use serde_json::Value;
use tokenizers::Tokenizer;

use crate::PreprocessError;

/// Chat-related settings of `tokenizer_config.json`.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct ChatConfig {
    /// The template source, or why there is none (reported by `render_chat`).
    pub(crate) template: Result<String, String>,
    /// `bos_token`, when set.
    pub(crate) bos_token: Option<String>,
    /// `eos_token`, when set.
    pub(crate) eos_token: Option<String>,
}

/// Reads a whole file, mapping errors to [`PreprocessError::Io`].
pub(crate) fn read(path: &Path) -> Result<Vec<u8>, PreprocessError> {
    std::fs::read(path).map_err(|source| PreprocessError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// Reads a file that may be absent: `Ok(None)` when it does not exist.
fn read_optional(path: &Path) -> Result<Option<Vec<u8>>, PreprocessError> {
    match std::fs::read(path) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(PreprocessError::Io {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Parses `tokenizer.json` bytes; `origin` names the source in errors.
/// Truncation and padding stored in the file are switched off: routing needs
/// every token of the prompt.
pub(crate) fn load_tokenizer(bytes: &[u8], origin: &str) -> Result<Tokenizer, PreprocessError> {
    let mut tokenizer = Tokenizer::from_bytes(bytes)
        .map_err(|e| PreprocessError::TokenizerFile(format!("{origin}: {e}")))?;
    tokenizer
        .with_truncation(None)
        .map_err(|e| PreprocessError::TokenizerFile(format!("{origin}: {e}")))?;
    tokenizer.with_padding(None);
    Ok(tokenizer)
}

/// Parses `tokenizer_config.json` text; `origin` names the source in errors.
pub(crate) fn parse_tokenizer_config(
    bytes: &[u8],
    origin: &str,
) -> Result<ChatConfig, PreprocessError> {
    let value: Value = serde_json::from_slice(bytes)
        .map_err(|e| PreprocessError::Config(format!("{origin}: invalid JSON: {e}")))?;
    let Value::Object(map) = value else {
        return Err(PreprocessError::Config(format!(
            "{origin}: expected a JSON object"
        )));
    };
    let template = match map.get("chat_template") {
        None | Some(Value::Null) => Err(format!("{origin} has no chat_template")),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(list)) => named_template(list, origin)?,
        Some(_) => {
            return Err(PreprocessError::Config(format!(
                "{origin}: chat_template must be a string or a list of {{name, template}} objects"
            )))
        }
    };
    Ok(ChatConfig {
        template,
        bos_token: special_token(map.get("bos_token"), "bos_token", origin)?,
        eos_token: special_token(map.get("eos_token"), "eos_token", origin)?,
    })
}

/// Picks the template named "default" from the list form of `chat_template`.
/// A list without one is reported when rendering, like Hugging Face does.
fn named_template(list: &[Value], origin: &str) -> Result<Result<String, String>, PreprocessError> {
    let mut names = Vec::new();
    for entry in list {
        let name = entry.get("name").and_then(Value::as_str);
        let template = entry.get("template").and_then(Value::as_str);
        let (Some(name), Some(template)) = (name, template) else {
            return Err(PreprocessError::Config(format!(
                "{origin}: every chat_template list entry needs string \"name\" and \"template\""
            )));
        };
        if name == "default" {
            return Ok(Ok(template.to_owned()));
        }
        names.push(name);
    }
    Ok(Err(format!(
        "{origin} has several chat templates ({}) but none named \"default\"",
        names.join(", ")
    )))
}

/// Reads `bos_token` / `eos_token`: a string, `{"content": string, ...}`, or
/// null/absent.
fn special_token(
    value: Option<&Value>,
    field: &str,
    origin: &str,
) -> Result<Option<String>, PreprocessError> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Object(obj)) => match obj.get("content") {
            Some(Value::String(s)) => Ok(Some(s.clone())),
            _ => Err(PreprocessError::Config(format!(
                "{origin}: {field} object needs a string \"content\""
            ))),
        },
        Some(_) => Err(PreprocessError::Config(format!(
            "{origin}: {field} must be a string, an object with \"content\", or null"
        ))),
    }
}

/// When `tokenizer_config.json` has no template, looks for
/// `dir/chat_template.jinja` (raw template) and then `dir/chat_template.json`
/// (`{"chat_template": "..."}`), as saved by recent `transformers` versions.
pub(crate) fn fallback_template(
    dir: &Path,
    missing: String,
) -> Result<Result<String, String>, PreprocessError> {
    let jinja = dir.join("chat_template.jinja");
    if let Some(bytes) = read_optional(&jinja)? {
        return String::from_utf8(bytes)
            .map(Ok)
            .map_err(|_| PreprocessError::Config(format!("{}: not valid UTF-8", jinja.display())));
    }
    let json = dir.join("chat_template.json");
    if let Some(bytes) = read_optional(&json)? {
        let origin = json.display().to_string();
        let value: Value = serde_json::from_slice(&bytes)
            .map_err(|e| PreprocessError::Config(format!("{origin}: invalid JSON: {e}")))?;
        return match value.get("chat_template") {
            Some(Value::String(s)) => Ok(Ok(s.clone())),
            Some(Value::Array(list)) => named_template(list, &origin),
            _ => Err(PreprocessError::Config(format!(
                "{origin}: expected a \"chat_template\" string"
            ))),
        };
    }
    Ok(Err(format!(
        "{missing} (and there is no chat_template.jinja or chat_template.json)"
    )))
}
