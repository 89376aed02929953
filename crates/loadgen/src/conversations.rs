//! The conversations a live load ran, for the dashboard's list and detail views: status,
//! topic, turns, timing, and the transcript with each turn's measures. Bounded: at most
//! `max_conversations` are kept (the oldest ended ones go first) and every message is cut to
//! `max_message_bytes`.

use serde::Serialize;
use std::collections::BTreeMap;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// Where a conversation stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS))]
#[serde(rename_all = "snake_case")]
pub enum ConversationStatus {
    /// A turn is in flight or about to be sent.
    Active,
    /// Every planned turn completed (or the run's time was up after a completed turn).
    Completed,
    /// A turn failed or was refused; the conversation ended there.
    Error,
    /// The load was stopped while a turn was in flight.
    Stopped,
}

/// One turn as the dashboard shows it.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS))]
pub struct TurnView {
    /// The turn number, from 1.
    pub turn: u32,
    /// `completed`, `failed` or `rejected`; `in_flight` while it runs.
    pub status: String,
    /// Why it failed or was refused.
    pub error: Option<String>,
    /// Time to first token, in milliseconds.
    pub ttft_ms: Option<f64>,
    /// Mean gap between tokens, in milliseconds.
    pub itl_ms: Option<f64>,
    /// Time per output token after the first, in milliseconds.
    pub tpot_ms: Option<f64>,
    /// From sending to the last token, in milliseconds.
    pub latency_ms: Option<f64>,
    /// Prompt tokens.
    pub input_tokens: u64,
    /// Prompt tokens the engine had cached.
    pub cached_tokens: u64,
    /// Prompt tokens the router predicted cached (when the server says).
    pub predicted_cached_tokens: Option<u64>,
    /// Tokens generated.
    pub output_tokens: u64,
    /// The worker that served it (when the server says).
    pub worker: Option<String>,
    /// The worker that computed its prompt, when another than `worker` did (disaggregated
    /// prefill; when the server says).
    pub prefill_worker: Option<String>,
    /// Why the router chose it (when the server says).
    pub route: Option<crate::turn::RouteExplanation>,
    /// The user's message of this turn (cut to the store's limit).
    pub user: String,
    /// The answer (cut to the store's limit).
    pub assistant: String,
}

/// A conversation in the list.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS))]
pub struct ConversationSummary {
    /// Its number, in start order.
    pub id: u64,
    /// Where it stands.
    pub status: ConversationStatus,
    /// A short topic line.
    pub topic: String,
    /// Turns sent so far.
    pub turns: u32,
    /// Turns planned.
    pub planned_turns: u32,
    /// When it started, in milliseconds since the Unix epoch.
    pub started_unix_ms: u64,
    /// How long it ran (so far), in milliseconds.
    pub duration_ms: f64,
    /// The last error, if any.
    pub error: Option<String>,
}

/// A conversation with its transcript: its list entry's fields, with `turns` the turns
/// themselves (not flattened from [`ConversationSummary`]: its count of turns would be a second
/// `turns` key in the same JSON object).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS))]
pub struct ConversationDetail {
    /// Its number, in start order.
    pub id: u64,
    /// Where it stands.
    pub status: ConversationStatus,
    /// A short topic line.
    pub topic: String,
    /// Turns planned.
    pub planned_turns: u32,
    /// When it started, in milliseconds since the Unix epoch.
    pub started_unix_ms: u64,
    /// How long it ran (so far), in milliseconds.
    pub duration_ms: f64,
    /// The last error, if any.
    pub error: Option<String>,
    /// Its turns so far, in order.
    pub turns: Vec<TurnView>,
}

#[derive(Debug)]
struct Conversation {
    status: ConversationStatus,
    topic: String,
    planned_turns: u32,
    started: Instant,
    started_unix_ms: u64,
    ended: Option<Instant>,
    error: Option<String>,
    turns: Vec<TurnView>,
}

/// The bounded store of conversations.
#[derive(Debug)]
pub struct Conversations {
    max_conversations: usize,
    max_message_bytes: usize,
    map: BTreeMap<u64, Conversation>,
}

/// `text` cut to at most `max` bytes on a character boundary, saying how much was cut.
pub fn truncate(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… [{} more bytes]", &text[..end], text.len() - end)
}

/// Now, in milliseconds since the Unix epoch (0 if the clock is before it).
pub(crate) fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Conversations {
    /// A store of at most `max_conversations` (at least one), messages cut to
    /// `max_message_bytes`.
    pub fn new(max_conversations: usize, max_message_bytes: usize) -> Self {
        Self {
            max_conversations: max_conversations.max(1),
            max_message_bytes,
            map: BTreeMap::new(),
        }
    }

    /// Conversations kept.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether none is kept.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Conversations active now.
    pub fn active(&self) -> usize {
        self.map
            .values()
            .filter(|c| c.status == ConversationStatus::Active)
            .count()
    }

    /// A turn of conversation `id` is being sent with the user message `user`; the
    /// conversation is created on its first turn.
    pub fn begin_turn(&mut self, id: u64, turn: u32, planned: u32, topic: &str, user: &str) {
        if !self.map.contains_key(&id) {
            self.make_room();
            self.map.insert(
                id,
                Conversation {
                    status: ConversationStatus::Active,
                    topic: truncate(topic, 200),
                    planned_turns: planned,
                    started: Instant::now(),
                    started_unix_ms: unix_ms(),
                    ended: None,
                    error: None,
                    turns: Vec::new(),
                },
            );
        }
        let max = self.max_message_bytes;
        if let Some(c) = self.map.get_mut(&id) {
            c.turns.push(TurnView {
                turn,
                status: "in_flight".into(),
                error: None,
                ttft_ms: None,
                itl_ms: None,
                tpot_ms: None,
                latency_ms: None,
                input_tokens: 0,
                cached_tokens: 0,
                predicted_cached_tokens: None,
                output_tokens: 0,
                worker: None,
                prefill_worker: None,
                route: None,
                user: truncate(user, max),
                assistant: String::new(),
            });
        }
    }

    /// The turn in flight of `id` ended as `view` (its `user` is kept from
    /// [`Conversations::begin_turn`]); `ended` says whether the conversation ends with it and
    /// how.
    pub fn end_turn(&mut self, id: u64, mut view: TurnView, ended: Option<ConversationStatus>) {
        let max = self.max_message_bytes;
        let Some(c) = self.map.get_mut(&id) else {
            return;
        };
        if let Some(last) = c.turns.last_mut().filter(|t| t.turn == view.turn) {
            view.user = std::mem::take(&mut last.user);
            view.assistant = truncate(&view.assistant, max);
            if view.error.is_some() {
                c.error = view.error.clone();
            }
            *last = view;
        }
        if let Some(status) = ended {
            c.status = status;
            c.ended = Some(Instant::now());
        }
    }

    /// Conversation `id` ended without another turn (e.g. the load stopped between turns or
    /// its turn was cancelled).
    pub fn end(&mut self, id: u64, status: ConversationStatus) {
        if let Some(c) = self.map.get_mut(&id) {
            if c.status == ConversationStatus::Active {
                c.status = status;
                c.ended = Some(Instant::now());
                if let Some(last) = c.turns.last_mut().filter(|t| t.status == "in_flight") {
                    last.status = "cancelled".into();
                }
            }
        }
    }

    /// Drops the oldest ended conversation (or the oldest of all) while the store is full.
    fn make_room(&mut self) {
        while self.map.len() >= self.max_conversations {
            let oldest_ended = self
                .map
                .iter()
                .find(|(_, c)| c.status != ConversationStatus::Active)
                .map(|(&id, _)| id);
            let Some(id) = oldest_ended.or_else(|| self.map.keys().next().copied()) else {
                return;
            };
            self.map.remove(&id);
        }
    }

    fn summary(id: u64, c: &Conversation, now: Instant) -> ConversationSummary {
        ConversationSummary {
            id,
            status: c.status,
            topic: c.topic.clone(),
            turns: c.turns.len() as u32,
            planned_turns: c.planned_turns,
            started_unix_ms: c.started_unix_ms,
            duration_ms: c
                .ended
                .unwrap_or(now)
                .duration_since(c.started)
                .as_secs_f64()
                * 1e3,
            error: c.error.clone(),
        }
    }

    /// The newest `limit` conversations, newest first.
    pub fn list(&self, limit: usize) -> Vec<ConversationSummary> {
        let now = Instant::now();
        self.map
            .iter()
            .rev()
            .take(limit)
            .map(|(&id, c)| Self::summary(id, c, now))
            .collect()
    }

    /// The newest `limit` conversations that have a completed follow-up turn (the "how it
    /// works" page's example), newest first.
    pub fn list_with_followup(&self, limit: usize) -> Vec<ConversationSummary> {
        let now = Instant::now();
        self.map
            .iter()
            .rev()
            .filter(|(_, c)| {
                c.turns
                    .iter()
                    .any(|t| t.turn > 1 && t.status == "completed")
            })
            .take(limit)
            .map(|(&id, c)| Self::summary(id, c, now))
            .collect()
    }

    /// One conversation with its transcript.
    pub fn get(&self, id: u64) -> Option<ConversationDetail> {
        let c = self.map.get(&id)?;
        let s = Self::summary(id, c, Instant::now());
        Some(ConversationDetail {
            id: s.id,
            status: s.status,
            topic: s.topic,
            planned_turns: s.planned_turns,
            started_unix_ms: s.started_unix_ms,
            duration_ms: s.duration_ms,
            error: s.error,
            turns: c.turns.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn done(turn: u32, answer: &str) -> TurnView {
        TurnView {
            turn,
            status: "completed".into(),
            error: None,
            ttft_ms: Some(12.0),
            itl_ms: Some(3.0),
            tpot_ms: Some(3.0),
            latency_ms: Some(40.0),
            input_tokens: 100,
            cached_tokens: 64,
            predicted_cached_tokens: Some(64),
            output_tokens: 10,
            worker: Some("w0".into()),
            prefill_worker: None,
            route: None,
            user: String::new(),
            assistant: answer.into(),
        }
    }

    #[test]
    fn a_conversation_keeps_its_transcript_and_status() {
        let mut s = Conversations::new(10, 1000);
        s.begin_turn(7, 1, 2, "Document 3", "first question");
        assert_eq!(s.active(), 1);
        assert_eq!(s.get(7).unwrap().turns[0].status, "in_flight");
        s.end_turn(7, done(1, "first answer"), None);
        s.begin_turn(7, 2, 2, "Document 3", "second question");
        s.end_turn(
            7,
            done(2, "second answer"),
            Some(ConversationStatus::Completed),
        );
        let d = s.get(7).unwrap();
        assert_eq!(d.status, ConversationStatus::Completed);
        assert_eq!((d.turns.len(), d.planned_turns), (2, 2));
        // One `turns` key: the transcript.
        let json = serde_json::to_string(&d).unwrap();
        assert_eq!(json.matches("\"turns\":").count(), 1, "{json}");
        assert!(json.contains("\"turns\":[{"), "{json}");
        assert_eq!(d.turns[0].user, "first question");
        assert_eq!(d.turns[1].assistant, "second answer");
        assert_eq!(d.turns[1].cached_tokens, 64);
        assert_eq!(s.active(), 0);
        assert!(s.get(8).is_none());
    }

    #[test]
    fn errors_and_stops_end_a_conversation() {
        let mut s = Conversations::new(10, 1000);
        s.begin_turn(1, 1, 3, "t", "q");
        let mut failed = done(1, "");
        failed.status = "rejected".into();
        failed.error = Some("all_workers_busy".into());
        s.end_turn(1, failed, Some(ConversationStatus::Error));
        assert_eq!(s.get(1).unwrap().error.as_deref(), Some("all_workers_busy"));
        s.begin_turn(2, 1, 3, "t", "q");
        s.end(2, ConversationStatus::Stopped);
        let d = s.get(2).unwrap();
        assert_eq!(d.status, ConversationStatus::Stopped);
        assert_eq!(d.turns[0].status, "cancelled");
        // Ending an ended conversation again changes nothing.
        s.end(1, ConversationStatus::Stopped);
        assert_eq!(s.get(1).unwrap().status, ConversationStatus::Error);
    }

    #[test]
    fn the_store_is_bounded_and_forgets_ended_conversations_first() {
        let mut s = Conversations::new(3, 1000);
        s.begin_turn(0, 1, 2, "t", "q"); // stays active
        for id in 1..3 {
            s.begin_turn(id, 1, 1, "t", "q");
            s.end_turn(id, done(1, "a"), Some(ConversationStatus::Completed));
        }
        s.begin_turn(3, 1, 1, "t", "q");
        assert_eq!(s.len(), 3);
        // 1 was the oldest ended one; the active 0 is kept.
        let ids: Vec<u64> = s.list(10).iter().map(|c| c.id).collect();
        assert_eq!(ids, vec![3, 2, 0]);
        assert_eq!(s.list(1).len(), 1);
    }

    #[test]
    fn long_messages_are_cut_on_a_character_boundary() {
        let mut s = Conversations::new(3, 5);
        s.begin_turn(0, 1, 1, "t", "héllo world");
        s.end_turn(0, done(1, "ééééé"), Some(ConversationStatus::Completed));
        let d = s.get(0).unwrap();
        assert_eq!(d.turns[0].user, "héll… [7 more bytes]");
        assert_eq!(d.turns[0].assistant, "éé… [6 more bytes]");
    }
}
