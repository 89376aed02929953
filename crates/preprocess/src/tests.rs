//! Tests of the public [`Preprocessor`] API.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::{json, Value as Json};

use super::*;

/// A fresh, empty directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!(
            "kvroute-preprocess-{}-{name}-{n}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("create temp dir");
        Self(path)
    }

    fn path(&self) -> &Path {
        &self.0
    }

    fn write(&self, file: &str, contents: &[u8]) {
        std::fs::write(self.0.join(file), contents).expect("write temp file");
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A temp dir holding the builtin tokenizer.json and the given config.
fn dir_with_config(name: &str, config: &Json) -> TempDir {
    let dir = TempDir::new(name);
    dir.write("tokenizer.json", BUILTIN_TOKENIZER);
    dir.write("tokenizer_config.json", config.to_string().as_bytes());
    dir
}

fn conversation() -> Vec<Json> {
    vec![
        json!({"role": "system", "content": "You are a helpful assistant."}),
        json!({"role": "user", "content": "How does the router pick a worker?"}),
    ]
}

const CONVERSATION_PROMPT: &str = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n\
<|im_start|>user\nHow does the router pick a worker?<|im_end|>\n<|im_start|>assistant\n";

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[test]
fn preprocessor_is_send_sync_and_cheap_to_clone() {
    fn assert_send_sync<T: Send + Sync + Clone + 'static>() {}
    assert_send_sync::<Preprocessor>();
    let a = Preprocessor::builtin();
    let b = a.clone();
    assert!(Arc::ptr_eq(&a.inner, &b.inner));
    assert!(Arc::ptr_eq(&a.inner, &Preprocessor::builtin().inner));
}

#[test]
fn builtin_loads() {
    let p = Preprocessor::builtin();
    assert!(!p.is_approximate());
    assert_eq!(p.vocab_size(), 2048);
    assert_eq!(p.describe(), "builtin tokenizer (vocab 2048)");
    assert_eq!(p.eos_token(), Some("<|im_end|>"));
    assert_eq!(p.eos_token_id(), Some(2));
    assert_eq!(p.max_input_bytes(), DEFAULT_MAX_INPUT_BYTES);
    assert!(format!("{p:?}").contains("builtin tokenizer"));
}

#[test]
fn builtin_small_cuts_text_into_more_tokens_than_builtin() {
    let (p, b) = (Preprocessor::builtin_small(), Preprocessor::builtin());
    assert_eq!(p.describe(), "builtin small tokenizer (vocab 2048)");
    let text = "the gateway routes each request to the replica with its prefix";
    let ids = p.encode(text).unwrap();
    assert!(ids.len() > b.encode(text).unwrap().len());
    assert!(ids.len() < text.len(), "some merges are kept");
    assert!(ids.iter().all(|&id| (id as usize) < 259 + SMALL_MERGES));
    assert_eq!(p.decode(&ids).unwrap(), text);
    assert_eq!(p.eos_token_id(), Some(2));
    assert_eq!(
        p.render_chat(&conversation(), true).unwrap(),
        CONVERSATION_PROMPT
    );
}

#[test]
fn builtin_renders_chatml() {
    let p = Preprocessor::builtin();
    assert_eq!(
        p.render_chat(&conversation(), true).unwrap(),
        CONVERSATION_PROMPT
    );
    let without = p.render_chat(&conversation(), false).unwrap();
    assert_eq!(
        without,
        CONVERSATION_PROMPT.trim_end_matches("<|im_start|>assistant\n")
    );
}

#[test]
fn a_continuation_ends_with_the_final_messages_text() {
    let p = Preprocessor::builtin();
    let messages = vec![
        json!({"role": "user", "content": "Say hello"}),
        json!({"role": "assistant", "content": "Hello, wor"}),
    ];
    let prompt = p.render_continuation(&messages).unwrap();
    assert_eq!(
        prompt,
        "<|im_start|>user\nSay hello<|im_end|>\n<|im_start|>assistant\nHello, wor"
    );
    // The same tokens as the prompt's continuation input, and a prefix of the full render.
    let ids = p
        .prompt_tokens(&PromptInput::Continue(messages.clone()))
        .unwrap();
    assert_eq!(ids, p.encode(&prompt).unwrap());
    assert!(p
        .render_chat(&messages, false)
        .unwrap()
        .starts_with(&prompt));
    // Text parts count as text; other content cannot be continued.
    let parts = vec![
        json!({"role": "user", "content": "Say hello"}),
        json!({"role": "assistant", "content": [{"type": "text", "text": "Hello, wor"}]}),
    ];
    assert_eq!(p.render_continuation(&parts).unwrap(), prompt);
    let image = vec![json!({"role": "assistant", "content": [{"type": "image_url"}]})];
    assert!(matches!(
        p.render_continuation(&image),
        Err(PreprocessError::Invalid(_))
    ));
    // Approximate mode cuts the same way.
    let a = Preprocessor::approximate();
    let approx = a.render_continuation(&messages).unwrap();
    assert!(approx.ends_with("Hello, wor"), "{approx}");
}

#[test]
fn builtin_encode_decode_round_trip() {
    let p = Preprocessor::builtin();
    for text in [
        CONVERSATION_PROMPT,
        "plain ascii text with the router and the workers",
        "unicode: héllo wörld — 日本語 🦀\ttabs\r\nand CRLF  double  spaces ",
        "",
    ] {
        let ids = p.encode(text).unwrap();
        assert_eq!(p.decode(&ids).unwrap(), text);
        assert_eq!(p.encode(text).unwrap(), ids, "encode is deterministic");
        assert!(ids.iter().all(|&id| (id as usize) < p.vocab_size()));
    }
    // The BPE actually merges: common English text takes fewer tokens than bytes.
    let text = "the router routes requests to the worker with the best cache overlap";
    assert!(p.encode(text).unwrap().len() * 2 < text.len());
    // Unknown ids are skipped by decode.
    assert_eq!(p.decode(&[u32::MAX]).unwrap(), "");
}

#[test]
fn special_tokens_are_single_ids() {
    let p = Preprocessor::builtin();
    for (token, id) in [("<|endoftext|>", 0), ("<|im_start|>", 1), ("<|im_end|>", 2)] {
        assert_eq!(p.encode(token).unwrap(), vec![id]);
    }
    let ids = p.encode(CONVERSATION_PROMPT).unwrap();
    assert_eq!(ids[0], 1);
    assert_eq!(ids.iter().filter(|&&id| id == 1).count(), 3);
    assert_eq!(ids.iter().filter(|&&id| id == 2).count(), 2);
}

#[test]
fn follow_up_turn_shares_the_prefix() {
    let p = Preprocessor::builtin();
    let turn1 = conversation();
    let mut turn2 = turn1.clone();
    turn2.push(
        json!({"role": "assistant", "content": "It scores the KV cache overlap of each worker."}),
    );
    turn2.push(json!({"role": "user", "content": "And when two workers tie?"}));

    let turn1_messages = p.render_chat(&turn1, false).unwrap();
    let turn1_prompt = p.render_chat(&turn1, true).unwrap();
    let turn2_prompt = p.render_chat(&turn2, true).unwrap();
    // Text: turn 2 extends both turn 1's messages and, with ChatML, even
    // turn 1's generation prompt ("<|im_start|>assistant\n").
    assert!(turn2_prompt.starts_with(&turn1_messages));
    assert!(turn2_prompt.starts_with(&turn1_prompt));

    let ids1 = p.encode(&turn1_messages).unwrap();
    let ids1_prompt = p.encode(&turn1_prompt).unwrap();
    let ids2 = p.encode(&turn2_prompt).unwrap();
    // Special tokens and "\n" delimit the pre-tokenized words, so the ids
    // are an exact prefix here; KV caching needs at least almost all of them.
    assert!(common_prefix(&ids1, &ids2) + 2 >= ids1.len());
    assert_eq!(common_prefix(&ids1, &ids2), ids1.len());
    assert_eq!(common_prefix(&ids1_prompt, &ids2), ids1_prompt.len());
}

#[test]
fn content_as_text_parts() {
    let p = Preprocessor::builtin();
    let parts = [json!({"role": "user", "content": [
        {"type": "text", "text": "first"},
        {"type": "text", "text": "second"}
    ]})];
    assert_eq!(
        p.render_chat(&parts, false).unwrap(),
        "<|im_start|>user\nfirst\nsecond<|im_end|>\n"
    );
    // A single part is exactly the plain string.
    let one = [json!({"role": "user", "content": [{"type": "text", "text": "hi"}]})];
    let plain = [json!({"role": "user", "content": "hi"})];
    assert_eq!(
        p.render_chat(&one, true).unwrap(),
        p.render_chat(&plain, true).unwrap()
    );
    // Non-text parts are passed through as a list (a template may handle them).
    let image = [json!({"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x/y.png"}}
    ]})];
    assert!(p.render_chat(&image, false).is_ok());
}

#[test]
fn invalid_messages_are_rejected() {
    for p in [Preprocessor::builtin(), Preprocessor::approximate()] {
        for (messages, needle) in [
            (vec![], "non-empty"),
            (vec![json!("hello")], "messages[0] must be an object"),
            (
                vec![
                    json!({"role": "user", "content": "a"}),
                    json!({"content": "b"}),
                ],
                "messages[1] has no role",
            ),
            (
                vec![json!({"role": 7, "content": "a"})],
                "role must be a string",
            ),
        ] {
            let err = p.render_chat(&messages, true).unwrap_err();
            assert!(matches!(err, PreprocessError::Invalid(_)), "{err:?}");
            assert!(err.is_client_error());
            assert!(err.to_string().contains(needle), "{err} lacks {needle}");
        }
    }
}

#[test]
fn approximate_mode() {
    let p = Preprocessor::approximate();
    assert!(p.is_approximate());
    assert_eq!(p.vocab_size(), 0);
    assert_eq!(p.describe(), "approximate (4 bytes per pseudo token)");
    assert_eq!(p.eos_token_id(), None);
    assert_eq!(
        p.encode("abcde").unwrap(),
        vec![u32::from_le_bytes(*b"abcd"), 0x65]
    );
    assert_eq!(p.encode("abcde").unwrap(), vec![0x6463_6261, 0x0000_0065]);
    assert_eq!(p.encode("").unwrap(), Vec::<u32>::new());
    assert_eq!(p.encode("abcd").unwrap().len(), 1);

    let prompt = p.render_chat(&conversation(), true).unwrap();
    assert_eq!(
        prompt,
        "<|system|>\nYou are a helpful assistant.\n<|user|>\nHow does the router pick a worker?\n<|assistant|>\n"
    );
    assert_eq!(p.render_chat(&conversation(), true).unwrap(), prompt);
    let parts = [
        json!({"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}),
        json!({"role": "assistant", "content": null, "tool_calls": []}),
    ];
    assert_eq!(
        p.render_chat(&parts, false).unwrap(),
        "<|user|>\na\nb\n<|assistant|>\n\n"
    );
    let tools = [json!({"type": "function", "function": {"name": "f"}})];
    let with_tools = p
        .render_chat_with_tools(&conversation(), Some(&tools), true)
        .unwrap();
    assert!(with_tools.starts_with("<|tools|>\n[{"));
    assert!(with_tools.ends_with(&prompt));

    let err = p.decode(&[1, 2]).unwrap_err();
    assert!(matches!(err, PreprocessError::NotSupported(_)), "{err:?}");
}

#[test]
fn too_long_is_rejected_before_tokenizing() {
    for p in [Preprocessor::builtin(), Preprocessor::approximate()] {
        let p = p.with_max_input_bytes(8);
        assert_eq!(p.max_input_bytes(), 8);
        assert!(p.encode("12345678").is_ok());
        let err = p.encode("123456789").unwrap_err();
        assert!(
            matches!(err, PreprocessError::TooLong { limit: 8, got: 9 }),
            "{err:?}"
        );
        assert!(err.is_client_error());
    }
    // The cap is per handle: the shared builtin keeps the default.
    assert_eq!(
        Preprocessor::builtin().max_input_bytes(),
        DEFAULT_MAX_INPUT_BYTES
    );
}

#[test]
fn from_dir_loads_like_builtin() {
    let dir = TempDir::new("like-builtin");
    dir.write("tokenizer.json", BUILTIN_TOKENIZER);
    dir.write("tokenizer_config.json", BUILTIN_CONFIG);
    let p = Preprocessor::from_dir(dir.path()).unwrap();
    assert_eq!(
        p.describe(),
        format!("tokenizer at {} (vocab 2048)", dir.path().display())
    );
    assert_eq!(
        p.render_chat(&conversation(), true).unwrap(),
        CONVERSATION_PROMPT
    );
    let builtin = Preprocessor::builtin();
    assert_eq!(
        p.encode(CONVERSATION_PROMPT).unwrap(),
        builtin.encode(CONVERSATION_PROMPT).unwrap()
    );
}

#[test]
fn from_dir_missing_files_name_the_path() {
    let dir = TempDir::new("missing");
    let err = Preprocessor::from_dir(dir.path()).unwrap_err();
    assert!(matches!(err, PreprocessError::Io { .. }), "{err:?}");
    let tokenizer_path = dir.path().join("tokenizer.json");
    assert!(
        err.to_string()
            .contains(&tokenizer_path.display().to_string()),
        "{err}"
    );

    dir.write("tokenizer.json", BUILTIN_TOKENIZER);
    let err = Preprocessor::from_dir(dir.path()).unwrap_err();
    let config_path = dir.path().join("tokenizer_config.json");
    assert!(
        err.to_string().contains(&config_path.display().to_string()),
        "{err}"
    );
    assert!(!err.is_client_error());
}

#[test]
fn from_dir_invalid_files() {
    let dir = TempDir::new("invalid");
    dir.write("tokenizer.json", b"{ not json");
    dir.write("tokenizer_config.json", BUILTIN_CONFIG);
    let err = Preprocessor::from_dir(dir.path()).unwrap_err();
    assert!(matches!(err, PreprocessError::TokenizerFile(_)), "{err:?}");
    assert!(err.to_string().contains("tokenizer.json"), "{err}");

    dir.write("tokenizer.json", BUILTIN_TOKENIZER);
    dir.write("tokenizer_config.json", b"{\"chat_template\": ");
    let err = Preprocessor::from_dir(dir.path()).unwrap_err();
    assert!(matches!(err, PreprocessError::Config(_)), "{err:?}");
    assert!(err.to_string().contains("tokenizer_config.json"), "{err}");

    for bad in [
        json!([1, 2]),
        json!({"chat_template": 5}),
        json!({"chat_template": [{"name": "default"}]}),
        json!({"eos_token": 5, "chat_template": "x"}),
        json!({"bos_token": {"text": "<s>"}, "chat_template": "x"}),
        json!({"chat_template": "{% for %}"}),
    ] {
        dir.write("tokenizer_config.json", bad.to_string().as_bytes());
        let err = Preprocessor::from_dir(dir.path()).unwrap_err();
        assert!(matches!(err, PreprocessError::Config(_)), "{bad}: {err:?}");
    }
}

#[test]
fn from_dir_chat_template_list_and_special_token_objects() {
    let dir = dir_with_config(
        "list",
        &json!({
            "bos_token": {"content": "<s>", "lstrip": false},
            "eos_token": {"content": "<|im_end|>"},
            "chat_template": [
                {"name": "tool_use", "template": "TOOLS"},
                {"name": "default", "template": "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}{{ eos_token }}{% endfor %}"}
            ]
        }),
    );
    let p = Preprocessor::from_dir(dir.path()).unwrap();
    assert_eq!(p.eos_token_id(), Some(2));
    assert_eq!(
        p.render_chat(&conversation(), true).unwrap(),
        "<s>[system]You are a helpful assistant.<|im_end|>[user]How does the router pick a worker?<|im_end|>"
    );
}

#[test]
fn from_dir_without_chat_template() {
    let dir = dir_with_config("no-template", &json!({"eos_token": "<|im_end|>"}));
    let p = Preprocessor::from_dir(dir.path()).unwrap();
    assert!(p.describe().ends_with(", no chat template"));
    assert!(!p.encode("hello world").unwrap().is_empty());
    let err = p.render_chat(&conversation(), true).unwrap_err();
    assert!(matches!(err, PreprocessError::Config(_)), "{err:?}");
    assert!(err.to_string().contains("no chat_template"), "{err}");

    // A list without "default" is reported the same way.
    let dir = dir_with_config(
        "no-default",
        &json!({"chat_template": [{"name": "rag", "template": "x"}]}),
    );
    let err = Preprocessor::from_dir(dir.path())
        .unwrap()
        .render_chat(&conversation(), true)
        .unwrap_err();
    assert!(err.to_string().contains("none named \"default\""), "{err}");
}

#[test]
fn from_dir_stand_alone_template_files() {
    let dir = dir_with_config("jinja-file", &json!({}));
    dir.write(
        "chat_template.jinja",
        b"{% for m in messages %}{{ m.content }}|{% endfor %}",
    );
    let p = Preprocessor::from_dir(dir.path()).unwrap();
    assert_eq!(
        p.render_chat(&conversation(), false).unwrap(),
        "You are a helpful assistant.|How does the router pick a worker?|"
    );

    let dir = dir_with_config("json-file", &json!({"chat_template": null}));
    dir.write(
        "chat_template.json",
        br#"{"chat_template": "{{ messages | length }}"}"#,
    );
    let p = Preprocessor::from_dir(dir.path()).unwrap();
    assert_eq!(p.render_chat(&conversation(), false).unwrap(), "2");
}

/// A Preprocessor over the builtin tokenizer with a custom template.
fn with_template(name: &str, template: &str) -> (TempDir, Preprocessor) {
    let dir = dir_with_config(
        name,
        &json!({"chat_template": template, "eos_token": "</s>"}),
    );
    let p = Preprocessor::from_dir(dir.path()).unwrap();
    (dir, p)
}

#[test]
fn raise_exception_becomes_a_template_error() {
    let (_dir, p) = with_template(
        "raise",
        "{% for m in messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}\
{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}\
{% endif %}{{ m['content'] }}{% endfor %}",
    );
    let ok = [json!({"role": "user", "content": "hi"})];
    assert_eq!(p.render_chat(&ok, true).unwrap(), "hi");
    let err = p.render_chat(&conversation(), true).unwrap_err();
    assert!(matches!(err, PreprocessError::Template(_)), "{err:?}");
    assert!(err.is_client_error());
    assert!(
        err.to_string()
            .contains("Conversation roles must alternate user/assistant/user/assistant/..."),
        "{err}"
    );
}

#[test]
fn hugging_face_template_features() {
    // Python string methods (pycompat), trim/lstrip blocks, strftime_now,
    // undefined bos_token, tools, loop variables, tojson without HTML escaping.
    let template = "{{ bos_token }}{% if tools is not none %}TOOLS{% endif %}\n\
{% for message in messages %}\n\
    {% if message.content is string and message.content.strip().startswith('How') %}\n\
Q{{ loop.index }}: {{ message.content.strip() | upper }}\n\
    {% else %}\n\
{{ message['role'] }}: {{ message | tojson(sort_keys=true) }}\n\
    {% endif %}\n\
{% endfor %}\n\
{% if add_generation_prompt %}Date: {{ strftime_now('%d %b %Y') }}{{ eos_token }}{% endif %}";
    let (_dir, p) = with_template("hf", template);
    let messages = [
        json!({"role": "system", "content": "<be> & 'nice'"}),
        json!({"role": "user", "content": "  How now?  "}),
    ];
    assert_eq!(
        p.render_chat(&messages, true).unwrap(),
        "system: {\"content\": \"<be> & 'nice'\", \"role\": \"system\"}\n\
Q2: HOW NOW?\n\
Date: 01 Jan 2026</s>"
    );
    let tools = [json!({"type": "function"})];
    assert!(p
        .render_chat_with_tools(&messages, Some(&tools), false)
        .unwrap()
        .starts_with("TOOLS"));
}

#[test]
fn loop_controls_and_adjacent_items() {
    let (_dir, p) = with_template(
        "loops",
        "{% for m in messages %}{% if loop.previtem is defined %}+{% endif %}\
{{ m.role }}{% if m.role == 'user' %}{% break %}{% endif %}{% endfor %}",
    );
    let mut messages = conversation();
    messages.push(json!({"role": "assistant", "content": "x"}));
    assert_eq!(p.render_chat(&messages, false).unwrap(), "system+user");
}

#[test]
fn template_runtime_errors_are_template_errors() {
    let (_dir, p) = with_template("runtime", "{{ messages[0].content.nope() }}");
    let err = p.render_chat(&conversation(), true).unwrap_err();
    assert!(matches!(err, PreprocessError::Template(_)), "{err:?}");
}

mod piecewise {
    use crate::Preprocessor;
    use proptest::prelude::*;

    /// The shipped tokenizer's own encoding, without piecewise tokenizing.
    fn plain(text: &str) -> Vec<u32> {
        static PLAIN: std::sync::LazyLock<tokenizers::Tokenizer> = std::sync::LazyLock::new(|| {
            tokenizers::Tokenizer::from_bytes(include_bytes!("../assets/tokenizer/tokenizer.json"))
                .unwrap()
        });
        PLAIN.encode_fast(text, false).unwrap().get_ids().to_vec()
    }

    #[test]
    fn the_builtin_tokenizer_is_tokenized_piecewise() {
        assert!(Preprocessor::builtin().is_piecewise());
        assert!(!Preprocessor::approximate().is_piecewise());
    }

    #[test]
    fn the_builtin_tokenizer_has_the_fast_encoder() {
        assert!(Preprocessor::builtin().is_fast());
        assert!(!Preprocessor::approximate().is_fast());
    }

    /// Truncation and padding in `tokenizer.json` apply to neither encoder: routing needs
    /// every token.
    #[test]
    fn truncation_in_the_file_is_ignored_by_both_encoders() {
        let mut json: serde_json::Value =
            serde_json::from_slice(include_bytes!("../assets/tokenizer/tokenizer.json")).unwrap();
        json["truncation"] = serde_json::json!({"direction": "Right", "max_length": 8,
            "strategy": "LongestFirst", "stride": 0});
        json["padding"] = serde_json::json!({"strategy": {"Fixed": 64}, "direction": "Right",
            "pad_to_multiple_of": null, "pad_id": 0, "pad_type_id": 0, "pad_token": "<|endoftext|>"});
        let dir = super::TempDir::new("truncation");
        dir.write("tokenizer.json", json.to_string().as_bytes());
        dir.write("tokenizer_config.json", b"{}");
        let pre = Preprocessor::from_dir(dir.path()).unwrap();
        assert!(pre.is_fast());
        let text = "a sentence long enough to pass eight tokens by a good margin, twice over";
        let ids = pre.encode(text).unwrap();
        assert_eq!(ids, plain(text));
        assert!(ids.len() > 8 && ids.len() < 64, "{} ids", ids.len());
    }

    /// A tokenizer the fast encoder cannot load (a word-level model) is encoded by the
    /// tokenizers crate, with the same ids as its own.
    #[test]
    fn a_model_the_fast_encoder_lacks_falls_back() {
        let json = serde_json::json!({
            "version": "1.0",
            "added_tokens": [{"id": 0, "content": "<s>", "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": true}],
            "normalizer": null,
            "pre_tokenizer": {"type": "Whitespace"},
            "post_processor": null,
            "decoder": null,
            "model": {"type": "WordLevel", "vocab": {"<s>": 0, "[UNK]": 1, "hello": 2, "world": 3},
                "unk_token": "[UNK]"}
        });
        let dir = super::TempDir::new("wordlevel");
        dir.write("tokenizer.json", json.to_string().as_bytes());
        dir.write("tokenizer_config.json", b"{}");
        let pre = Preprocessor::from_dir(dir.path()).unwrap();
        assert!(!pre.is_fast());
        let own = tokenizers::Tokenizer::from_bytes(json.to_string().as_bytes()).unwrap();
        for text in ["hello world", "<s>hello there<s> world", ""] {
            let want = own.encode_fast(text, false).unwrap().get_ids().to_vec();
            assert_eq!(pre.encode(text).unwrap(), want, "{text:?}");
        }
        assert_eq!(pre.encode("hello world").unwrap(), vec![2, 3]);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        #[test]
        fn piecewise_ids_equal_the_tokenizers_own(
            parts in proptest::collection::vec(
                prop_oneof![
                    Just("<|im_start|>".to_string()),
                    Just("<|im_end|>".to_string()),
                    Just("<|endoftext|>".to_string()),
                    Just("<|im_start".to_string()),
                    "[ a-zé\n.,!<|>]{0,24}",
                ],
                0..12,
            ),
            twice in any::<bool>(),
        ) {
            let text: String = parts.concat();
            let pre = Preprocessor::builtin();
            let want = plain(&text);
            prop_assert_eq!(pre.encode(&text).unwrap(), want.clone());
            if twice {
                // From the cache this time.
                prop_assert_eq!(pre.encode(&text).unwrap(), want);
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(500))]
        /// Any text, new to the cache: the fast encoder's ids are the tokenizer's.
        #[test]
        fn fast_ids_equal_the_tokenizers_own(
            text in prop_oneof![
                any::<String>(),
                "\\PC{0,80}",
                "[ \t\n\r0-9a-zA-Z'.,;:!?()\\-]{0,120}",
            ],
        ) {
            let pre = Preprocessor::builtin();
            prop_assert_eq!(pre.encode(&text).unwrap(), plain(&text));
        }
    }

    #[test]
    fn a_follow_up_turn_reuses_the_history() {
        let pre = Preprocessor::builtin();
        let history = "The history of a long conversation. ".repeat(50);
        let turn1 = format!("<|im_start|>user\n{history}<|im_end|>\n<|im_start|>assistant\n");
        let turn2 = format!("{turn1}ok<|im_end|>\n<|im_start|>user\nmore<|im_end|>\n");
        assert_eq!(pre.encode(&turn1).unwrap(), plain(&turn1));
        assert_eq!(pre.encode(&turn2).unwrap(), plain(&turn2));
    }
}

#[test]
fn pooled_tokenizing_gives_the_same_ids_and_refuses_when_the_pool_is_full() {
    use std::sync::mpsc;
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let pool = TokenizePool::new(1, 1).unwrap();
    let pre = Preprocessor::builtin().with_pool(pool.clone());
    let chat = PromptInput::Messages(conversation());
    let want = pre.prompt_tokens(&chat).unwrap();
    assert_eq!(
        rt.block_on(pre.prompt_tokens_pooled(chat.clone())).unwrap(),
        want
    );
    let text = "Hello there, a plain completion prompt.";
    assert_eq!(
        rt.block_on(pre.encode_pooled(text.into())).unwrap(),
        pre.encode(text).unwrap()
    );

    // The only slot is taken: a chat prompt is refused at once, with a 503 to retry.
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let (started_tx, started_rx) = mpsc::channel::<()>();
    let holder = pool.clone();
    let blocker = std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(holder.run(move || {
                let _ = started_tx.send(());
                let _ = release_rx.recv();
                Ok(())
            }))
    });
    started_rx
        .recv_timeout(std::time::Duration::from_secs(10))
        .unwrap();
    let busy = rt.block_on(pre.prompt_tokens_pooled(chat.clone()));
    let Err(e @ PreprocessError::Busy { queue: 1 }) = busy else {
        panic!("expected Busy, got {busy:?}");
    };
    let api = e.to_api_error();
    assert_eq!(api.status(), 503);
    assert_eq!(api.retry_after_secs, Some(1));
    // Token ids and approximate mode need no tokenizer, so no pool.
    assert_eq!(
        rt.block_on(pre.prompt_tokens_pooled(PromptInput::Tokens(vec![5, 6])))
            .unwrap(),
        vec![5, 6]
    );
    let approx = Preprocessor::approximate().with_pool(pool.clone());
    assert!(rt
        .block_on(approx.prompt_tokens_pooled(chat.clone()))
        .is_ok());

    release_tx.send(()).unwrap();
    blocker.join().unwrap().unwrap();
    assert_eq!(rt.block_on(pre.prompt_tokens_pooled(chat)).unwrap(), want);
}
