//! The engines' disaggregated-prefill protocols, spoken by the simulated worker in either
//! role (docs/disaggregation.md).
//!
//! vLLM's: a request whose `kv_transfer_params` say `do_remote_decode` is
//! a prefill leg (its prompt computed here, its KV kept for a decode worker to pull), and
//! its answer carries `kv_transfer_params` as NixlConnector's do (`do_remote_prefill`, this
//! engine's id, host and port, the blocks, the prefix it found cached); a request whose
//! `kv_transfer_params` say `do_remote_prefill` is a decode leg: the worker waits the
//! modelled transfer of the prompt's KV (the link's latency plus the prompt's tokens at its
//! bytes per token over its bandwidth, in the engine's virtual time) and admits it with that
//! KV (`EngineRequest::remote_tokens`): written where its cache lacks it, cached and
//! announced in its KV events, reported as cached, as vLLM reports KV a connector loaded.
//!
//! TensorRT-LLM's: a request whose `disaggregated_params` say `request_type: context_only`
//! is a prefill leg: it generates its first token and its answer's first choice carries
//! `disaggregated_params` (the first token, the context request's id, an opaque state) and
//! the answer the prompt's `prompt_token_ids`; one saying `generation_only` is a decode
//! leg, admitted as vLLM's is.
//!
//! SGLang's: both legs come at once with `bootstrap_host`, `bootstrap_port` and
//! `bootstrap_room`. On a prefill worker the leg is a prefill leg (its first token only,
//! answered whole); when it ends, its room is handed over. On a decode worker it is a
//! decode leg: the worker asks the prefill worker named by `bootstrap_host` and
//! `bootstrap_port` (its HTTP port stands for SGLang's bootstrap server:
//! `GET /kvroute/bootstrap/{room}`, 200 once handed over) until the room is ready, then
//! waits the modelled transfer and admits the prompt with its KV. A worker that does both
//! serves such a request whole, as an SGLang server not started for disaggregation does.
//!
//! A prefill-only worker refuses decode legs and a decode-only worker prefill legs (400).

use crate::config::WorkerConfig;
use kvroute_core::WorkerRole;
use kvroute_engine::Finished;
use kvroute_protocol::openai::ApiError;
use serde_json::{json, Map, Value};
use std::time::Duration;

/// What a request asks of this worker in a disaggregated fleet.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Leg {
    /// A whole request (no `kv_transfer_params`, or neither flag set).
    Whole,
    /// A prefill leg: compute the prompt, keep its KV for the decode worker.
    Prefill(Protocol),
    /// A decode leg: the prompt's KV comes from the prefill worker these parameters name.
    Decode(Map<String, Value>),
    /// SGLang's decode leg: the prompt's KV comes once the prefill worker at `host:port`
    /// has handed over `room`.
    DecodeWhenReady { host: String, port: u16, room: u64 },
}

/// A prefill leg in progress: what its answer will carry.
#[derive(Clone, Debug)]
pub(crate) struct PrefillLeg {
    pub(crate) protocol: Protocol,
    /// This worker's name, the engine id the answer gives.
    pub(crate) engine: String,
    /// The prompt's token ids (TensorRT-LLM's answer hands them on; empty for vLLM's).
    pub(crate) prompt: Vec<u32>,
    /// SGLang's: the room handed over when the leg ends.
    pub(crate) handover: Option<(std::sync::Arc<Rooms>, u64)>,
}

/// Most rooms remembered as handed over (the oldest forgotten first).
const MAX_ROOMS: usize = 100_000;

/// SGLang's bootstrap rooms this prefill worker has handed over (bounded).
#[derive(Debug, Default)]
pub(crate) struct Rooms {
    ready: parking_lot::Mutex<(
        std::collections::HashSet<u64>,
        std::collections::VecDeque<u64>,
    )>,
}

impl Rooms {
    /// `room`'s KV is ready for its decode worker.
    pub(crate) fn hand_over(&self, room: u64) {
        let mut g = self.ready.lock();
        let (set, order) = &mut *g;
        if set.insert(room) {
            order.push_back(room);
            if order.len() > MAX_ROOMS {
                if let Some(old) = order.pop_front() {
                    set.remove(&old);
                }
            }
        }
        drop(g);
    }

    /// Whether `room` was handed over.
    pub(crate) fn is_ready(&self, room: u64) -> bool {
        self.ready.lock().0.contains(&room)
    }
}

/// Longest a decode leg waits for its room to be handed over.
const HANDOVER_WAIT: Duration = Duration::from_secs(120);
/// Between two asks of the prefill worker.
const HANDOVER_POLL: Duration = Duration::from_millis(5);

/// Waits until the prefill worker at `host:port` has handed over `room` (asking it every
/// few milliseconds, for at most two minutes).
pub(crate) async fn await_handover(
    http: &reqwest::Client,
    host: &str,
    port: u16,
    room: u64,
) -> Result<(), ApiError> {
    let url = format!("http://{host}:{port}/kvroute/bootstrap/{room}");
    let deadline = tokio::time::Instant::now() + HANDOVER_WAIT;
    loop {
        if let Ok(r) = http.get(&url).send().await {
            if r.status().is_success() {
                return Ok(());
            }
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(ApiError::unavailable(
                "prefill_not_handed_over",
                format!("the prefill worker at {host}:{port} never handed over room {room}"),
                1,
            ));
        }
        tokio::time::sleep(HANDOVER_POLL).await;
    }
}

/// Whose protocol a leg speaks (what its answer carries).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Protocol {
    Vllm,
    Trtllm,
    Sglang,
}

/// The leg `body` asks for, checked against what `role` serves.
pub(crate) fn leg(body: &Map<String, Value>, role: WorkerRole) -> Result<Leg, ApiError> {
    if let Some(room) = body.get("bootstrap_room").filter(|v| !v.is_null()) {
        return sglang_leg(body, room, role);
    }
    let leg = match body.get("disaggregated_params") {
        None | Some(Value::Null) => vllm_leg(body)?,
        Some(Value::Object(p)) => match p.get("request_type").and_then(Value::as_str) {
            Some("context_only") => Leg::Prefill(Protocol::Trtllm),
            Some("generation_only") => Leg::Decode(p.clone()),
            Some("context_and_generation") | None => Leg::Whole,
            Some(other) => {
                return Err(ApiError::invalid_param(
                    "disaggregated_params",
                    format!("request_type {other:?} is not one of context_only, generation_only, context_and_generation"),
                ))
            }
        },
        Some(_) => {
            return Err(ApiError::invalid_param(
                "disaggregated_params",
                "disaggregated_params must be an object",
            ))
        }
    };
    let refused = match (&leg, role) {
        (Leg::Prefill(_), WorkerRole::Decode) => Some("this worker decodes only: no prefill legs"),
        (Leg::Decode(_) | Leg::DecodeWhenReady { .. }, WorkerRole::Prefill) => {
            Some("this worker prefills only: no decode legs")
        }
        _ => None,
    };
    match refused {
        Some(why) => Err(ApiError::invalid(why.to_string())),
        None => Ok(leg),
    }
}

/// SGLang's leg: a prefill leg on a prefill worker, a decode leg on a decode worker, whole
/// on one that does both.
fn sglang_leg(body: &Map<String, Value>, room: &Value, role: WorkerRole) -> Result<Leg, ApiError> {
    let bad = |field: &str, why: &str| Err(ApiError::invalid_param(field, why));
    let Some(room) = room.as_u64() else {
        return bad(
            "bootstrap_room",
            "bootstrap_room must be an unsigned integer",
        );
    };
    let host = body
        .get("bootstrap_host")
        .and_then(Value::as_str)
        .unwrap_or("");
    let port = body
        .get("bootstrap_port")
        .and_then(Value::as_u64)
        .and_then(|p| u16::try_from(p).ok());
    Ok(match role {
        WorkerRole::Both => Leg::Whole,
        WorkerRole::Prefill => Leg::Prefill(Protocol::Sglang),
        WorkerRole::Decode => {
            let Some(port) = port.filter(|p| *p > 0) else {
                return bad("bootstrap_port", "bootstrap_port must be a port number");
            };
            if host.is_empty() || host.len() > 253 {
                return bad(
                    "bootstrap_host",
                    "bootstrap_host must name the prefill server",
                );
            }
            Leg::DecodeWhenReady {
                host: host.to_string(),
                port,
                room,
            }
        }
    })
}

/// vLLM's leg: from `kv_transfer_params`.
fn vllm_leg(body: &Map<String, Value>) -> Result<Leg, ApiError> {
    let params = match body.get("kv_transfer_params") {
        None | Some(Value::Null) => return Ok(Leg::Whole),
        Some(Value::Object(p)) => p,
        Some(_) => {
            return Err(ApiError::invalid_param(
                "kv_transfer_params",
                "kv_transfer_params must be an object",
            ))
        }
    };
    let flag = |name: &str| params.get(name).and_then(Value::as_bool).unwrap_or(false);
    Ok(
        match (flag("do_remote_decode"), flag("do_remote_prefill")) {
            (true, true) => {
                return Err(ApiError::invalid_param(
                    "kv_transfer_params",
                    "do_remote_decode and do_remote_prefill cannot both be true",
                ))
            }
            (true, false) => Leg::Prefill(Protocol::Vllm),
            (false, true) => Leg::Decode(params.clone()),
            (false, false) => Leg::Whole,
        },
    )
}

/// Adds what a prefill leg's answer carries in `protocol` to `answer` (a completion or chat
/// completion as JSON): vLLM's `kv_transfer_params` (named for `engine`, with the prefix it
/// found cached), or TensorRT-LLM's first choice's `disaggregated_params` and the answer's
/// `prompt_token_ids`.
pub(crate) fn annotate(answer: &mut Value, leg: &PrefillLeg, request: &str, done: &Finished) {
    let engine = leg.engine.as_str();
    match leg.protocol {
        Protocol::Vllm => {
            if let Some(m) = answer.as_object_mut() {
                let params = produced(engine, request, done.cached_tokens);
                m.insert("kv_transfer_params".into(), params);
            }
        }
        Protocol::Sglang => {
            if let Some((rooms, room)) = &leg.handover {
                rooms.hand_over(*room);
            }
        }
        Protocol::Trtllm => {
            if let Some(choice) = answer
                .get_mut("choices")
                .and_then(|c| c.get_mut(0))
                .and_then(Value::as_object_mut)
            {
                choice.insert(
                    "disaggregated_params".into(),
                    json!({
                        "request_type": "context_only",
                        "first_gen_tokens": done.output,
                        "ctx_request_id": request,
                        "encoded_opaque_state": engine,
                        "draft_tokens": null,
                    }),
                );
            }
            if let Some(m) = answer.as_object_mut() {
                m.insert("prompt_token_ids".into(), json!(leg.prompt));
            }
        }
    }
}

/// The `kv_transfer_params` a prefill leg's answer carries: where the decode worker pulls
/// the KV from (NixlConnector's fields; this worker's name as the engine id).
pub(crate) fn produced(engine: &str, request: &str, cached_tokens: usize) -> Value {
    json!({
        "do_remote_prefill": true,
        "do_remote_decode": false,
        "remote_engine_id": engine,
        "remote_request_id": request,
        "remote_block_ids": [],
        "remote_host": null,
        "remote_port": null,
        "remote_prefill_cached_tokens": cached_tokens,
        "transfer_mode": "pull",
    })
}

/// Waits until a decode leg's prompt KV (`tokens` of it) has arrived: for SGLang's, until
/// its room is handed over, then, for every decode leg, the modelled transfer on the
/// worker's clock. The prompt tokens sent with the request (0 for any other leg).
pub(crate) async fn receive(
    (cfg, clock, http): (&WorkerConfig, &kvroute_runtime::Clock, &reqwest::Client),
    leg: &Leg,
    tokens: usize,
) -> Result<usize, ApiError> {
    match leg {
        Leg::Decode(_) => {}
        Leg::DecodeWhenReady { host, port, room } => {
            await_handover(http, host, *port, *room).await?;
        }
        Leg::Whole | Leg::Prefill(_) => return Ok(0),
    }
    let arrives = clock.now().plus(transfer_time(cfg, tokens));
    tokio::time::sleep_until(clock.instant(arrives)).await;
    tracing::debug!(worker = %cfg.worker_name, tokens, "KV of a remote prefill received");
    Ok(tokens)
}

/// The modelled time a decode leg's `tokens` of prompt KV take to arrive (virtual time).
pub(crate) fn transfer_time(cfg: &WorkerConfig, tokens: usize) -> Duration {
    let secs = cfg.kv_link_latency_secs + tokens as f64 * cfg.kv_secs_per_token();
    Duration::from_secs_f64(secs.clamp(0.0, 3600.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn legs_are_read_from_the_parameters_and_checked_against_the_role() {
        let both = WorkerRole::Both;
        assert_eq!(leg(&body(json!({})), both).unwrap(), Leg::Whole);
        assert_eq!(
            leg(&body(json!({"kv_transfer_params": null})), both).unwrap(),
            Leg::Whole
        );
        let prefill = body(
            json!({"kv_transfer_params": {"do_remote_decode": true, "do_remote_prefill": false}}),
        );
        assert_eq!(leg(&prefill, both).unwrap(), Leg::Prefill(Protocol::Vllm));
        assert!(leg(&prefill, WorkerRole::Decode).is_err());
        let decode = body(
            json!({"kv_transfer_params": {"do_remote_prefill": true, "remote_engine_id": "p"}}),
        );
        assert!(matches!(
            leg(&decode, WorkerRole::Decode).unwrap(),
            Leg::Decode(_)
        ));
        assert!(leg(&decode, WorkerRole::Prefill).is_err());
        assert!(leg(&body(json!({"kv_transfer_params": 3})), both).is_err());
        let both_flags = body(
            json!({"kv_transfer_params": {"do_remote_decode": true, "do_remote_prefill": true}}),
        );
        assert!(leg(&both_flags, both).is_err());
        // TensorRT-LLM's.
        let ctx = body(json!({"disaggregated_params": {"request_type": "context_only"}}));
        assert_eq!(leg(&ctx, both).unwrap(), Leg::Prefill(Protocol::Trtllm));
        assert!(leg(&ctx, WorkerRole::Decode).is_err());
        let gen = body(
            json!({"disaggregated_params": {"request_type": "generation_only", "ctx_request_id": "c"}}),
        );
        assert!(matches!(
            leg(&gen, WorkerRole::Decode).unwrap(),
            Leg::Decode(_)
        ));
        assert!(leg(&gen, WorkerRole::Prefill).is_err());
        let odd = body(json!({"disaggregated_params": {"request_type": "later"}}));
        assert!(leg(&odd, both).is_err());
    }

    #[test]
    fn rooms_handed_over_are_remembered_within_a_bound() {
        let rooms = Rooms::default();
        assert!(!rooms.is_ready(7));
        rooms.hand_over(7);
        rooms.hand_over(7);
        assert!(rooms.is_ready(7));
        for r in 100..100 + MAX_ROOMS as u64 {
            rooms.hand_over(r);
        }
        assert!(!rooms.is_ready(7), "the oldest forgotten first");
        assert!(rooms.is_ready(100) && rooms.is_ready(99 + MAX_ROOMS as u64));
        assert_eq!(rooms.ready.lock().0.len(), MAX_ROOMS);
    }

    #[test]
    fn a_transfer_takes_the_links_latency_and_the_prompts_bytes() {
        let cfg = WorkerConfig {
            kv_bytes_per_token: Some(100_000.0),
            kv_link_bytes_per_sec: 1e9,
            kv_link_latency_secs: 0.002,
            ..WorkerConfig::default()
        };
        // 1,000 tokens x 100 kB at 1 GB/s = 0.1 s, plus 2 ms.
        assert_eq!(transfer_time(&cfg, 1_000), Duration::from_secs_f64(0.102));
    }
}
