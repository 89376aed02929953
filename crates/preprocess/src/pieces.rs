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

use aho_corasick::{AhoCorasick, MatchKind};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokenizers::Tokenizer;

/// Bytes of cached pieces and ids kept at most.
pub const CACHE_BYTES: usize = 64 << 20;

/// Pieces longer than this are tokenized every time (not worth the memory).
const MAX_CACHED_PIECE: usize = 1 << 20;

/// Splits at special tokens and caches the pieces' ids.
pub struct PieceCoder {
    splitter: Option<(AhoCorasick, Vec<u32>)>,
    cache: Mutex<Generations>,
}

#[derive(Default)]
struct Generations {
    current: HashMap<Box<str>, Arc<[u32]>>,
    previous: HashMap<Box<str>, Arc<[u32]>>,
    current_bytes: usize,
}

impl Generations {
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
        if self.current_bytes + cost > CACHE_BYTES / 2 {
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

impl PieceCoder {
    /// A coder for `tokenizer`; piecewise only when it gives the tokenizer's own ids.
    pub fn new(tokenizer: &Tokenizer) -> Self {
        let off = Self {
            splitter: None,
            cache: Mutex::new(Generations::default()),
        };
        let added = tokenizer.get_added_tokens_decoder();
        if added.is_empty()
            || added
                .values()
                .any(|t| t.normalized || t.lstrip || t.rstrip || t.single_word)
        {
            return off;
        }
        let mut tokens: Vec<(u32, String)> =
            added.into_iter().map(|(id, t)| (id, t.content)).collect();
        tokens.sort();
        let Ok(ac) = AhoCorasick::builder()
            .match_kind(MatchKind::LeftmostLongest)
            .build(tokens.iter().map(|(_, c)| c.as_str()))
        else {
            return off;
        };
        let coder = Self {
            splitter: Some((ac, tokens.iter().map(|(id, _)| *id).collect())),
            cache: Mutex::new(Generations::default()),
        };
        let specials: Vec<String> = tokens.into_iter().map(|(_, c)| c).collect();
        for p in probes(&specials) {
            let whole = tokenizer
                .encode_fast(p.as_str(), false)
                .map(|e| e.get_ids().to_vec());
            let pieces = coder.encode(tokenizer, &p);
            if whole.ok() != pieces.ok() {
                return off;
            }
        }
        coder
            .cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .current
            .clear();
        coder
    }

    /// Whether prompts are tokenized piece by piece.
    pub fn is_piecewise(&self) -> bool {
        self.splitter.is_some()
    }

    /// The ids of `text`.
    pub fn encode(&self, tokenizer: &Tokenizer, text: &str) -> Result<Vec<u32>, String> {
        let Some((ac, ids)) = &self.splitter else {
            return whole(tokenizer, text);
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
            out.extend(whole(tokenizer, piece)?);
            return Ok(());
        }
        let hit = self
            .cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(piece);
        let ids = match hit {
            Some(ids) => ids,
            None => {
                let ids: Arc<[u32]> = whole(tokenizer, piece)?.into();
                self.cache
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(piece, ids.clone());
                ids
            }
        };
        out.extend_from_slice(&ids);
        Ok(())
    }
}

fn whole(tokenizer: &Tokenizer, text: &str) -> Result<Vec<u32>, String> {
    tokenizer
        .encode_fast(text, false)
        .map(|e| e.get_ids().to_vec())
        .map_err(|e| e.to_string())
}
