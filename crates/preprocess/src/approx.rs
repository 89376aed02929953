//! Approximate mode, used when no tokenizer is configured: a fixed simple
//! chat template and 4-byte pseudo tokens.
//!
//! Pseudo token ids are not real token ids, but they are deterministic and
//! prefix-preserving at 4-byte granularity: two prompts sharing a prefix of
//! `n` bytes share their first `n / 4` pseudo tokens, which is what KV-aware
//! routing needs.

use serde_json::Value as Json;

/// Bytes per pseudo token.
pub const BYTES_PER_PSEUDO_TOKEN: usize = 4;

/// Renders normalized messages as `"<|role|>\ncontent\n"` each, then
/// `"<|assistant|>\n"` when `add_generation_prompt`.
///
/// String content is used as is, missing or null content as `""`, and any
/// other content (e.g. a list with image parts) as its compact JSON text.
/// Tools, when given and not empty, come first as `"<|tools|>\n<json>\n"`.
pub(crate) fn render(
    messages: &[Json],
    tools: Option<&[Json]>,
    add_generation_prompt: bool,
) -> String {
    let mut out = String::new();
    if let Some(tools) = tools.filter(|t| !t.is_empty()) {
        out.push_str("<|tools|>\n");
        out.push_str(&Json::from(tools.to_vec()).to_string());
        out.push('\n');
    }
    for message in messages {
        let role = message
            .get("role")
            .and_then(Json::as_str)
            .unwrap_or_default();
        out.push_str("<|");
        out.push_str(role);
        out.push_str("|>\n");
        match message.get("content") {
            None | Some(Json::Null) => {}
            Some(Json::String(s)) => out.push_str(s),
            Some(other) => out.push_str(&other.to_string()),
        }
        out.push('\n');
    }
    if add_generation_prompt {
        out.push_str("<|assistant|>\n");
    }
    out
}

/// The pseudo token ids of `text`: each group of 4 UTF-8 bytes read as a
/// little-endian `u32`, the last group zero-padded.
pub(crate) fn encode(text: &str) -> Vec<u32> {
    text.as_bytes()
        .chunks(BYTES_PER_PSEUDO_TOKEN)
        .map(|chunk| {
            let mut word = [0u8; BYTES_PER_PSEUDO_TOKEN];
            word[..chunk.len()].copy_from_slice(chunk);
            u32::from_le_bytes(word)
        })
        .collect()
}
