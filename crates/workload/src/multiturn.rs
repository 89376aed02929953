//! The reference multi-turn chat workload, shaped for a closed-loop driver.
//!
//! A pool of conversation starters (long documents of about 3,500–4,000 tokens, built in or
//! given by the caller) is shared by all conversations. A conversation picks a starter, plans
//! 3–5 turns, and sends turn 1 = starter + a question. Each later turn resends the whole
//! history: the previous prompt, the model's answer (passed in by the driver) and a new
//! follow-up question of a few dozen tokens. Every turn asks for about 830 output tokens.
//!
//! Determinism: everything about conversation `c` (its starter, turn count, questions,
//! `max_tokens`) is drawn from its own random stream, seeded by `(seed, c)`. The workload is
//! therefore the same for a seed whatever order the driver finishes turns in, so two routing
//! policies compared in a simulator see the same conversations.
//!
//! Memory: only live conversations are kept; a conversation's state is dropped when its last
//! turn is issued, when [`MultiTurn::end`] abandons it, or (oldest first) when more than
//! `max_live` conversations are open.

use crate::prompt::{extend_tokens, mix_key, Prompt};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Stream tags keeping the generator's token streams apart.
const STARTER_TAG: u64 = 0x7374_6172_7465_7273; // "starters"
const QUESTION_TAG: u64 = 0x7175_6573_7469_6f6e; // "question"
const CONVERSATION_TAG: u64 = 0x636f_6e76_6572_7365; // "converse"

/// Largest accepted starter, in tokens.
pub const MAX_STARTER_TOKENS: usize = 1_000_000;
/// Largest built-in starter pool, in tokens over all starters.
pub const MAX_POOL_TOKENS: usize = 100_000_000;

/// Settings of the multi-turn workload (defaults: the reference demo).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MultiTurnConfig {
    /// Built-in starters in the pool (ignored when the caller gives starters).
    pub starters: usize,
    /// Shortest built-in starter, in tokens.
    pub starter_min_tokens: usize,
    /// Longest built-in starter, in tokens.
    pub starter_max_tokens: usize,
    /// Fewest turns of a conversation.
    pub min_turns: u32,
    /// Most turns of a conversation.
    pub max_turns: u32,
    /// Shortest question, in tokens.
    pub question_min_tokens: usize,
    /// Longest question, in tokens.
    pub question_max_tokens: usize,
    /// Output tokens asked per turn (the centre of the spread).
    pub max_tokens: u32,
    /// Each turn's `max_tokens` is uniform in `max_tokens ± max_tokens_spread`.
    pub max_tokens_spread: u32,
    /// Most conversations kept open; starting one more drops the oldest.
    pub max_live: usize,
}

impl Default for MultiTurnConfig {
    fn default() -> Self {
        Self {
            starters: 10,
            starter_min_tokens: 3_500,
            starter_max_tokens: 4_000,
            min_turns: 3,
            max_turns: 5,
            question_min_tokens: 20,
            question_max_tokens: 60,
            max_tokens: 830,
            max_tokens_spread: 0,
            max_live: 100_000,
        }
    }
}

impl MultiTurnConfig {
    /// Checks the settings.
    pub fn validate(&self) -> Result<(), String> {
        if self.starters == 0 {
            return Err("starters must be at least 1".into());
        }
        if self.starter_min_tokens == 0
            || self.starter_min_tokens > self.starter_max_tokens
            || self.starter_max_tokens > MAX_STARTER_TOKENS
        {
            return Err(format!(
                "need 1 <= starter_min_tokens <= starter_max_tokens <= {MAX_STARTER_TOKENS}, got {} and {}",
                self.starter_min_tokens, self.starter_max_tokens
            ));
        }
        if self.starters.saturating_mul(self.starter_max_tokens) > MAX_POOL_TOKENS {
            return Err(format!(
                "the starter pool would hold up to {} x {} tokens, above {MAX_POOL_TOKENS}",
                self.starters, self.starter_max_tokens
            ));
        }
        if self.min_turns == 0 || self.min_turns > self.max_turns || self.max_turns > 1_000 {
            return Err(format!(
                "need 1 <= min_turns <= max_turns <= 1000, got {} and {}",
                self.min_turns, self.max_turns
            ));
        }
        if self.question_min_tokens > self.question_max_tokens
            || self.question_max_tokens > MAX_STARTER_TOKENS
        {
            return Err(format!(
                "need question_min_tokens <= question_max_tokens <= {MAX_STARTER_TOKENS}, got {} and {}",
                self.question_min_tokens, self.question_max_tokens
            ));
        }
        if self.max_tokens == 0 || self.max_tokens_spread >= self.max_tokens {
            return Err(format!(
                "need 0 <= max_tokens_spread < max_tokens, got {} and {}",
                self.max_tokens_spread, self.max_tokens
            ));
        }
        if self
            .max_tokens
            .checked_add(self.max_tokens_spread)
            .is_none()
        {
            return Err("max_tokens + max_tokens_spread overflows".into());
        }
        if self.max_live == 0 {
            return Err("max_live must be at least 1".into());
        }
        Ok(())
    }
}

/// The workload could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MultiTurnError {
    /// Invalid settings.
    #[error("invalid multi-turn config: {0}")]
    Config(String),
    /// The caller gave no starter.
    #[error("the starter pool is empty")]
    NoStarters,
    /// A caller-given starter is empty or too long.
    #[error("starter {index} has {tokens} tokens; need 1 to {MAX_STARTER_TOKENS}")]
    BadStarter {
        /// Its position in the pool.
        index: usize,
        /// Its length.
        tokens: usize,
    },
}

/// A conversation, numbered from 0 in start order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ConversationId(pub u64);

/// One turn to send.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnRequest {
    /// The conversation.
    pub conversation: ConversationId,
    /// The turn number, from 1.
    pub turn: u32,
    /// Turns planned for the conversation (this is its last turn when `turn == turns`).
    pub turns: u32,
    /// The starter the conversation began with (index in the pool).
    pub starter: usize,
    /// The whole history so far plus the new question.
    pub prompt: Prompt,
    /// Output tokens to ask for (send with ignore-eos).
    pub max_tokens: u32,
    /// The session key for router affinity (the conversation number).
    pub session: u64,
}

impl TurnRequest {
    /// Whether no turn follows this one.
    pub fn is_last(&self) -> bool {
        self.turn >= self.turns
    }
}

/// A live conversation: its history and its own random stream.
#[derive(Clone, Debug)]
struct Conversation {
    history: Vec<u32>,
    turn: u32,
    turns: u32,
    starter: usize,
    rng: ChaCha8Rng,
}

/// The multi-turn workload generator.
#[derive(Clone, Debug)]
pub struct MultiTurn {
    config: MultiTurnConfig,
    seed: u64,
    starters: Vec<Vec<u32>>,
    live: BTreeMap<u64, Conversation>,
    next_id: u64,
    evicted: u64,
}

impl MultiTurn {
    /// A workload with the built-in starter pool: `config.starters` documents of
    /// deterministic pseudo-random tokens, lengths uniform in the configured range.
    pub fn new(config: MultiTurnConfig, seed: u64) -> Result<Self, MultiTurnError> {
        config.validate().map_err(MultiTurnError::Config)?;
        let mut rng = ChaCha8Rng::seed_from_u64(mix_key(seed, STARTER_TAG));
        let starters = (0..config.starters)
            .map(|i| {
                let len = rng.gen_range(config.starter_min_tokens..=config.starter_max_tokens);
                let mut t = Vec::new();
                extend_tokens(
                    &mut t,
                    mix_key(mix_key(seed, STARTER_TAG), i as u64),
                    0,
                    len,
                );
                t
            })
            .collect();
        Ok(Self::from_parts(config, seed, starters))
    }

    /// A workload over the caller's starters (already tokenized); `config.starters` and the
    /// starter lengths of the config are ignored.
    pub fn with_starters(
        config: MultiTurnConfig,
        starters: Vec<Vec<u32>>,
        seed: u64,
    ) -> Result<Self, MultiTurnError> {
        config.validate().map_err(MultiTurnError::Config)?;
        if starters.is_empty() {
            return Err(MultiTurnError::NoStarters);
        }
        if let Some((index, s)) = starters
            .iter()
            .enumerate()
            .find(|(_, s)| s.is_empty() || s.len() > MAX_STARTER_TOKENS)
        {
            return Err(MultiTurnError::BadStarter {
                index,
                tokens: s.len(),
            });
        }
        Ok(Self::from_parts(config, seed, starters))
    }

    fn from_parts(config: MultiTurnConfig, seed: u64, starters: Vec<Vec<u32>>) -> Self {
        Self {
            config,
            seed,
            starters,
            live: BTreeMap::new(),
            next_id: 0,
            evicted: 0,
        }
    }

    /// The settings.
    pub fn config(&self) -> &MultiTurnConfig {
        &self.config
    }

    /// The starter pool.
    pub fn starters(&self) -> &[Vec<u32>] {
        &self.starters
    }

    /// Conversations open now (started and not over).
    pub fn live(&self) -> usize {
        self.live.len()
    }

    /// Conversations dropped because more than `max_live` were open.
    pub fn evicted(&self) -> u64 {
        self.evicted
    }

    /// Conversations started so far.
    pub fn started(&self) -> u64 {
        self.next_id
    }

    /// Starts a new conversation and returns its first turn.
    pub fn start(&mut self) -> (ConversationId, TurnRequest) {
        let id = self.next_id;
        self.next_id += 1;
        let mut rng = ChaCha8Rng::seed_from_u64(mix_key(self.seed, CONVERSATION_TAG));
        rng.set_stream(id);
        let starter = rng.gen_range(0..self.starters.len());
        let turns = rng.gen_range(self.config.min_turns..=self.config.max_turns);
        let mut conv = Conversation {
            history: self.starters[starter].clone(),
            turn: 0,
            turns,
            starter,
            rng,
        };
        let req = self.next_turn(id, &mut conv);
        if conv.turn < conv.turns {
            while self.live.len() >= self.config.max_live {
                if self.live.pop_first().is_some() {
                    self.evicted += 1;
                }
            }
            self.live.insert(id, conv);
        }
        (ConversationId(id), req)
    }

    /// The next turn of `conv` after the model answered `answer` to the previous one; `None`
    /// when the conversation is over (or unknown: ended, evicted, never started). The driver
    /// then starts a new conversation to keep its concurrency.
    pub fn follow_up(&mut self, conv: ConversationId, answer: &[u32]) -> Option<TurnRequest> {
        let mut state = self.live.remove(&conv.0)?;
        state.history.extend_from_slice(answer);
        let req = self.next_turn(conv.0, &mut state);
        if state.turn < state.turns {
            self.live.insert(conv.0, state);
        }
        Some(req)
    }

    /// Abandons a conversation (e.g. after a failed turn); whether it was open.
    pub fn end(&mut self, conv: ConversationId) -> bool {
        self.live.remove(&conv.0).is_some()
    }

    /// Adds the next question to the history and builds the turn.
    fn next_turn(&self, id: u64, conv: &mut Conversation) -> TurnRequest {
        conv.turn += 1;
        let c = &self.config;
        let q_len = conv
            .rng
            .gen_range(c.question_min_tokens..=c.question_max_tokens);
        let key = mix_key(mix_key(self.seed, QUESTION_TAG), id);
        extend_tokens(&mut conv.history, key, u64::from(conv.turn) << 32, q_len);
        let max_tokens = if c.max_tokens_spread == 0 {
            c.max_tokens
        } else {
            conv.rng
                .gen_range(c.max_tokens - c.max_tokens_spread..=c.max_tokens + c.max_tokens_spread)
        };
        TurnRequest {
            conversation: ConversationId(id),
            turn: conv.turn,
            turns: conv.turns,
            starter: conv.starter,
            prompt: Prompt::Tokens(conv.history.clone()),
            max_tokens,
            session: id,
        }
    }
}

#[cfg(test)]
mod tests;
