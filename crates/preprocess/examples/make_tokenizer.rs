//! Generates the small tokenizer shipped with `kvroute-preprocess`.
//!
//! It trains a byte-level BPE (GPT-2 style pre-tokenizer, no prefix space,
//! vocabulary of [`VOCAB_SIZE`] tokens including the 256-symbol byte-level
//! alphabet and three special tokens) on the repository's own Markdown
//! documentation (`README.md`, `ARCHITECTURE.md`, `docs/*.md`), and writes
//! `tokenizer.json` and `tokenizer_config.json` (with a ChatML chat template).
//!
//! Regenerate the shipped files from the workspace root with:
//!
//! ```text
//! cargo run -p kvroute-preprocess --example make_tokenizer
//! ```
//!
//! Optional arguments: `make_tokenizer [WORKSPACE_ROOT [OUTPUT_DIR]]`. The
//! workspace root defaults to `CARGO_MANIFEST_DIR/../..` and the output
//! directory to `crates/preprocess/assets/tokenizer` under it. Training is
//! deterministic for a given set of documents, so rerunning it without doc
//! changes reproduces the same files; after doc changes the ids shift, which
//! is fine because the gateway and the workers embed the same files.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use serde::Serialize;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{
    AddedToken, DecoderWrapper, Error, NormalizerWrapper, PostProcessorWrapper,
    PreTokenizerWrapper, Tokenizer, TokenizerBuilder,
};

/// Total vocabulary size, special tokens and byte alphabet included.
const VOCAB_SIZE: usize = 2048;
/// Special tokens, in id order (they get ids 0, 1, 2).
const SPECIAL_TOKENS: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];
/// The ChatML chat template stored in `tokenizer_config.json`.
const CHAT_TEMPLATE: &str = "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

/// `tokenizer_config.json`, as a struct so the key order is fixed.
#[derive(Serialize)]
struct TokenizerConfig {
    tokenizer_class: &'static str,
    add_prefix_space: bool,
    bos_token: Option<&'static str>,
    eos_token: &'static str,
    pad_token: &'static str,
    unk_token: Option<&'static str>,
    clean_up_tokenization_spaces: bool,
    model_max_length: u64,
    chat_template: &'static str,
}

fn main() -> Result<(), Error> {
    let mut args = std::env::args_os().skip(1);
    let root = match args.next() {
        Some(root) => PathBuf::from(root),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."),
    };
    let root = root
        .canonicalize()
        .map_err(|e| format!("{}: {e}", root.display()))?;
    let out_dir = match args.next() {
        Some(dir) => PathBuf::from(dir),
        None => root.join("crates/preprocess/assets/tokenizer"),
    };

    let corpus = read_corpus(&root)?;
    let total_bytes: usize = corpus.iter().map(|(_, text)| text.len()).sum();
    eprintln!(
        "training on {} files ({total_bytes} bytes) from {}",
        corpus.len(),
        root.display()
    );

    let alphabet: HashSet<char> = ByteLevel::alphabet().into_iter().collect();
    let mut trainer = BpeTrainerBuilder::new()
        .show_progress(false)
        .vocab_size(VOCAB_SIZE)
        .min_frequency(2)
        .initial_alphabet(alphabet)
        .special_tokens(
            SPECIAL_TOKENS
                .iter()
                .map(|t| AddedToken::from(*t, true))
                .collect(),
        )
        .build();

    let byte_level = ByteLevel::new(false, false, true);
    let mut tokenizer = TokenizerBuilder::<
        BPE,
        NormalizerWrapper,
        PreTokenizerWrapper,
        PostProcessorWrapper,
        DecoderWrapper,
    >::new()
    .with_model(BPE::default())
    .with_normalizer(None)
    .with_pre_tokenizer(Some(byte_level.into()))
    .with_post_processor(Some(ByteLevel::new(false, false, false).into()))
    .with_decoder(Some(ByteLevelDecoder::default().into()))
    .build()?;
    // One sequence per line keeps the corpus order irrelevant to the result.
    let lines = corpus
        .iter()
        .flat_map(|(_, text)| text.lines())
        .filter(|line| !line.trim().is_empty());
    tokenizer.train(&mut trainer, lines)?;

    let json = compact_pairs(&tokenizer.to_string(true)?);
    // Check that the result loads as the generic tokenizer the library uses.
    let check: Tokenizer = json.parse()?;
    if check.to_string(false)? != tokenizer.to_string(false)? {
        return Err("compacted tokenizer.json does not round-trip".into());
    }
    let vocab = check.get_vocab_size(true);
    for special in SPECIAL_TOKENS {
        if check.token_to_id(special).is_none() {
            return Err(format!("special token {special} missing from the vocabulary").into());
        }
    }

    let config = TokenizerConfig {
        tokenizer_class: "PreTrainedTokenizerFast",
        add_prefix_space: false,
        bos_token: None,
        eos_token: "<|im_end|>",
        pad_token: "<|endoftext|>",
        unk_token: None,
        clean_up_tokenization_spaces: false,
        model_max_length: 32768,
        chat_template: CHAT_TEMPLATE,
    };
    let mut config_json = serde_json::to_string_pretty(&config)?;
    config_json.push('\n');

    std::fs::create_dir_all(&out_dir)?;
    let tokenizer_path = out_dir.join("tokenizer.json");
    let config_path = out_dir.join("tokenizer_config.json");
    std::fs::write(&tokenizer_path, &json)?;
    std::fs::write(&config_path, &config_json)?;
    eprintln!(
        "wrote {} ({} bytes, vocab {vocab}) and {} ({} bytes)",
        tokenizer_path.display(),
        json.len(),
        config_path.display(),
        config_json.len()
    );
    Ok(())
}

/// Puts each two-string array (the BPE merges) of pretty-printed JSON on one
/// line: `["a", "b"]` instead of four lines. That halves the file and keeps
/// diffs readable. Only lines that are exactly `[` followed by two string
/// lines and a closing bracket are joined, so the JSON stays equivalent.
fn compact_pairs(json: &str) -> String {
    let lines: Vec<&str> = json.lines().collect();
    let mut out = String::with_capacity(json.len());
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        if line.trim() == "["
            && i + 3 < lines.len()
            && lines[i + 1].trim().starts_with('"')
            && lines[i + 1].trim().ends_with("\",")
            && lines[i + 2].trim().starts_with('"')
            && lines[i + 2].trim().ends_with('"')
            && matches!(lines[i + 3].trim(), "]" | "],")
        {
            let indent = &line[..line.len() - line.trim_start().len()];
            let first = lines[i + 1].trim().trim_end_matches(',');
            let second = lines[i + 2].trim();
            let close = lines[i + 3].trim();
            out.push_str(&format!("{indent}[{first}, {second}{close}\n"));
            i += 4;
        } else {
            out.push_str(line);
            out.push('\n');
            i += 1;
        }
    }
    out
}

/// Reads `README.md`, `ARCHITECTURE.md` and `docs/*.md` (sorted by name).
fn read_corpus(root: &Path) -> Result<Vec<(PathBuf, String)>, Error> {
    let mut paths = vec![root.join("README.md"), root.join("ARCHITECTURE.md")];
    let docs = root.join("docs");
    let mut doc_paths = Vec::new();
    for entry in std::fs::read_dir(&docs).map_err(|e| format!("{}: {e}", docs.display()))? {
        let path = entry?.path();
        if path.extension().is_some_and(|ext| ext == "md") {
            doc_paths.push(path);
        }
    }
    doc_paths.sort();
    paths.extend(doc_paths);
    paths
        .into_iter()
        .map(|path| {
            let text =
                std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            Ok((path, text))
        })
        .collect()
}
