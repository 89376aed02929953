//! Prompt preprocessing for kvroute: chat template rendering and
//! tokenization.
//!
//! The gateway (to route on KV block hashes) and the workers (to fill their
//! KV caches) must turn the same OpenAI request into exactly the same token
//! ids. Both use a [`Preprocessor`]:
//!
//! - [`Preprocessor::from_dir`] loads a Hugging Face tokenizer directory
//!   (`tokenizer.json` + `tokenizer_config.json`), as the real engine would;
//! - [`Preprocessor::builtin`] is a small byte-level BPE shipped with the
//!   project (trained on its own docs by `examples/make_tokenizer.rs`) with a
//!   ChatML template;
//! - [`Preprocessor::approximate`] needs no tokenizer at all: a fixed simple
//!   template and 4-byte pseudo tokens.
//!
//! Everything is deterministic: no clock, environment or randomness is used
//! (`strftime_now` in templates formats the fixed [`FIXED_DATE`]).

mod approx;
mod error;
mod hf_files;
mod jinja;
mod pieces;
pub use pieces::CACHE_BYTES as PIECE_CACHE_BYTES;
mod pool;
pub use pool::{
    TokenizePool, DEFAULT_QUEUE as DEFAULT_TOKENIZE_QUEUE,
    DEFAULT_THREADS as DEFAULT_TOKENIZE_THREADS,
};
mod template;

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock};

use kvroute_protocol::openai::PromptInput;
use serde_json::Value as Json;
use tokenizers::Tokenizer;

pub use approx::BYTES_PER_PSEUDO_TOKEN;
pub use error::PreprocessError;
pub use jinja::FIXED_DATE;

use template::ChatTemplate;

/// Default cap on the size of the text given to [`Preprocessor::encode`]:
/// 8 MiB.
pub const DEFAULT_MAX_INPUT_BYTES: usize = 8 * 1024 * 1024;

/// The pool of preprocessors given none ([`Preprocessor::with_pool`]): started at first
/// use, [`DEFAULT_TOKENIZE_THREADS`] threads.
static DEFAULT_POOL: LazyLock<Result<TokenizePool, String>> = LazyLock::new(|| {
    TokenizePool::new(DEFAULT_TOKENIZE_THREADS, DEFAULT_TOKENIZE_QUEUE).map_err(|e| e.to_string())
});

/// The shipped tokenizer's `tokenizer.json`.
const BUILTIN_TOKENIZER: &[u8] = include_bytes!("../assets/tokenizer/tokenizer.json");
/// The shipped tokenizer's `tokenizer_config.json`.
const BUILTIN_CONFIG: &[u8] = include_bytes!("../assets/tokenizer/tokenizer_config.json");

/// The builtin tokenizer, parsed once per process.
static BUILTIN: LazyLock<Arc<Inner>> = LazyLock::new(|| {
    let tokenizer = hf_files::load_tokenizer(BUILTIN_TOKENIZER, "builtin tokenizer.json")
        .expect("the embedded tokenizer.json is valid (covered by tests)");
    let chat = hf_files::parse_tokenizer_config(BUILTIN_CONFIG, "builtin tokenizer_config.json")
        .expect("the embedded tokenizer_config.json is valid (covered by tests)");
    let state = TokenizerState::new(
        tokenizer,
        BUILTIN_TOKENIZER,
        chat,
        Source::Builtin,
        "builtin",
    )
    .expect("the embedded chat template compiles (covered by tests)");
    Arc::new(Inner::Tokenizer(Box::new(state)))
});

/// How many of the builtin tokenizer's merges `builtin-small` keeps.
pub const SMALL_MERGES: usize = 256;

/// The builtin tokenizer with only its first [`SMALL_MERGES`] merges: a second tokenizer
/// (more tokens for the same text, cut elsewhere), for a gateway serving several models.
static BUILTIN_SMALL: LazyLock<Arc<Inner>> = LazyLock::new(|| {
    let mut json: serde_json::Value = serde_json::from_slice(BUILTIN_TOKENIZER)
        .expect("the embedded tokenizer.json is valid (covered by tests)");
    if let Some(merges) = json["model"]["merges"].as_array_mut() {
        merges.truncate(SMALL_MERGES);
    }
    let bytes = serde_json::to_vec(&json).expect("a JSON value serializes");
    let tokenizer = hf_files::load_tokenizer(&bytes, "builtin-small tokenizer.json")
        .expect("the embedded tokenizer.json without merges is valid (covered by tests)");
    let chat = hf_files::parse_tokenizer_config(BUILTIN_CONFIG, "builtin tokenizer_config.json")
        .expect("the embedded tokenizer_config.json is valid (covered by tests)");
    let state = TokenizerState::new(
        tokenizer,
        &bytes,
        chat,
        Source::BuiltinSmall,
        "builtin-small",
    )
    .expect("the embedded chat template compiles (covered by tests)");
    Arc::new(Inner::Tokenizer(Box::new(state)))
});

/// Turns chat messages into a prompt and prompts into token ids.
///
/// Cheap to clone (the tokenizer and the compiled template are shared behind
/// an `Arc`), `Send + Sync`; all methods take `&self`.
#[derive(Clone)]
pub struct Preprocessor {
    inner: Arc<Inner>,
    max_input_bytes: usize,
    /// Where [`prompt_tokens_pooled`](Self::prompt_tokens_pooled) tokenizes (`None`: the
    /// process's default pool).
    pool: Option<TokenizePool>,
}

/// The shared part of a [`Preprocessor`].
enum Inner {
    /// A real tokenizer (boxed: it is much larger than the other variant).
    Tokenizer(Box<TokenizerState>),
    /// No tokenizer: fixed template, 4-byte pseudo tokens.
    Approximate,
}

/// Where a tokenizer came from, for [`Preprocessor::describe`].
enum Source {
    Builtin,
    BuiltinSmall,
    Dir(PathBuf),
}

/// A loaded tokenizer and its chat template.
struct TokenizerState {
    tokenizer: Tokenizer,
    /// Piecewise tokenizing with a cache of pieces (see `pieces`).
    pieces: pieces::PieceCoder,
    /// The compiled template, or why there is none.
    chat: Result<ChatTemplate, String>,
    eos_token: Option<String>,
    source: Source,
}

impl TokenizerState {
    /// `json` is the `tokenizer.json` that `tokenizer` was loaded from.
    fn new(
        tokenizer: Tokenizer,
        json: &[u8],
        chat: hf_files::ChatConfig,
        source: Source,
        origin: &str,
    ) -> Result<Self, PreprocessError> {
        let eos_token = chat.eos_token.clone();
        let chat = match chat.template {
            Ok(template) => Ok(ChatTemplate::new(
                template,
                chat.bos_token,
                chat.eos_token,
                origin,
            )?),
            Err(missing) => Err(missing),
        };
        Ok(Self {
            pieces: pieces::PieceCoder::new(&tokenizer, json),
            tokenizer,
            chat,
            eos_token,
            source,
        })
    }
}

impl Preprocessor {
    fn with_inner(inner: Arc<Inner>) -> Self {
        Self {
            inner,
            max_input_bytes: DEFAULT_MAX_INPUT_BYTES,
            pool: None,
        }
    }

    /// Loads a Hugging Face tokenizer directory: `dir/tokenizer.json` and
    /// `dir/tokenizer_config.json`.
    ///
    /// The config's `chat_template` is a string or a list of
    /// `{name, template}` objects (the one named `"default"` is used); when
    /// absent, `dir/chat_template.jinja` or `dir/chat_template.json` is used
    /// if present. Without any template, loading succeeds, encoding works,
    /// and [`render_chat`](Self::render_chat) returns a
    /// [`PreprocessError::Config`] saying so. `bos_token` / `eos_token` are
    /// strings or objects with a `"content"` string. Truncation and padding
    /// configured in `tokenizer.json` are disabled.
    ///
    /// Errors name the offending file: [`PreprocessError::Io`] for missing
    /// or unreadable files, [`PreprocessError::TokenizerFile`] for an invalid
    /// `tokenizer.json`, [`PreprocessError::Config`] for an invalid config or
    /// a template that does not compile.
    pub fn from_dir(dir: &Path) -> Result<Self, PreprocessError> {
        let tokenizer_path = dir.join("tokenizer.json");
        let config_path = dir.join("tokenizer_config.json");
        let tokenizer_bytes = hf_files::read(&tokenizer_path)?;
        let config_bytes = hf_files::read(&config_path)?;
        let tokenizer =
            hf_files::load_tokenizer(&tokenizer_bytes, &tokenizer_path.display().to_string())?;
        let config_origin = config_path.display().to_string();
        let mut chat = hf_files::parse_tokenizer_config(&config_bytes, &config_origin)?;
        if let Err(missing) = &chat.template {
            chat.template = hf_files::fallback_template(dir, missing.clone())?;
        }
        let state = TokenizerState::new(
            tokenizer,
            &tokenizer_bytes,
            chat,
            Source::Dir(dir.to_path_buf()),
            &config_origin,
        )?;
        Ok(Self::with_inner(Arc::new(Inner::Tokenizer(Box::new(
            state,
        )))))
    }

    /// The small tokenizer shipped with the project (byte-level BPE, 2,048
    /// tokens, special tokens `<|endoftext|>`, `<|im_start|>`, `<|im_end|>`,
    /// ChatML template). Parsed once per process; later calls are cheap.
    pub fn builtin() -> Self {
        Self::with_inner(Arc::clone(&BUILTIN))
    }

    /// The builtin tokenizer with only its first [`SMALL_MERGES`] BPE merges: more tokens
    /// for the same text, the same special tokens and chat template (`tokenizer =
    /// "builtin-small"`). Parsed once per process.
    pub fn builtin_small() -> Self {
        Self::with_inner(Arc::clone(&BUILTIN_SMALL))
    }

    /// The tokenizer a setting names: `builtin`, `builtin-small`, or a directory.
    pub fn from_spec(spec: &str) -> Result<Self, PreprocessError> {
        match spec {
            "builtin" => Ok(Self::builtin()),
            "builtin-small" => Ok(Self::builtin_small()),
            dir => Self::from_dir(Path::new(dir)),
        }
    }

    /// Approximate mode, without a tokenizer.
    ///
    /// [`render_chat`](Self::render_chat) uses a fixed simple template:
    /// `"<|role|>\ncontent\n"` per message, then `"<|assistant|>\n"` when
    /// `add_generation_prompt`. [`encode`](Self::encode) turns the UTF-8
    /// bytes into pseudo token ids, [`BYTES_PER_PSEUDO_TOKEN`] bytes per id
    /// read as a little-endian `u32`, the last one zero-padded ("abcde" ->
    /// `[0x6463_6261, 0x65]`). [`decode`](Self::decode) is not supported.
    pub fn approximate() -> Self {
        Self::with_inner(Arc::new(Inner::Approximate))
    }

    /// Sets the cap on the text given to [`encode`](Self::encode), in bytes
    /// (default [`DEFAULT_MAX_INPUT_BYTES`]).
    pub fn with_max_input_bytes(mut self, max_bytes: usize) -> Self {
        self.max_input_bytes = max_bytes;
        self
    }

    /// Bounds the cache of tokenized prompt pieces to `bytes` (default
    /// [`PIECE_CACHE_BYTES`]; 0: no caching). Clones share the cache, so this sets it for
    /// them too.
    pub fn with_cache_bytes(self, bytes: usize) -> Self {
        if let Inner::Tokenizer(state) = &*self.inner {
            state.pieces.set_cache_bytes(bytes);
        }
        self
    }

    /// Tokenizes on `pool`'s threads (clones made after share it) instead of the process's
    /// default pool.
    pub fn with_pool(mut self, pool: TokenizePool) -> Self {
        self.pool = Some(pool);
        self
    }

    /// The pool [`prompt_tokens_pooled`](Self::prompt_tokens_pooled) uses.
    pub fn pool(&self) -> Result<&TokenizePool, PreprocessError> {
        match &self.pool {
            Some(pool) => Ok(pool),
            None => DEFAULT_POOL
                .as_ref()
                .map_err(|e| PreprocessError::Config(e.clone())),
        }
    }

    /// Like [`prompt_tokens`](Self::prompt_tokens), run on the tokenizing pool's threads
    /// (see the `pool` module: the tokenizer's per-thread caches then exist once per pool
    /// thread) without blocking the caller's. Token ids as given and approximate mode need
    /// no tokenizer and are done in place. [`PreprocessError::Busy`] when the pool's queue
    /// is full.
    pub async fn prompt_tokens_pooled(
        &self,
        input: PromptInput,
    ) -> Result<Vec<u32>, PreprocessError> {
        if let PromptInput::Tokens(ids) = input {
            return Ok(ids);
        }
        if self.is_approximate() {
            return self.prompt_tokens(&input);
        }
        let me = self.clone();
        self.pool()?.run(move || me.prompt_tokens(&input)).await
    }

    /// Like [`encode`](Self::encode), on the tokenizing pool's threads (see
    /// [`prompt_tokens_pooled`](Self::prompt_tokens_pooled)).
    pub async fn encode_pooled(&self, text: String) -> Result<Vec<u32>, PreprocessError> {
        if self.is_approximate() {
            return self.encode(&text);
        }
        let me = self.clone();
        self.pool()?.run(move || me.encode(&text)).await
    }

    /// The cap on the text given to [`encode`](Self::encode), in bytes.
    pub fn max_input_bytes(&self) -> usize {
        self.max_input_bytes
    }

    /// Whether new text is encoded by the fast encoder (`fastokens`), which agreed with
    /// the tokenizer on every probe text at load.
    pub fn is_fast(&self) -> bool {
        matches!(&*self.inner, Inner::Tokenizer(s) if s.pieces.is_fast())
    }

    /// Whether prompts are tokenized piece by piece between special tokens, with a cache of
    /// pieces (see the `pieces` module; false in approximate mode and for tokenizers where
    /// that would change the ids).
    pub fn is_piecewise(&self) -> bool {
        matches!(&*self.inner, Inner::Tokenizer(s) if s.pieces.is_piecewise())
    }

    /// True in approximate mode.
    pub fn is_approximate(&self) -> bool {
        matches!(*self.inner, Inner::Approximate)
    }

    /// A short description for logs and health endpoints, e.g. `"tokenizer at
    /// /models/x (vocab 151665)"`, `"builtin tokenizer (vocab 2048)"` or
    /// `"approximate (4 bytes per pseudo token)"`. `", no chat template"` is
    /// appended when the tokenizer has none.
    pub fn describe(&self) -> String {
        match &*self.inner {
            Inner::Approximate => {
                format!("approximate ({BYTES_PER_PSEUDO_TOKEN} bytes per pseudo token)")
            }
            Inner::Tokenizer(state) => {
                let vocab = state.tokenizer.get_vocab_size(true);
                let what = match &state.source {
                    Source::Builtin => "builtin tokenizer".to_owned(),
                    Source::BuiltinSmall => "builtin small tokenizer".to_owned(),
                    Source::Dir(dir) => format!("tokenizer at {}", dir.display()),
                };
                let no_template = if state.chat.is_err() {
                    ", no chat template"
                } else {
                    ""
                };
                format!("{what} (vocab {vocab}){no_template}")
            }
        }
    }

    /// Renders the chat template for an OpenAI chat request.
    ///
    /// `messages` are the elements of the request's `messages` array as
    /// given: objects with a string `role` and `content` (a string, null, or
    /// a list of parts; a list made only of `{"type": "text", "text": ...}`
    /// parts is passed to the template as one string, the texts joined with
    /// `"\n"`), plus any other fields (`name`, `tool_calls`, ...), which the
    /// template sees unchanged.
    ///
    /// The template also sees `add_generation_prompt`, `bos_token` and
    /// `eos_token` (when configured), `tools` and `documents` (none), and the
    /// functions `raise_exception(msg)` and `strftime_now(format)`.
    ///
    /// Errors: [`PreprocessError::Invalid`] when `messages` is empty or a
    /// message is not an object with a string `role`;
    /// [`PreprocessError::Template`] when rendering fails (including
    /// `raise_exception` messages); [`PreprocessError::Config`] when the
    /// tokenizer has no chat template.
    pub fn render_chat(
        &self,
        messages: &[Json],
        add_generation_prompt: bool,
    ) -> Result<String, PreprocessError> {
        self.render_chat_with_tools(messages, None, add_generation_prompt)
    }

    /// Like [`render_chat`](Self::render_chat), with the request's `tools`
    /// (the elements of its `tools` array) available to the template as
    /// `tools`. `None` renders exactly like `render_chat`.
    pub fn render_chat_with_tools(
        &self,
        messages: &[Json],
        tools: Option<&[Json]>,
        add_generation_prompt: bool,
    ) -> Result<String, PreprocessError> {
        let messages = template::normalize_messages(messages)?;
        match &*self.inner {
            Inner::Approximate => Ok(approx::render(&messages, tools, add_generation_prompt)),
            Inner::Tokenizer(state) => match &state.chat {
                Ok(chat) => chat.render(&messages, tools, add_generation_prompt),
                Err(missing) => Err(PreprocessError::Config(format!(
                    "cannot render chat messages: {missing}"
                ))),
            },
        }
    }

    /// Token ids of a request's prompt: chat messages rendered with the template (with the
    /// generation prompt, or continuing the final message) then encoded, a text encoded, or
    /// token ids as given.
    pub fn prompt_tokens(&self, input: &PromptInput) -> Result<Vec<u32>, PreprocessError> {
        match input {
            PromptInput::Tokens(ids) => Ok(ids.clone()),
            PromptInput::Text(text) => self.encode(text),
            PromptInput::Messages(messages) => self.encode(&self.render_chat(messages, true)?),
            PromptInput::Continue(messages) => self.encode(&self.render_continuation(messages)?),
        }
    }

    /// Renders `messages` so that the answer continues the final one (an assistant's
    /// partial answer: `continue_final_message`): rendered without a generation prompt, then
    /// cut right after the last place the final message's text (trimmed) appears, as
    /// Hugging Face's `apply_chat_template` does, so that the template's end-of-turn markup
    /// after it is not in the prompt.
    ///
    /// Errors: those of [`render_chat`](Self::render_chat), and
    /// [`PreprocessError::Invalid`] when the final message's content is not text or does
    /// not appear in the rendered prompt.
    pub fn render_continuation(&self, messages: &[Json]) -> Result<String, PreprocessError> {
        let rendered = self.render_chat(messages, false)?;
        let last = template::normalize_messages(&messages[messages.len().saturating_sub(1)..])?;
        let text = match last.first().and_then(|m| m.get("content")) {
            Some(Json::String(t)) => t.trim(),
            None | Some(Json::Null) => "",
            Some(_) => {
                return Err(PreprocessError::Invalid(
                    "the message to continue must have text content".into(),
                ))
            }
        };
        match rendered.rfind(text) {
            Some(at) => Ok(rendered[..at + text.len()].to_string()),
            None => Err(PreprocessError::Invalid(
                "the final message does not appear in the rendered chat, so it cannot be continued"
                    .into(),
            )),
        }
    }

    /// The token ids of `text`, without adding special tokens (a rendered
    /// chat template already contains them; special-token text such as
    /// `<|im_start|>` in `text` still becomes its single special id).
    /// Deterministic.
    ///
    /// Returns [`PreprocessError::TooLong`] without tokenizing when `text` is
    /// longer than [`max_input_bytes`](Self::max_input_bytes).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, PreprocessError> {
        if text.len() > self.max_input_bytes {
            return Err(PreprocessError::TooLong {
                limit: self.max_input_bytes,
                got: text.len(),
            });
        }
        match &*self.inner {
            Inner::Approximate => Ok(approx::encode(text)),
            Inner::Tokenizer(state) => state
                .pieces
                .encode(&state.tokenizer, text)
                .map_err(PreprocessError::Encode),
        }
    }

    /// The text of `ids`, special tokens included. Ids outside the
    /// vocabulary are skipped. [`PreprocessError::NotSupported`] in
    /// approximate mode.
    pub fn decode(&self, ids: &[u32]) -> Result<String, PreprocessError> {
        match &*self.inner {
            Inner::Approximate => Err(PreprocessError::NotSupported(
                "decoding in approximate mode (pseudo tokens are not real tokens)",
            )),
            Inner::Tokenizer(state) => state
                .tokenizer
                .decode(ids, false)
                .map_err(|e| PreprocessError::Decode(e.to_string())),
        }
    }

    /// The vocabulary size, added tokens included (0 in approximate mode).
    pub fn vocab_size(&self) -> usize {
        match &*self.inner {
            Inner::Approximate => 0,
            Inner::Tokenizer(state) => state.tokenizer.get_vocab_size(true),
        }
    }

    /// The configured `eos_token` text, if any (none in approximate mode).
    pub fn eos_token(&self) -> Option<&str> {
        match &*self.inner {
            Inner::Approximate => None,
            Inner::Tokenizer(state) => state.eos_token.as_deref(),
        }
    }

    /// The id of the configured `eos_token`, if it is in the vocabulary.
    pub fn eos_token_id(&self) -> Option<u32> {
        match &*self.inner {
            Inner::Approximate => None,
            Inner::Tokenizer(state) => state
                .eos_token
                .as_deref()
                .and_then(|eos| state.tokenizer.token_to_id(eos)),
        }
    }
}

impl fmt::Debug for Preprocessor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Preprocessor")
            .field("kind", &self.describe())
            .field("max_input_bytes", &self.max_input_bytes)
            .finish()
    }
}

#[cfg(test)]
mod tests;
