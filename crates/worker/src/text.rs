//! Output text: which token ids the engine samples and what they print.
//!
//! Answers must round-trip: a client sends an answer back in the next turn's history, the
//! chat template renders it, and the tokenizer must give back the very ids the engine
//! generated and cached, or the follow-up prefills the whole previous answer again (a real
//! engine finds it cached). So the worker builds, once at start, a table of the ids of its
//! own tokenizer whose text reads as a word (a space then letters, ` cache`) and that
//! tokenize back to themselves: each alone (`encode(text) == [id]`), then in context
//! (every table piece joined with others, in vocabulary and in hashed order, chunks that do
//! not re-encode to their ids bisected and the offending pieces dropped), then a sample
//! answer joined as the engine would write it, and that answer inside the chat template
//! after the assistant header. The engine samples from that table
//! (`kvroute_engine::EngineConfig::output_ids`) and each id prints its own text.
//!
//! Word-like pieces only: text glued from arbitrary pieces would be runs of subword
//! fragments (`ing` + `ed` + `tion`) that no model writes: re-tokenized in the next turn's
//! history, each run is a new "word" for the tokenizer, whose per-word caches then grow as
//! they never would on a model's output; punctuation is left out too, since neighbouring
//! marks merge into other tokens (`.` + `,` is `.,`).
//!
//! When no such table can be built (approximate mode, a tokenizer whose decoded pieces do
//! not read as words or do not tokenize back, fewer than [`MIN_WORDS`] of them), the engine
//! keeps its own ids, which mean nothing, and token `t` prints as printable piece
//! `t % pieces` (word-like ones when there are enough): deterministic for a given tokenizer,
//! but a follow-up then prefills the previous answer again. [`OutputText::log`] says which.

use kvroute_core::hashing::splitmix64;
use kvroute_preprocess::Preprocessor;
use std::sync::Arc;

/// Vocabulary ids scanned at most.
pub(crate) const MAX_SCAN: usize = 65_536;

/// Word-like pieces needed to keep to them, and round-trip-safe ids needed for a table.
pub(crate) const MIN_WORDS: usize = 64;

/// Pieces joined per text when checking the table in context.
const CHECK_CHUNK: usize = 256;

/// Tokens of the sample answer checked at the end (joined, and inside the chat template).
const SAMPLE_TOKENS: u64 = 256;

/// Used when the tokenizer cannot decode or yields nothing usable.
const FALLBACK: &[&str] = &[
    " the", " a", " cache", " block", " token", " route", " prefix", " engine", " of", " to",
    " and", " is", ".", ",",
];

/// How far answers round-trip, for the start log (see the module documentation).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum RoundTrip {
    /// Answers tokenize back to the engine's ids, alone and inside the chat template.
    Exact,
    /// They do alone (completions), but not as the chat template renders them: why.
    NotInTemplate(String),
    /// No table: the engine's ids mean nothing; why.
    Off(String),
}

/// See the module documentation.
#[derive(Clone, Debug)]
pub(crate) struct OutputText {
    /// The round-trip-safe ids, ascending (empty: none), and their text.
    ids: Arc<[u32]>,
    texts: Arc<[Box<str>]>,
    /// The text of ids outside the table: piece `t % len` (never empty).
    pieces: Arc<[Box<str>]>,
    round_trip: RoundTrip,
}

impl OutputText {
    /// The table of a tokenizer (CPU-bound: call it off the async runtime).
    pub(crate) fn build(pre: &Preprocessor) -> Self {
        let n = pre.vocab_size().min(MAX_SCAN);
        let usable: Vec<(u32, String)> = (0..n as u32)
            .filter_map(|id| Some((id, pre.decode(&[id]).ok()?)))
            .filter(|(_, s)| usable(s))
            .collect();
        let mut pieces: Vec<Box<str>> = usable.iter().map(|(_, s)| Box::from(&**s)).collect();
        let words: Vec<Box<str>> = pieces.iter().filter(|p| word_like(p)).cloned().collect();
        if words.len() >= MIN_WORDS {
            pieces = words;
        }
        if pieces.is_empty() {
            pieces = FALLBACK.iter().map(|s| Box::from(*s)).collect();
        }
        let (table, round_trip) = if pre.is_approximate() {
            (
                Vec::new(),
                RoundTrip::Off("no tokenizer (approximate mode)".into()),
            )
        } else {
            round_trip_table(pre, usable)
        };
        let (ids, texts): (Vec<u32>, Vec<Box<str>>) = table.into_iter().unzip();
        Self {
            ids: ids.into(),
            texts: texts.into(),
            pieces: pieces.into(),
            round_trip,
        }
    }

    /// The ids the engine should sample from (`None`: its own).
    pub(crate) fn output_ids(&self) -> Option<Arc<[u32]>> {
        (!self.ids.is_empty()).then(|| self.ids.clone())
    }

    /// How far answers round-trip.
    #[cfg(test)]
    pub(crate) fn round_trip(&self) -> &RoundTrip {
        &self.round_trip
    }

    /// Says at start what answers are made of and whether they round-trip.
    pub(crate) fn log(&self, worker: &str) {
        match &self.round_trip {
            RoundTrip::Exact => tracing::info!(
                worker,
                output_ids = self.ids.len(),
                "answers are tokens of the tokenizer and tokenize back to them in the next turn"
            ),
            RoundTrip::NotInTemplate(why) => tracing::warn!(
                worker,
                output_ids = self.ids.len(),
                reason = %why,
                "answers tokenize back to their ids, but not inside the chat template: \
                 a follow-up turn prefills part of the previous answer again"
            ),
            RoundTrip::Off(why) => tracing::warn!(
                worker,
                reason = %why,
                "no round-trip-safe output ids: answers are printable pieces that do not \
                 tokenize back to the engine's ids, so a follow-up turn prefills the previous \
                 answer again"
            ),
        }
    }

    /// The text of sampled token `token`.
    pub(crate) fn piece(&self, token: u32) -> &str {
        match self.ids.binary_search(&token) {
            Ok(i) => &self.texts[i],
            // Never empty: the fallback steps in.
            Err(_) => &self.pieces[token as usize % self.pieces.len()],
        }
    }

    /// The text of several tokens.
    pub(crate) fn text(&self, tokens: &[u32]) -> String {
        tokens.iter().map(|&t| self.piece(t)).collect()
    }

    /// Printable pieces for ids outside the table.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.pieces.len()
    }
}

/// The ids of `usable` (id, decoded text; ascending ids) that round-trip, and how far.
fn round_trip_table(
    pre: &Preprocessor,
    usable: Vec<(u32, String)>,
) -> (Vec<(u32, Box<str>)>, RoundTrip) {
    let words: Vec<(u32, Box<str>)> = usable
        .into_iter()
        .filter(|(_, s)| word(s))
        .map(|(id, s)| (id, s.into_boxed_str()))
        .collect();
    let scanned = words.len();
    let mut table: Vec<(u32, Box<str>)> = words
        .into_iter()
        .filter(|(id, s)| pre.encode(s).is_ok_and(|ids| ids == [*id]))
        .collect();
    let alone = table.len();
    if alone < MIN_WORDS {
        return (
            Vec::new(),
            RoundTrip::Off(format!(
                "{alone} of {scanned} word pieces tokenize back to their id alone \
                 ({MIN_WORDS} needed)"
            )),
        );
    }
    // In context: vocabulary order, then an order by hash.
    let mut drop = vec![false; table.len()];
    let mut order: Vec<usize> = (0..table.len()).collect();
    for pass in 0..2 {
        if pass == 1 {
            order.sort_by_key(|&i| splitmix64(u64::from(table[i].0)));
        }
        for chunk in order.chunks(CHECK_CHUNK) {
            blame(pre, &table, chunk, &mut drop);
        }
    }
    let mut keep = drop.iter().map(|d| !d);
    table.retain(|_| keep.next().unwrap_or(false));
    if table.len() < MIN_WORDS || table.len() * 2 < alone {
        return (
            Vec::new(),
            RoundTrip::Off(format!(
                "{} of {alone} pieces that tokenize back alone also do beside others",
                table.len()
            )),
        );
    }
    // A sample answer as the engine writes one.
    let sample: Vec<usize> = (0..SAMPLE_TOKENS)
        .map(|k| (splitmix64(k ^ 0x5eed) % table.len() as u64) as usize)
        .collect();
    if !round_trips(pre, &table, &sample) {
        return (
            Vec::new(),
            RoundTrip::Off("a joined sample answer does not tokenize back to its ids".into()),
        );
    }
    let ids: Vec<u32> = sample.iter().map(|&i| table[i].0).collect();
    let answer: String = sample.iter().map(|&i| &*table[i].1).collect();
    let round_trip = in_template(pre, &answer, &ids);
    (table, round_trip)
}

/// Whether the pieces `at` of `table`, joined, tokenize to their ids.
fn round_trips(pre: &Preprocessor, table: &[(u32, Box<str>)], at: &[usize]) -> bool {
    let text: String = at.iter().map(|&i| &*table[i].1).collect();
    pre.encode(&text)
        .is_ok_and(|ids| ids.iter().copied().eq(at.iter().map(|&i| table[i].0)))
}

/// Marks in `drop` the pieces `at` of `table` that do not round-trip joined: bisects a
/// failing chunk; a chunk whose halves pass fails at their seam (both sides dropped).
fn blame(pre: &Preprocessor, table: &[(u32, Box<str>)], at: &[usize], drop: &mut [bool]) {
    let at: Vec<usize> = at.iter().copied().filter(|&i| !drop[i]).collect();
    if at.len() < 2 || round_trips(pre, table, &at) {
        return;
    }
    if at.len() == 2 {
        drop[at[0]] = true;
        drop[at[1]] = true;
        return;
    }
    let mid = at.len() / 2;
    blame(pre, table, &at[..mid], drop);
    blame(pre, table, &at[mid..], drop);
    let seam = [at[mid - 1], at[mid]];
    if seam.iter().all(|&i| !drop[i]) {
        blame(pre, table, &seam, drop);
    }
}

/// Whether `answer` (the text of `ids`) keeps its ids as the chat template renders it in a
/// conversation's history.
fn in_template(pre: &Preprocessor, answer: &str, ids: &[u32]) -> RoundTrip {
    let messages = [
        serde_json::json!({"role": "user", "content": "What is a KV cache?"}),
        serde_json::json!({"role": "assistant", "content": answer}),
        serde_json::json!({"role": "user", "content": "And why does routing matter?"}),
    ];
    let prompt = match pre
        .render_chat(&messages, true)
        .and_then(|t| pre.encode(&t))
    {
        Ok(p) => p,
        Err(e) => return RoundTrip::NotInTemplate(format!("rendering a sample chat: {e}")),
    };
    let holds = |ids: &[u32]| ids.is_empty() || prompt.windows(ids.len()).any(|w| w == ids);
    if holds(ids) {
        RoundTrip::Exact
    } else if holds(&ids[1..]) {
        RoundTrip::NotInTemplate(
            "the chat template changes an answer's first token (it trims the answer?)".into(),
        )
    } else {
        RoundTrip::NotInTemplate("the chat template changes an answer's tokens".into())
    }
}

/// A space then letters (` cache`).
fn word(s: &str) -> bool {
    s.strip_prefix(' ')
        .is_some_and(|w| !w.is_empty() && w.chars().all(char::is_alphabetic))
}

/// A word, or one punctuation mark.
fn word_like(s: &str) -> bool {
    word(s) || matches!(s, "." | "," | ";" | ":" | "!" | "?")
}

fn usable(s: &str) -> bool {
    let special = s.len() > 2 && s.starts_with('<') && s.ends_with('>');
    !s.is_empty() && !special && !s.contains('\u{FFFD}') && !s.chars().any(char::is_control)
}

#[cfg(test)]
mod tests;
