//! Tokenizing a prompt piece by piece, with a cache of pieces.
//!
//! A tokenizer cuts the text at its added (special) tokens before anything else: the
//! pre-tokenizer and the model see each piece between two special tokens on its own. So the
//! ids of a rendered chat are the ids of its pieces with the special tokens' ids between
//! them, and a piece seen before (a conversation's history, a shared system prompt) need not
//! be tokenized again. This holds when the added tokens are matched on the raw text without
//! stripping neighbours (`normalized`, `lstrip`, `rstrip`, `single_word` all false) and the
//! pre-tokenizer treats every piece alike (not, e.g., a prefix space only on the first one).
//! [`PieceCoder::new`] checks both on probe texts against the tokenizer's own encoding and
//! turns the piecewise path off when anything differs.
//!
//! The cache is bounded in bytes: two generations, the older one dropped when the newer fills
//! half the budget.
//!
//! Text not in the cache is encoded by the `fastokens` crate when it loads the same
//! `tokenizer.json` and gives the `tokenizers` crate's ids on every probe text (special tokens
//! in all positions, words, numbers, punctuation, whitespace runs, accents, CJK, emoji):
//! about 40 times faster on the shipped tokenizer. Otherwise, or when it fails on a text, the
//! `tokenizers` crate encodes. For a text of 64 KiB or more `fastokens` spreads the work over
//! threads of its own (one per core, at most a few dozen; `FASTOKENS_BPE_THREADS` caps them).

use aho_corasick::{AhoCorasick, MatchKind};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use tokenizers::Tokenizer;

/// Bytes of cached pieces and ids kept at most, unless set otherwise
/// ([`PieceCoder::set_cache_bytes`]).
pub const CACHE_BYTES: usize = 64 << 20;

/// Pieces longer than this are tokenized every time (not worth the memory).
const MAX_CACHED_PIECE: usize = 1 << 20;

/// Splits at special tokens and caches the pieces' ids.
pub struct PieceCoder {
    splitter: Option<(AhoCorasick, Vec<u32>)>,
    cache: Mutex<Generations>,
    /// The fast encoder, when it agreed with the tokenizer on every probe.
    fast: Option<fastokens::Tokenizer>,
}

struct Generations {
    current: HashMap<Box<str>, Arc<[u32]>>,
    previous: HashMap<Box<str>, Arc<[u32]>>,
    current_bytes: usize,
    /// Bytes both generations may hold.
    limit: usize,
}

impl Default for Generations {
    fn default() -> Self {
        Self::with_limit(CACHE_BYTES)
    }
}

impl Generations {
    fn with_limit(limit: usize) -> Self {
        Self {
            current: HashMap::new(),
            previous: HashMap::new(),
            current_bytes: 0,
            limit,
        }
    }

    fn get(&mut self, piece: &str) -> Option<Arc<[u32]>> {
        if let Some(ids) = self.current.get(piece) {
            return Some(ids.clone());
        }
        let ids = self.previous.remove(piece)?;
        self.insert(piece, ids.clone());
        Some(ids)
    }

    fn insert(&mut self, piece: &str, ids: Arc<[u32]>) {
        let cost = piece.len() + ids.len() * 4 + 64;
        if cost > self.limit / 2 {
            return;
        }
        if self.current_bytes + cost > self.limit / 2 {
            self.previous = std::mem::take(&mut self.current);
            self.current_bytes = 0;
        }
        self.current_bytes += cost;
        self.current.insert(piece.into(), ids);
    }
}

/// Probe texts: special tokens at the start, middle and end, next to spaces and newlines.
fn probes(specials: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for s in specials.iter().take(8) {
        for (a, b) in [
            ("", "x"),
            ("hello", " world"),
            (" a ", " b "),
            ("line\n", "\nnext line"),
            ("é ü", "  two  spaces"),
            ("x", ""),
        ] {
            out.push(format!("{a}{s}{b}"));
            out.push(format!("{s}{a}{s}{b}{s}"));
        }
    }
    out
}

/// Texts without special tokens on which the fast encoder must agree with the tokenizer.
fn text_probes() -> Vec<String> {
    let mut out: Vec<String> = [
        "",
        " ",
        "   ",
        "\n",
        "\n\n\n",
        "\r\n",
        "\t",
        "Hello, world!",
        " leading space",
        "trailing space ",
        "two  spaces   and\ttabs\t\tand\n\nnewlines \n ",
        "don't I'm you'll we've they're it's she'd O'NEIL'S",
        "1 12 123 1234 12345 3.14159 -7 1e10 0x1F 2026-11-21 10:30",
        "x=1+2; y = f(x)*[3]/{4} <tag attr=\"v\"> #hash @at $dollar %pct ^caret &amp ~ `tick`",
        "MiXeD CaSe UPPER lower Title",
        "naïve café über façade coöperate résumé Ångström",
        "cafe\u{301} a\u{308} n\u{303} \u{1100}\u{1161} ﬁ ＡＢＣ１２３ Ⅻ ²³ µ Ω K",
        "日本語のテキスト 中文文本 한국어 텍스트",
        "emoji 🙂👍🏽 🇫🇷 ❤️ family 👨‍👩‍👧",
        "Привет мир Ελληνικά العربية עברית हिन्दी",
        "\u{0}\u{1f}\u{7f}\u{a0}\u{200b}\u{feff}",
        "supercalifragilisticexpialidocious antidisestablishmentarianism",
        "...!!!???---___***",
        "fn main() {\n    println!(\"{}\", 42);\n}\n",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    // Every printable ASCII character and a run of Latin-1 and general punctuation.
    out.push((' '..='~').collect());
    out.push(('\u{a1}'..='\u{17f}').collect());
    out.push(('\u{2010}'..='\u{205e}').collect());
    out
}

/// Loads `fastokens` from `json` and keeps it when it gives `tokenizer`'s ids on every probe.
fn fast_encoder(
    tokenizer: &Tokenizer,
    json: &[u8],
    specials: &[String],
) -> Option<fastokens::Tokenizer> {
    let mut value: serde_json::Value = serde_json::from_slice(json).ok()?;
    // Routing needs every token: no truncation or padding (as for the tokenizer itself).
    if let Some(fields) = value.as_object_mut() {
        fields.insert("truncation".into(), serde_json::Value::Null);
        fields.insert("padding".into(), serde_json::Value::Null);
    }
    let mut fast = fastokens::Tokenizer::from_json(value).ok()?;
    // The piece cache here does its job; the library's own caches stay off.
    fast.enable_segment_cache(0);
    let agrees = |text: &str| matches!((whole(tokenizer, text), fast.encode(text)), (Ok(a), Ok(b)) if a == b);
    let all_agree = text_probes()
        .iter()
        .chain(&probes(specials))
        .all(|p| agrees(p));
    all_agree.then_some(fast)
}

impl PieceCoder {
    /// A coder for `tokenizer`, loaded from `json`; piecewise only when it gives the
    /// tokenizer's own ids, with the fast encoder only when that agrees on every probe.
    pub fn new(tokenizer: &Tokenizer, json: &[u8]) -> Self {
        let added = tokenizer.get_added_tokens_decoder();
        let mut tokens: Vec<(u32, String)> = added
            .iter()
            .map(|(id, t)| (*id, t.content.clone()))
            .collect();
        tokens.sort();
        let specials: Vec<String> = tokens.iter().map(|(_, c)| c.clone()).collect();
        let mut coder = Self {
            splitter: None,
            cache: Mutex::new(Generations::default()),
            fast: fast_encoder(tokenizer, json, &specials),
        };
        if added.is_empty()
            || added
                .values()
                .any(|t| t.normalized || t.lstrip || t.rstrip || t.single_word)
        {
            return coder;
        }
        let Ok(ac) = AhoCorasick::builder()
            .match_kind(MatchKind::LeftmostLongest)
            .build(&specials)
        else {
            return coder;
        };
        coder.splitter = Some((ac, tokens.iter().map(|(id, _)| *id).collect()));
        let agrees = probes(&specials)
            .iter()
            .all(|p| whole(tokenizer, p).ok() == coder.encode(tokenizer, p).ok());
        if !agrees {
            coder.splitter = None;
        }
        // The probes' pieces are not worth keeping.
        *coder.cache.get_mut() = Generations::default();
        coder
    }

    /// Bounds the piece cache to `bytes` (0: no caching), emptying it.
    pub fn set_cache_bytes(&self, bytes: usize) {
        let mut cache = self.cache.lock();
        if cache.limit != bytes {
            *cache = Generations::with_limit(bytes);
        }
    }

    /// Whether prompts are tokenized piece by piece.
    pub fn is_piecewise(&self) -> bool {
        self.splitter.is_some()
    }

    /// Whether new text goes to the fast encoder.
    pub fn is_fast(&self) -> bool {
        self.fast.is_some()
    }

    /// The ids of `text`.
    pub fn encode(&self, tokenizer: &Tokenizer, text: &str) -> Result<Vec<u32>, String> {
        let Some((ac, ids)) = &self.splitter else {
            return self.whole(tokenizer, text);
        };
        let mut out = Vec::new();
        let mut last = 0;
        for m in ac.find_iter(text) {
            self.piece(tokenizer, &text[last..m.start()], &mut out)?;
            out.push(ids[m.pattern().as_usize()]);
            last = m.end();
        }
        self.piece(tokenizer, &text[last..], &mut out)?;
        Ok(out)
    }

    fn piece(&self, tokenizer: &Tokenizer, piece: &str, out: &mut Vec<u32>) -> Result<(), String> {
        if piece.is_empty() {
            return Ok(());
        }
        if piece.len() > MAX_CACHED_PIECE {
            out.extend(self.whole(tokenizer, piece)?);
            return Ok(());
        }
        let hit = self.cache.lock().get(piece);
        let ids = match hit {
            Some(ids) => ids,
            None => {
                let ids: Arc<[u32]> = self.whole(tokenizer, piece)?.into();
                self.cache.lock().insert(piece, ids.clone());
                ids
            }
        };
        out.extend_from_slice(&ids);
        Ok(())
    }

    /// The ids of `text` in one go: the fast encoder's, or the tokenizer's when there is
    /// none or it fails.
    fn whole(&self, tokenizer: &Tokenizer, text: &str) -> Result<Vec<u32>, String> {
        if let Some(Ok(ids)) = self.fast.as_ref().map(|f| f.encode(text)) {
            return Ok(ids);
        }
        whole(tokenizer, text)
    }
}

fn whole(tokenizer: &Tokenizer, text: &str) -> Result<Vec<u32>, String> {
    tokenizer
        .encode_fast(text, false)
        .map(|e| e.get_ids().to_vec())
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(n: u32) -> Arc<[u32]> {
        (0..n).collect::<Vec<_>>().into()
    }

    #[test]
    fn the_piece_cache_stays_within_its_bytes() {
        // Each piece costs 10 + 4 * 10 + 64 = 114 bytes; 1,000 bytes keep two generations of
        // at most 500.
        let mut g = Generations::with_limit(1_000);
        for i in 0..100 {
            g.insert(&format!("piece {i:04}"), ids(10));
        }
        let held = g.current.len() + g.previous.len();
        assert!((4..=8).contains(&held), "{held} pieces held");
        assert!(g.get("piece 0099").is_some() && g.get("piece 0000").is_none());
        let mut none = Generations::with_limit(0);
        none.insert("x", ids(1));
        assert!(none.get("x").is_none());
    }
}
