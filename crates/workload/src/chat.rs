//! The reference multi-turn chat workload as text, for live load against an OpenAI-compatible
//! endpoint (the simulator's [`crate::multiturn`] is the same shape in token ids).
//!
//! A pool of conversation starters (deterministic documents of a few thousand words) is
//! shared by all conversations. A conversation picks a starter and plans 3–5 turns. Turn 1
//! sends the starter and a question. Each later turn resends the whole history: the
//! previous messages, the model's answer (passed in by the driver) and a new follow-up
//! question.
//!
//! Determinism: conversation `c` (its starter, turn count and questions) comes from its own
//! random stream seeded by `(seed, c)`, whatever order the driver finishes turns in. Only live
//! conversations are kept; the oldest is dropped past `max_live`.

use crate::prompt::mix_key;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Words the built-in documents and questions are made of.
const WORDS: &[&str] = &[
    "cache",
    "router",
    "token",
    "prefix",
    "replica",
    "latency",
    "throughput",
    "request",
    "engine",
    "memory",
    "block",
    "batch",
    "queue",
    "policy",
    "cluster",
    "model",
    "prompt",
    "answer",
    "system",
    "history",
    "document",
    "section",
    "report",
    "figure",
    "table",
    "design",
    "network",
    "storage",
    "schedule",
    "worker",
    "gateway",
    "metric",
    "window",
    "budget",
    "capacity",
    "traffic",
    "session",
    "turn",
    "load",
    "cost",
    "the",
    "a",
    "of",
    "and",
    "to",
    "in",
    "for",
    "with",
    "on",
    "by",
    "from",
    "that",
    "which",
    "each",
    "every",
    "when",
    "while",
    "after",
    "before",
    "because",
    "keeps",
    "sends",
    "holds",
    "reuses",
    "measures",
    "reports",
    "drops",
    "grows",
    "routes",
    "waits",
    "serves",
    "builds",
    "reads",
    "writes",
    "shows",
    "large",
    "small",
    "fast",
    "slow",
    "warm",
    "cold",
    "shared",
    "long",
    "short",
    "busy",
    "idle",
    "first",
    "last",
    "next",
    "whole",
    "recent",
    "stable",
];

/// Question openings of follow-up turns.
const ASKS: &[&str] = &[
    "Can you explain",
    "What happens to",
    "Summarize",
    "How would you improve",
    "Why does the document say",
    "Compare",
    "Give an example of",
    "What are the risks of",
];

/// Settings of the chat workload (defaults: the reference demo's shape).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ChatConfig {
    /// Starters in the pool.
    pub starters: usize,
    /// Shortest starter, in words.
    pub starter_min_words: usize,
    /// Longest starter, in words.
    pub starter_max_words: usize,
    /// Fewest turns of a conversation.
    pub min_turns: u32,
    /// Most turns of a conversation.
    pub max_turns: u32,
    /// Shortest question, in words.
    pub question_min_words: usize,
    /// Longest question, in words.
    pub question_max_words: usize,
    /// Output tokens asked per turn.
    pub max_tokens: u32,
    /// Most conversations kept open; starting one more drops the oldest.
    pub max_live: usize,
}

impl Default for ChatConfig {
    fn default() -> Self {
        Self {
            starters: 10,
            starter_min_words: 2_700,
            starter_max_words: 3_000,
            min_turns: 3,
            max_turns: 5,
            question_min_words: 12,
            question_max_words: 40,
            max_tokens: 830,
            max_live: 100_000,
        }
    }
}

impl ChatConfig {
    /// Checks the settings.
    pub fn validate(&self) -> Result<(), String> {
        if self.starters == 0 || self.starters > 10_000 {
            return Err(format!(
                "starters must be within 1..=10000, got {}",
                self.starters
            ));
        }
        if self.starter_min_words == 0
            || self.starter_min_words > self.starter_max_words
            || self.starter_max_words > 1_000_000
        {
            return Err(format!(
                "starter words must satisfy 1 <= min <= max <= 1000000, got {}..={}",
                self.starter_min_words, self.starter_max_words
            ));
        }
        if self.min_turns == 0 || self.min_turns > self.max_turns || self.max_turns > 1_000 {
            return Err(format!(
                "turns must satisfy 1 <= min <= max <= 1000, got {}..={}",
                self.min_turns, self.max_turns
            ));
        }
        if self.question_min_words == 0 || self.question_min_words > self.question_max_words {
            return Err("question words must satisfy 1 <= min <= max".into());
        }
        if self.max_tokens == 0 || self.max_live == 0 {
            return Err("max_tokens and max_live must be > 0".into());
        }
        Ok(())
    }

    /// The same conversations sized in tokens like the simulator's `m`, for a tokenizer
    /// that makes `tokens_per_word` tokens of this generator's words: starters and
    /// questions get the word counts whose token counts are `m`'s (so a live run and a
    /// simulated one load a fleet alike); turns and answers are `m`'s.
    pub fn sized_like(&self, m: &crate::MultiTurnConfig, tokens_per_word: f64) -> Self {
        let words = |tokens: usize| {
            if tokens_per_word.is_finite() && tokens_per_word > 0.0 {
                ((tokens as f64 / tokens_per_word).round() as usize).max(1)
            } else {
                tokens.max(1)
            }
        };
        Self {
            starters: m.starters,
            starter_min_words: words(m.starter_min_tokens),
            starter_max_words: words(m.starter_max_tokens),
            min_turns: m.min_turns,
            max_turns: m.max_turns,
            question_min_words: words(m.question_min_tokens),
            question_max_words: words(m.question_max_tokens),
            max_tokens: m.max_tokens,
            ..self.clone()
        }
    }

    /// A sample of this generator's text with its word count: the first starter, to measure
    /// a tokenizer's tokens per word with.
    pub fn sample(&self, seed: u64) -> Result<(String, usize), String> {
        let w = ChatWorkload::new(self.clone(), seed)?;
        let text = w.starters.first().cloned().unwrap_or_default();
        let n = text.split_whitespace().count();
        Ok((text, n))
    }
}

/// A message of a conversation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `user` or `assistant`.
    pub role: String,
    /// The text.
    pub content: String,
}

/// One turn to send.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatTurn {
    /// The conversation, numbered from 0 in start order.
    pub conversation: u64,
    /// The turn number, from 1.
    pub turn: u32,
    /// Turns planned.
    pub turns: u32,
    /// The starter's index in the pool.
    pub starter: usize,
    /// A short topic line (the starter's first words).
    pub topic: String,
    /// The whole history plus the new question.
    pub messages: Vec<ChatMessage>,
    /// Output tokens to ask for.
    pub max_tokens: u32,
}

impl ChatTurn {
    /// Whether no turn follows this one.
    pub fn is_last(&self) -> bool {
        self.turn >= self.turns
    }
}

struct Live {
    messages: Vec<ChatMessage>,
    turn: u32,
    turns: u32,
    starter: usize,
    rng: ChaCha8Rng,
}

/// The chat workload generator.
pub struct ChatWorkload {
    config: ChatConfig,
    seed: u64,
    starters: Vec<String>,
    live: BTreeMap<u64, Live>,
    next: u64,
}

fn words(rng: &mut ChaCha8Rng, n: usize, out: &mut String) {
    for i in 0..n {
        let w = WORDS[rng.gen_range(0..WORDS.len())];
        if i % 12 == 0 {
            if i > 0 {
                out.push_str(". ");
            }
            let mut c = w.chars();
            if let Some(f) = c.next() {
                out.extend(f.to_uppercase());
                out.push_str(c.as_str());
            }
        } else {
            out.push(' ');
            out.push_str(w);
        }
    }
    out.push('.');
}

impl ChatWorkload {
    /// A workload for `seed` (the starters are built here).
    pub fn new(config: ChatConfig, seed: u64) -> Result<Self, String> {
        config.validate()?;
        let starters = (0..config.starters)
            .map(|i| {
                let mut rng = ChaCha8Rng::seed_from_u64(mix_key(seed ^ 0x5354_4152, i as u64));
                let n = rng.gen_range(config.starter_min_words..=config.starter_max_words);
                let mut s = format!("Document {i}. ");
                words(&mut rng, n, &mut s);
                s
            })
            .collect();
        Ok(Self {
            config,
            seed,
            starters,
            live: BTreeMap::new(),
            next: 0,
        })
    }

    /// The settings.
    pub fn config(&self) -> &ChatConfig {
        &self.config
    }

    /// Conversations open.
    pub fn live(&self) -> usize {
        self.live.len()
    }

    fn question(&self, rng: &mut ChaCha8Rng) -> String {
        let n = rng.gen_range(self.config.question_min_words..=self.config.question_max_words);
        let mut q = ASKS[rng.gen_range(0..ASKS.len())].to_string();
        q.push(' ');
        words(rng, n, &mut q);
        q.pop();
        q.push('?');
        q
    }

    fn turn_of(&self, id: u64, c: &Live) -> ChatTurn {
        let topic: String = self.starters[c.starter]
            .split(' ')
            .take(6)
            .collect::<Vec<_>>()
            .join(" ");
        ChatTurn {
            conversation: id,
            turn: c.turn,
            turns: c.turns,
            starter: c.starter,
            topic,
            messages: c.messages.clone(),
            max_tokens: self.config.max_tokens,
        }
    }

    /// Starts the next conversation and returns its first turn.
    pub fn start(&mut self) -> ChatTurn {
        let id = self.next;
        self.next += 1;
        let mut rng = ChaCha8Rng::seed_from_u64(mix_key(self.seed, id));
        let starter = rng.gen_range(0..self.starters.len());
        let turns = rng.gen_range(self.config.min_turns..=self.config.max_turns);
        let question = self.question(&mut rng);
        let content = format!("{}\n\n{question}", self.starters[starter]);
        let c = Live {
            messages: vec![ChatMessage {
                role: "user".into(),
                content,
            }],
            turn: 1,
            turns,
            starter,
            rng,
        };
        let turn = self.turn_of(id, &c);
        if turns > 1 {
            if self.live.len() >= self.config.max_live {
                self.live.pop_first();
            }
            self.live.insert(id, c);
        }
        turn
    }

    /// The next turn of `conversation` given the model's `answer` to the last one; `None`
    /// when it was the last turn (or the conversation is unknown).
    pub fn follow_up(&mut self, conversation: u64, answer: &str) -> Option<ChatTurn> {
        self.follow_up_with(conversation, answer, None)
    }

    /// [`ChatWorkload::follow_up`] with the user's `question` written elsewhere (e.g. by a
    /// model acting as the user); `None` uses the built-in generator. The generator's stream
    /// advances either way, so the rest of the run does not depend on where questions came
    /// from.
    pub fn follow_up_with(
        &mut self,
        conversation: u64,
        answer: &str,
        question: Option<String>,
    ) -> Option<ChatTurn> {
        let mut c = self.live.remove(&conversation)?;
        let built_in = self.question(&mut c.rng);
        let question = question.unwrap_or(built_in);
        c.messages.push(ChatMessage {
            role: "assistant".into(),
            content: answer.to_string(),
        });
        c.messages.push(ChatMessage {
            role: "user".into(),
            content: question,
        });
        c.turn += 1;
        let turn = self.turn_of(conversation, &c);
        if c.turn < c.turns {
            self.live.insert(conversation, c);
        }
        Some(turn)
    }

    /// Abandons a conversation (its turn failed).
    pub fn end(&mut self, conversation: u64) -> bool {
        self.live.remove(&conversation).is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> ChatConfig {
        ChatConfig {
            starters: 3,
            starter_min_words: 50,
            starter_max_words: 80,
            min_turns: 2,
            max_turns: 3,
            ..ChatConfig::default()
        }
    }

    #[test]
    fn turns_resend_the_history_and_end() {
        let mut w = ChatWorkload::new(small(), 7).unwrap();
        let t1 = w.start();
        assert_eq!((t1.turn, t1.messages.len()), (1, 1));
        let mut last = t1.clone();
        let mut n = 1;
        while let Some(t) = w.follow_up(t1.conversation, "an answer") {
            assert_eq!(t.turn, last.turn + 1);
            assert_eq!(&t.messages[..last.messages.len()], &last.messages[..]);
            assert_eq!(t.messages[last.messages.len()].content, "an answer");
            last = t;
            n += 1;
        }
        assert_eq!(n, t1.turns);
        assert!(last.is_last());
        assert_eq!(w.live(), 0);
    }

    #[test]
    fn conversations_depend_on_the_seed_only() {
        let mut a = ChatWorkload::new(small(), 1).unwrap();
        let mut b = ChatWorkload::new(small(), 1).unwrap();
        let (a0, a1) = (a.start(), a.start());
        let (b0, b1) = (b.start(), b.start());
        // Finishing turns in another order changes nothing.
        let a1f = a.follow_up(1, "x");
        let a0f = a.follow_up(0, "y");
        let b0f = b.follow_up(0, "y");
        let b1f = b.follow_up(1, "x");
        assert_eq!((a0, a1, a0f, a1f), (b0, b1, b0f, b1f));
        let mut c = ChatWorkload::new(small(), 2).unwrap();
        assert_ne!(c.start().messages, a.start().messages);
        assert!(ChatWorkload::new(
            ChatConfig {
                starters: 0,
                ..small()
            },
            1
        )
        .is_err());
    }

    #[test]
    fn a_question_written_elsewhere_replaces_the_built_in_one_only() {
        let config = ChatConfig {
            min_turns: 3,
            max_turns: 3,
            ..small()
        };
        let mut a = ChatWorkload::new(config.clone(), 5).unwrap();
        let mut b = ChatWorkload::new(config, 5).unwrap();
        let (a0, b0) = (a.start(), b.start());
        let a1 = a
            .follow_up_with(a0.conversation, "ans", Some("Why so?".into()))
            .unwrap();
        let b1 = b.follow_up(b0.conversation, "ans").unwrap();
        assert_eq!(a1.messages.last().unwrap().content, "Why so?");
        assert_ne!(b1.messages.last().unwrap().content, "Why so?");
        // The built-in stream advanced the same way in both.
        let a2 = a.follow_up(a0.conversation, "ans2").unwrap();
        let b2 = b.follow_up(b0.conversation, "ans2").unwrap();
        assert_eq!(
            a2.messages.last().unwrap().content,
            b2.messages.last().unwrap().content
        );
    }

    #[test]
    fn conversations_sized_in_tokens_follow_the_simulators_shape() {
        let m = crate::MultiTurnConfig::default();
        let c = ChatConfig::default().sized_like(&m, 2.0);
        assert_eq!((c.starter_min_words, c.starter_max_words), (1_750, 2_000));
        assert_eq!((c.question_min_words, c.question_max_words), (10, 30));
        assert_eq!(
            (c.min_turns, c.max_turns, c.max_tokens),
            (m.min_turns, m.max_turns, m.max_tokens)
        );
        assert!(c.validate().is_ok());
        // A useless ratio leaves tokens as words, never zero.
        let d = ChatConfig::default().sized_like(&m, 0.0);
        assert_eq!(d.starter_min_words, m.starter_min_tokens);
        let (text, n) = c.sample(1).unwrap();
        assert!(
            text.starts_with("Document 0.") && (1_750..=2_002).contains(&n),
            "{n}"
        );
    }
}
