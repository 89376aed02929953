//! Tests of the output table: the builtin tokenizer's answers round-trip; other tokenizers
//! degrade with a reason.

use super::*;
use std::path::PathBuf;

/// A tokenizer directory under the system's temporary directory, removed on drop.
struct Dir(PathBuf);

impl Dir {
    fn new(name: &str, tokenizer: &str, config: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("kvroute-text-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("tokenizer.json"), tokenizer).unwrap();
        std::fs::write(dir.join("tokenizer_config.json"), config).unwrap();
        Self(dir)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

const BUILTIN_JSON: &str = include_str!("../../../preprocess/assets/tokenizer/tokenizer.json");

/// The builtin tokenizer's config with `template` as its chat template.
fn config_with(template: &str) -> String {
    serde_json::json!({"eos_token": "<|im_end|>", "chat_template": template}).to_string()
}

#[test]
fn pieces_are_printable_and_deterministic() {
    let t = OutputText::build(&Preprocessor::builtin());
    assert!(t.len() > 10, "{}", t.len());
    for tok in 0..2000u32 {
        let p = t.piece(tok);
        assert!(usable(p), "{p:?}");
    }
    assert_eq!(t.text(&[5, 6, 7]), t.text(&[5, 6, 7]));
    assert!(!usable("<|im_end|>") && !usable("\u{FFFD}") && !usable("") && !usable("\n"));
    assert!(usable(" hello") && usable("<"));
    // The builtin tokenizer has enough whole-word pieces: only those (and punctuation)
    // are printed, so the text reads as words.
    assert!(t.len() >= MIN_WORDS);
    for tok in 0..2000u32 {
        assert!(word_like(t.piece(tok)), "{:?}", t.piece(tok));
    }
    assert!(word_like(" cache") && word_like(".") && !word_like("ing") && !word_like(" 42"));
    assert!(word(" cache") && !word(".") && !word(" ") && !word("cache"));
}

#[test]
fn the_builtin_tokenizers_answers_tokenize_back_to_their_ids() {
    let pre = Preprocessor::builtin();
    let t = OutputText::build(&pre);
    assert_eq!(t.round_trip(), &RoundTrip::Exact);
    let ids = t.output_ids().expect("a table");
    assert!(ids.len() >= MIN_WORDS, "{}", ids.len());
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "ascending");
    for &id in ids.iter() {
        assert_eq!(t.piece(id), pre.decode(&[id]).unwrap());
        assert!(word(t.piece(id)), "{:?}", t.piece(id));
        assert_eq!(pre.encode(t.piece(id)).unwrap(), [id]);
    }
    // Answers as an engine samples them (another hash than the build's), joined, then in
    // a conversation's history between the template's markup.
    for seed in 0..4u64 {
        let answer: Vec<u32> = (0..500u64)
            .map(|k| ids[(splitmix64(seed << 32 | k) % ids.len() as u64) as usize])
            .collect();
        let text = t.text(&answer);
        assert_eq!(pre.encode(&text).unwrap(), answer, "{text}");
        let turn2 = [
            serde_json::json!({"role": "system", "content": "Be brief."}),
            serde_json::json!({"role": "user", "content": "Hello!"}),
            serde_json::json!({"role": "assistant", "content": text}),
            serde_json::json!({"role": "user", "content": "Tell me more."}),
        ];
        let turn1 = pre
            .encode(&pre.render_chat(&turn2[..2], true).unwrap())
            .unwrap();
        let prompt = pre.encode(&pre.render_chat(&turn2, true).unwrap()).unwrap();
        // Turn 2's prompt starts with turn 1's prompt then the answer's ids, as cached.
        assert_eq!(&prompt[..turn1.len()], &turn1[..]);
        assert_eq!(
            &prompt[turn1.len()..turn1.len() + answer.len()],
            &answer[..]
        );
    }
}

#[test]
fn no_tokenizer_no_table_and_the_old_pieces() {
    let t = OutputText::build(&Preprocessor::approximate());
    assert!(matches!(t.round_trip(), RoundTrip::Off(_)));
    assert_eq!(t.output_ids(), None);
    assert_eq!(t.text(&[0, 1]), " the a");
}

#[test]
fn a_template_that_trims_the_answer_keeps_the_table_and_says_so() {
    let template = "{% for message in messages %}<|im_start|>{{ message['role'] }}\n\
                    {{ message['content'] | trim }}<|im_end|>\n{% endfor %}\
                    {% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
    let dir = Dir::new("trim", BUILTIN_JSON, &config_with(template));
    let t = OutputText::build(&Preprocessor::from_dir(&dir.0).unwrap());
    assert!(t.output_ids().is_some());
    let RoundTrip::NotInTemplate(why) = t.round_trip() else {
        panic!("{:?}", t.round_trip());
    };
    assert!(why.contains("first token"), "{why}");
}

#[test]
fn a_tokenizer_without_word_pieces_has_no_table() {
    // Word-level, split on whitespace: pieces decode without their space.
    let vocab: serde_json::Map<String, serde_json::Value> = ["[UNK]", "cache", "block", "route"]
        .iter()
        .enumerate()
        .map(|(i, w)| (w.to_string(), i.into()))
        .collect();
    let json = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": null, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null,
        "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"},
    });
    let dir = Dir::new("words", &json.to_string(), &config_with("{{ messages }}"));
    let t = OutputText::build(&Preprocessor::from_dir(&dir.0).unwrap());
    let RoundTrip::Off(why) = t.round_trip() else {
        panic!("{:?}", t.round_trip());
    };
    assert!(why.contains("0 of 0 word pieces"), "{why}");
    assert_eq!(t.output_ids(), None);
    assert!(!t.text(&[1, 2, 3]).is_empty());
}

#[test]
fn pieces_that_merge_beside_others_are_dropped() {
    // Character-level BPE without a pre-tokenizer: a text is one word, so ` xa` then ` xb`
    // merges into ` xa xb`, one token, while every piece tokenizes to itself alone.
    let letters: Vec<char> = ('a'..='z').chain('A'..='Z').chain('α'..='ω').collect();
    let mut vocab = serde_json::Map::new();
    let mut merges = vec![serde_json::json!([" ", "x"])];
    for c in [' ', 'x'].into_iter().chain(letters.iter().copied()) {
        let n = vocab.len();
        vocab.insert(c.to_string(), n.into());
    }
    vocab.insert(" x".into(), vocab.len().into());
    for c in &letters {
        vocab.insert(format!(" x{c}"), vocab.len().into());
        merges.push(serde_json::json!([" x", c.to_string()]));
    }
    vocab.insert(" xa xb".into(), vocab.len().into());
    merges.push(serde_json::json!([" xa", " xb"]));
    let json = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": null, "pre_tokenizer": null, "post_processor": null, "decoder": null,
        "model": {"type": "BPE", "vocab": vocab, "merges": merges, "dropout": null,
                  "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false},
    });
    let dir = Dir::new("merge", &json.to_string(), &config_with("{{ messages }}"));
    let pre = Preprocessor::from_dir(&dir.0).unwrap();
    let id = |s: &str| vocab[s].as_u64().unwrap() as u32;
    assert_eq!(
        pre.encode(" xa xb").unwrap(),
        [id(" xa xb")],
        "the merge is there"
    );
    let t = OutputText::build(&pre);
    let ids = t.output_ids().expect("a table");
    assert!(
        !ids.contains(&id(" xa")) && !ids.contains(&id(" xb")),
        "{ids:?}"
    );
    assert!(ids.contains(&id(" xc")) && ids.contains(&id(" xω")));
    let all: Vec<u32> = ids.iter().chain(ids.iter().rev()).copied().collect();
    assert_eq!(pre.encode(&t.text(&all)).unwrap(), all);
}
