//! Output text: the engine samples token ids that mean nothing, so each one is mapped onto
//! a printable piece of the tokenizer's vocabulary. The table is built once at start: every
//! id of the vocabulary (up to [`MAX_SCAN`]) decoded alone, keeping the pieces that are
//! whole UTF-8 text, without control characters and not special-token-like (`<...>`); of
//! those, only the ones that read as a word (a space then letters) or as punctuation, when
//! there are at least [`MIN_WORDS`] of them. Text glued from any pieces would be runs of
//! subword fragments (`ing` + `ed` + `tion`) that no model writes: re-tokenized in the next
//! turn's history, each run is a new "word" for the tokenizer, whose per-word caches then grow
//! as they never would on a model's output. Token `t` prints as piece `t % pieces`:
//! deterministic for a given tokenizer.

use kvroute_preprocess::Preprocessor;
use std::sync::Arc;

/// Vocabulary ids scanned at most.
pub(crate) const MAX_SCAN: usize = 65_536;

/// Word-like pieces needed to keep to them (fewer: every usable piece is kept).
pub(crate) const MIN_WORDS: usize = 64;

/// Used when the tokenizer cannot decode or yields nothing usable.
const FALLBACK: &[&str] = &[
    " the", " a", " cache", " block", " token", " route", " prefix", " engine", " of", " to",
    " and", " is", ".", ",",
];

/// See the module documentation.
#[derive(Clone, Debug)]
pub(crate) struct OutputText {
    pieces: Arc<[Box<str>]>,
}

impl OutputText {
    /// The table of a tokenizer (CPU-bound: call it off the async runtime).
    pub(crate) fn build(pre: &Preprocessor) -> Self {
        let n = pre.vocab_size().min(MAX_SCAN);
        let mut pieces: Vec<Box<str>> = (0..n as u32)
            .filter_map(|id| pre.decode(&[id]).ok())
            .filter(|s| usable(s))
            .map(String::into_boxed_str)
            .collect();
        let words: Vec<Box<str>> = pieces.iter().filter(|p| word_like(p)).cloned().collect();
        if words.len() >= MIN_WORDS {
            pieces = words;
        }
        if pieces.is_empty() {
            pieces = FALLBACK.iter().map(|s| Box::from(*s)).collect();
        }
        Self {
            pieces: pieces.into(),
        }
    }

    /// The text of sampled token `token`.
    pub(crate) fn piece(&self, token: u32) -> &str {
        // Never empty: the fallback steps in.
        &self.pieces[token as usize % self.pieces.len()]
    }

    /// The text of several tokens.
    pub(crate) fn text(&self, tokens: &[u32]) -> String {
        tokens.iter().map(|&t| self.piece(t)).collect()
    }

    /// Pieces in the table.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.pieces.len()
    }
}

/// A space then letters (` cache`), or one punctuation mark.
fn word_like(s: &str) -> bool {
    match s.strip_prefix(' ') {
        Some(word) => !word.is_empty() && word.chars().all(char::is_alphabetic),
        None => matches!(s, "." | "," | ";" | ":" | "!" | "?"),
    }
}

fn usable(s: &str) -> bool {
    let special = s.len() > 2 && s.starts_with('<') && s.ends_with('>');
    !s.is_empty() && !special && !s.contains('\u{FFFD}') && !s.chars().any(char::is_control)
}

#[cfg(test)]
mod tests {
    use super::*;

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
    }
}
