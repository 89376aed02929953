//! Prompts as a simulator sees them: explicit token ids, or Mooncake-style hash blocks that
//! stand for deterministic token ids and are only expanded when needed.
//!
//! Token ids are drawn from a fixed pseudo-random function of `(key, position)`
//! ([`token_at`]): no tokenizer, no text, no randomness state. Equal keys give equal tokens,
//! so two prompts that share a hash id at the same position share that block's tokens, and so
//! share KV blocks in any engine, whatever its block size.

use kvroute_core::{BlockSize, BlockedPrompt, Namespace};
use serde::{Deserialize, Serialize};

/// Size of the synthetic vocabulary: every generated token id is below it.
pub const VOCAB_SIZE: u32 = 128_000;

pub(crate) use kvroute_core::hashing::splitmix64;

/// Combines two words into one key (order matters); used to derive independent token streams
/// from a seed, a purpose tag and an index.
pub fn mix_key(a: u64, b: u64) -> u64 {
    splitmix64(splitmix64(a) ^ b.rotate_left(23) ^ 0x6b76_776c_6f61_6431)
}

/// The token at `position` of the stream named `key`: a pseudo-random id below
/// [`VOCAB_SIZE`], a pure function of its arguments.
pub fn token_at(key: u64, position: u64) -> u32 {
    token_of_mixed(splitmix64(key), position)
}

/// [`token_at`] with the stream key already mixed (hoisted out of loops over positions).
/// One 64-bit draw serves two neighbouring positions (its low and high halves).
#[inline]
fn token_of_mixed(mixed_key: u64, position: u64) -> u32 {
    let x = pair_draw(mixed_key, position >> 1);
    token_of_half(if position & 1 == 0 { x } else { x >> 32 })
}

/// The `pair`-th 64-bit draw of a stream: wyrand's output for counter `pair` (a
/// multiply-fold of a Weyl sequence; passes PractRand), cheaper than a splitmix per draw.
#[inline]
fn pair_draw(mixed_key: u64, pair: u64) -> u64 {
    let s = mixed_key.wrapping_add(pair.wrapping_add(1).wrapping_mul(0xa076_1d64_78bd_642f));
    let m = u128::from(s) * u128::from(s ^ 0xe703_7ed1_a0b4_28db);
    (m as u64) ^ ((m >> 64) as u64)
}

/// Multiply-shift maps 32 random bits onto [0, VOCAB_SIZE) with negligible bias.
#[inline]
fn token_of_half(bits: u64) -> u32 {
    (((bits & 0xffff_ffff) * u64::from(VOCAB_SIZE)) >> 32) as u32
}

/// Appends `count` tokens of the stream `key`, starting at position `start`, to `out`.
pub fn extend_tokens(out: &mut Vec<u32>, key: u64, start: u64, count: usize) {
    let mixed = splitmix64(key);
    let base = out.len();
    out.resize(base + count, 0);
    let slots = &mut out[base..];
    // An odd start takes the high half of its pair alone; then whole pairs.
    let skip = usize::from(start & 1 == 1 && count > 0);
    if skip == 1 {
        slots[0] = token_of_mixed(mixed, start);
    }
    let mut pairs = slots[skip..].chunks_exact_mut(2);
    let mut pair = start.wrapping_add(skip as u64) >> 1;
    for two in &mut pairs {
        let x = pair_draw(mixed, pair);
        two[0] = token_of_half(x);
        two[1] = token_of_half(x >> 32);
        pair = pair.wrapping_add(1);
    }
    if let [last] = pairs.into_remainder() {
        *last = token_of_half(pair_draw(mixed, pair));
    }
}

/// Token ids for a text, by a deterministic stand-in for a tokenizer: words, numbers and
/// single punctuation marks become tokens, words longer than six characters one token per
/// four characters (about the 1.3 tokens per English word of BPE tokenizers). Equal texts
/// give equal tokens and texts with a common beginning give a common prefix of tokens. For
/// simulated workloads only: live traffic is tokenized with the model's own tokenizer.
pub fn text_tokens(text: &str) -> Vec<u32> {
    let key = splitmix64(0x7465_7874_746f_6b65); // "texttoke"
    let mut out = Vec::with_capacity(text.len() / 4 + 1);
    let piece_token = |piece: &str| {
        let h = piece.bytes().fold(key, |h, b| splitmix64(h ^ u64::from(b)));
        (((h >> 32) * u64::from(VOCAB_SIZE)) >> 32) as u32
    };
    for word in text.split(|c: char| c.is_whitespace()) {
        let mut rest = word;
        while !rest.is_empty() {
            let end = rest
                .char_indices()
                .find(|(_, c)| !c.is_alphanumeric())
                .map_or(rest.len(), |(i, c)| if i == 0 { c.len_utf8() } else { i });
            let (piece, tail) = rest.split_at(end);
            rest = tail;
            let chars: Vec<(usize, char)> = piece.char_indices().collect();
            if chars.len() <= 6 {
                out.push(piece_token(piece));
            } else {
                for chunk in chars.chunks(4) {
                    let from = chunk[0].0;
                    let to = chunk.last().map_or(from, |(i, c)| i + c.len_utf8());
                    out.push(piece_token(&piece[from..to]));
                }
            }
        }
    }
    out
}

/// The `block_tokens` tokens of the block with hash id `id`.
///
/// Equal ids give equal blocks; two different ids give equal blocks with probability about
/// `VOCAB_SIZE^-block_tokens` (for any block of two or more tokens: never, in practice).
pub fn token_block(id: u64, block_tokens: usize) -> Vec<u32> {
    let mut out = Vec::with_capacity(block_tokens);
    extend_tokens(&mut out, block_key(id), 0, block_tokens);
    out
}

/// The token stream of hash-block `id` (separate from every other stream of this crate).
pub(crate) fn block_key(id: u64) -> u64 {
    mix_key(0x6861_7368_626c_6f63, id) // "hashbloc"
}

/// A prompt, cheap to hold for a long trace.
///
/// `HashBlocks` is the Mooncake form: `len` tokens made of blocks of `block_tokens` tokens,
/// block `i` holding `token_block(ids[i], block_tokens)`, the last block possibly truncated.
/// Its fields are public, so a value may be inconsistent (too few ids, zero block size); every
/// method then uses the consistent part only: the prompt is the first
/// `min(len, ids.len() * block_tokens)` tokens. [`Prompt::hash_blocks`] checks the fields.
///
/// Appending ([`Prompt::append`]) turns a `HashBlocks` prompt into `Tokens`: a follow-up
/// turn is no longer made of whole hash blocks, and turns are short-lived, so the simple form
/// wins over a hybrid.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Prompt {
    /// Explicit token ids.
    Tokens(Vec<u32>),
    /// Deterministic token blocks named by hash ids.
    HashBlocks {
        /// One hash id per block (the last block may be partial).
        ids: Vec<u64>,
        /// Tokens per block.
        block_tokens: usize,
        /// Prompt length in tokens.
        len: usize,
    },
}

/// A `HashBlocks` prompt whose fields disagree.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PromptError {
    /// Zero tokens per block.
    #[error("block size must be positive")]
    ZeroBlockSize,
    /// `ids.len()` is not `ceil(len / block_tokens)`.
    #[error("{len} tokens in blocks of {block_tokens} need {expected} hash ids, got {got}")]
    IdCount {
        /// Prompt length.
        len: usize,
        /// Tokens per block.
        block_tokens: usize,
        /// `ceil(len / block_tokens)`.
        expected: usize,
        /// `ids.len()`.
        got: usize,
    },
}

impl Prompt {
    /// A checked `HashBlocks` prompt: `block_tokens > 0` and `ids.len() == ceil(len / block_tokens)`.
    pub fn hash_blocks(
        ids: Vec<u64>,
        block_tokens: usize,
        len: usize,
    ) -> Result<Self, PromptError> {
        if block_tokens == 0 {
            return Err(PromptError::ZeroBlockSize);
        }
        let expected = len.div_ceil(block_tokens);
        if ids.len() != expected {
            return Err(PromptError::IdCount {
                len,
                block_tokens,
                expected,
                got: ids.len(),
            });
        }
        Ok(Prompt::HashBlocks {
            ids,
            block_tokens,
            len,
        })
    }

    /// Number of tokens (for an inconsistent `HashBlocks`, of its consistent part).
    pub fn len(&self) -> usize {
        match self {
            Prompt::Tokens(t) => t.len(),
            Prompt::HashBlocks {
                ids,
                block_tokens,
                len,
            } => (*len).min(ids.len().saturating_mul(*block_tokens)),
        }
    }

    /// Whether the prompt has no token.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The token ids.
    pub fn materialize(&self) -> Vec<u32> {
        match self {
            Prompt::Tokens(t) => t.clone(),
            Prompt::HashBlocks {
                ids, block_tokens, ..
            } => {
                let total = self.len();
                let mut out = Vec::with_capacity(total);
                for &id in ids {
                    let take = (*block_tokens).min(total - out.len());
                    if take == 0 {
                        break;
                    }
                    extend_tokens(&mut out, block_key(id), 0, take);
                }
                out
            }
        }
    }

    /// The token ids, reusing the vector of a `Tokens` prompt.
    pub fn into_tokens(self) -> Vec<u32> {
        match self {
            Prompt::Tokens(t) => t,
            other => other.materialize(),
        }
    }

    /// Appends tokens (a follow-up turn: the answer, then the next question). A `HashBlocks`
    /// prompt becomes `Tokens`.
    pub fn append(&mut self, tokens: &[u32]) {
        if let Prompt::HashBlocks { .. } = self {
            *self = Prompt::Tokens(self.materialize());
        }
        if let Prompt::Tokens(t) = self {
            t.extend_from_slice(tokens);
        }
    }

    /// This prompt followed by `tokens`, as a new prompt.
    pub fn followed_by(&self, tokens: &[u32]) -> Prompt {
        let mut out = match self {
            Prompt::Tokens(t) => {
                let mut v = Vec::with_capacity(t.len() + tokens.len());
                v.extend_from_slice(t);
                v
            }
            other => other.materialize(),
        };
        out.extend_from_slice(tokens);
        Prompt::Tokens(out)
    }

    /// The prompt cut into the router's blocks (materializes the tokens).
    pub fn blocked(&self, block_size: BlockSize, ns: Namespace) -> BlockedPrompt {
        match self {
            Prompt::Tokens(t) => BlockedPrompt::new(t, block_size, ns),
            other => BlockedPrompt::new(&other.materialize(), block_size, ns),
        }
    }
}

impl From<Vec<u32>> for Prompt {
    fn from(tokens: Vec<u32>) -> Self {
        Prompt::Tokens(tokens)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_blocks_are_deterministic_and_distinct() {
        assert_eq!(token_block(7, 512), token_block(7, 512));
        assert_ne!(token_block(7, 512), token_block(8, 512));
        assert_eq!(token_block(7, 16)[..], token_block(7, 512)[..16]);
        assert!(token_block(3, 4096).iter().all(|&t| t < VOCAB_SIZE));
        // Spread over the vocabulary: a few thousand draws cover both halves and many values.
        let b = token_block(11, 4096);
        let mut distinct = b.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert!(distinct.len() > 3_900, "{} distinct", distinct.len());
        assert!(b.iter().any(|&t| t < VOCAB_SIZE / 2));
        assert!(b.iter().any(|&t| t >= VOCAB_SIZE / 2));
    }

    #[test]
    fn many_ids_give_pairwise_different_blocks() {
        let mut blocks: Vec<Vec<u32>> = (0..2_000).map(|id| token_block(id, 4)).collect();
        blocks.sort();
        blocks.dedup();
        assert_eq!(blocks.len(), 2_000);
    }

    #[test]
    fn hash_blocks_materialize_with_truncated_tail() {
        let p = Prompt::hash_blocks(vec![1, 2, 3], 4, 10).unwrap();
        assert_eq!(p.len(), 10);
        let t = p.materialize();
        assert_eq!(t.len(), 10);
        assert_eq!(t[..4], token_block(1, 4)[..]);
        assert_eq!(t[4..8], token_block(2, 4)[..]);
        assert_eq!(t[8..], token_block(3, 4)[..2]);
    }

    #[test]
    fn shared_ids_give_shared_prefixes() {
        let a = Prompt::hash_blocks(vec![0, 1, 2], 8, 20)
            .unwrap()
            .materialize();
        let b = Prompt::hash_blocks(vec![0, 1, 9], 8, 24)
            .unwrap()
            .materialize();
        assert_eq!(a[..16], b[..16]);
        assert_ne!(a[16..20], b[16..20]);
    }

    #[test]
    fn checked_constructor_rejects_inconsistent_fields() {
        assert_eq!(
            Prompt::hash_blocks(vec![1], 0, 1),
            Err(PromptError::ZeroBlockSize)
        );
        assert!(matches!(
            Prompt::hash_blocks(vec![1, 2], 512, 512),
            Err(PromptError::IdCount {
                expected: 1,
                got: 2,
                ..
            })
        ));
        assert!(Prompt::hash_blocks(vec![], 512, 0).unwrap().is_empty());
    }

    #[test]
    fn inconsistent_hash_blocks_never_panic() {
        let zero = Prompt::HashBlocks {
            ids: vec![1, 2],
            block_tokens: 0,
            len: 10,
        };
        assert_eq!(zero.len(), 0);
        assert!(zero.materialize().is_empty());
        let short = Prompt::HashBlocks {
            ids: vec![1],
            block_tokens: 4,
            len: 10,
        };
        assert_eq!(short.len(), 4);
        assert_eq!(short.materialize(), token_block(1, 4));
    }

    #[test]
    fn append_turns_hash_blocks_into_tokens() {
        let mut p = Prompt::hash_blocks(vec![5, 6], 4, 6).unwrap();
        let before = p.materialize();
        p.append(&[1, 2, 3]);
        assert!(matches!(p, Prompt::Tokens(_)));
        assert_eq!(p.len(), 9);
        let t = p.materialize();
        assert_eq!(t[..6], before[..]);
        assert_eq!(t[6..], [1, 2, 3]);
        let q = Prompt::from(vec![9]).followed_by(&[8]);
        assert_eq!(q.into_tokens(), vec![9, 8]);
    }

    #[test]
    fn blocked_matches_router_hashing_of_the_tokens() {
        let p = Prompt::hash_blocks(vec![1, 2, 3], 16, 40).unwrap();
        let bs = BlockSize::new(16).unwrap();
        let b = p.blocked(bs, Namespace::default());
        assert_eq!(b.tokens, 40);
        assert_eq!(b.full_blocks(), 2);
        assert_eq!(
            b,
            BlockedPrompt::new(&p.materialize(), bs, Namespace::default())
        );
    }

    #[test]
    fn streams_with_different_keys_differ() {
        let mut a = Vec::new();
        let mut b = Vec::new();
        extend_tokens(&mut a, mix_key(1, 2), 0, 32);
        extend_tokens(&mut b, mix_key(2, 1), 0, 32);
        assert_ne!(a, b);
        let mut c = Vec::new();
        extend_tokens(&mut c, mix_key(1, 2), 16, 16);
        assert_eq!(a[16..], c[..]);
    }
}

#[cfg(test)]
mod text_tests {
    use super::*;

    #[test]
    fn text_tokens_are_deterministic_and_share_prefixes() {
        let a = text_tokens("The quick brown fox, jumping over lazy dogs.");
        assert_eq!(
            a,
            text_tokens("The quick brown fox, jumping over lazy dogs.")
        );
        // The, quick, brown, fox, ",", jump+ing (7 chars: 2 chunks), over, lazy, dogs, "."
        assert_eq!(a.len(), 11);
        let b = text_tokens("The quick brown fox, jumping over lazy cats!");
        assert_eq!(a[..9], b[..9]);
        assert_ne!(a[9], b[9]);
        assert!(a.iter().all(|t| *t < VOCAB_SIZE));
        assert!(text_tokens("  \n ").is_empty());
        assert_eq!(
            text_tokens("日本語のテキスト").len(),
            2,
            "chunks count characters, not bytes"
        );
    }
}

#[cfg(test)]
mod stream_tests {
    use super::*;

    #[test]
    fn extend_tokens_agrees_with_token_at_at_any_offset() {
        for start in 0..5u64 {
            for count in 0..7usize {
                let mut v = Vec::new();
                extend_tokens(&mut v, 42, start, count);
                let want: Vec<u32> = (0..count as u64).map(|i| token_at(42, start + i)).collect();
                assert_eq!(v, want, "start {start} count {count}");
            }
        }
        let mut v = Vec::new();
        extend_tokens(&mut v, 7, 0, 1_000);
        let distinct: std::collections::HashSet<_> = v.iter().collect();
        assert!(distinct.len() > 990, "{}", distinct.len());
    }
}
