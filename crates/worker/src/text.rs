//! Output text: the engine samples token ids that mean nothing, so each one is mapped onto
//! a printable piece of the tokenizer's vocabulary. The table is built once at start: every
//! id of the vocabulary (up to [`MAX_SCAN`]) decoded alone, keeping the pieces that are
//! whole UTF-8 text, without control characters and not special-token-like (`<...>`).
//! Token `t` prints as piece `t % pieces`: deterministic for a given tokenizer.

use kvroute_preprocess::Preprocessor;
use std::sync::Arc;

/// Vocabulary ids scanned at most.
pub(crate) const MAX_SCAN: usize = 65_536;

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
    }
}
