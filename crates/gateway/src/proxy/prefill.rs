//! The prefill leg of a split request (disaggregated prefill), in the engines' protocol
//! (`upstream.kv_transfer`; docs/disaggregation.md).
//!
//! vLLM's (`vllm`): the client's request goes to the prefill worker with `max_tokens: 1`,
//! not streamed, and `kv_transfer_params: {"do_remote_decode": true}`; the
//! `kv_transfer_params` its answer returns (NixlConnector: where the KV is; shared storage:
//! none) go, unchanged, into the decode leg, the client's request as it came. A prefill leg
//! that fails (unreachable, an error status, an answer that is not JSON) costs the request
//! nothing: the decode worker computes the prompt itself (counted in
//! `kvroute_prefill_legs_total{result="failed"}`).
//!
//! SGLang's (`sglang`): both legs at once, the client's request to each with
//! `bootstrap_host` (the prefill worker's host), `bootstrap_port` (its
//! `--disaggregation-bootstrap-port`, the worker's `bootstrap_port`) and a fresh
//! `bootstrap_room` (below 2^63) that pairs them at the prefill worker's bootstrap server;
//! the client gets the decode leg's answer, the prefill leg's is read and dropped. The
//! decode engine waits for its prefill there: a failed prefill leg is counted, and the
//! decode leg ends as SGLang ends it.
//!
//! TensorRT-LLM's (`trtllm`): the context leg is the client's request, not streamed, with
//! `disaggregated_params: {"request_type": "context_only"}`; the generation leg is the
//! client's request with the context answer's `disaggregated_params` (its first choice's:
//! first tokens, context request id, opaque state), `request_type` `generation_only`, and
//! the prompt as the context server's `prompt_token_ids`. A context leg that ended the
//! answer (its one token was the end) or gave no state leaves the prompt to the generation
//! worker, as a failed one does.

use super::{read_body, send, Call};
use crate::gateway::Gateway;
use crate::routing::Prepared;
use bytes::Bytes;
use kvroute_core::policy::RemotePrefill;
use kvroute_fleet::config::{KvTransfer, DEFAULT_BOOTSTRAP_PORT};
use kvroute_protocol::openai::Endpoint;
use serde_json::{json, Map, Value};
use std::hash::{Hash, Hasher};
use std::sync::Arc;

/// The decode leg's body, and the prefill worker's name when its leg succeeded.
pub(super) struct Handoff {
    pub(super) body: Bytes,
    pub(super) prefill_worker: Option<String>,
    /// The prefill leg answered before the decode leg goes (vLLM's and TensorRT-LLM's
    /// protocols): the KV is ready for the decode worker.
    pub(super) kv_sent: bool,
}

/// Runs `call`'s prefill leg on `remote`'s worker (or starts it, in SGLang's protocol);
/// returns what the decode leg sends.
pub(super) async fn run(
    gw: &Arc<Gateway>,
    call: &Call,
    prep: &Prepared,
    remote: &RemotePrefill,
) -> Handoff {
    if gw.config().upstream.kv_transfer == KvTransfer::Sglang {
        return sglang(gw, call, prep, remote);
    }
    let name = super::worker_name(gw, remote.worker);
    match leg(gw, call, prep, remote).await {
        Ok(body) => {
            gw.metrics
                .prefill_legs
                .with_label_values(&[&name, "ok"])
                .inc();
            Handoff {
                body: body.unwrap_or_else(|| call.body.clone()),
                prefill_worker: Some(name),
                kv_sent: true,
            }
        }
        Err(e) => {
            gw.metrics
                .prefill_legs
                .with_label_values(&[&name, "failed"])
                .inc();
            tracing::warn!(worker = %name, error = %e, request_id = %call.request_id, "prefill leg failed; the decode worker computes the prompt");
            Handoff {
                body: call.body.clone(),
                prefill_worker: None,
                kv_sent: false,
            }
        }
    }
}

/// SGLang's legs: the prefill leg started on its own (booked while it runs), the decode
/// leg's body returned at once, both carrying the same bootstrap fields. A body that is not
/// a JSON object, or a prefill worker without a host, is not split.
fn sglang(gw: &Arc<Gateway>, call: &Call, prep: &Prepared, remote: &RemotePrefill) -> Handoff {
    let name = super::worker_name(gw, remote.worker);
    let host = gw.registry.get(remote.worker).and_then(|w| {
        let url = reqwest::Url::parse(&w.spec.url).ok()?;
        let port = w.spec.bootstrap_port.unwrap_or(DEFAULT_BOOTSTRAP_PORT);
        Some((url.host_str()?.trim_matches(['[', ']']).to_string(), port))
    });
    let room = {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        call.request_id.hash(&mut h);
        gw.bookings.next_request().0.hash(&mut h);
        kvroute_core::hashing::splitmix64(h.finish()) & (i64::MAX as u64)
    };
    let body = host.and_then(|(host, port)| bootstrap_body(&call.body, &host, port, room));
    let (Some(body), Ok(mut guard)) = (
        body,
        crate::routing::queue::book_prefill(gw, &prep.prompt, remote),
    ) else {
        gw.metrics
            .prefill_legs
            .with_label_values(&[&name, "failed"])
            .inc();
        tracing::warn!(worker = %name, request_id = %call.request_id, "prefill leg not started (no host, or the body is not a JSON object); the decode worker computes the prompt");
        return Handoff {
            body: call.body.clone(),
            prefill_worker: None,
            kv_sent: false,
        };
    };
    let (gw2, call2, leg_body, worker) = (gw.clone(), call.clone(), body.clone(), remote.worker);
    let leg_name = name.clone();
    tokio::spawn(async move {
        let result = match send(&gw2, &call2, worker, leg_body).await {
            Ok(resp) => {
                let status = resp.status();
                match read_body(&gw2, resp).await {
                    (None, _) if status.is_success() => Ok(()),
                    (None, _) => Err(format!("it answered {status}")),
                    (Some(why), _) => Err(format!("its answer could not be read ({why})")),
                }
            }
            Err(e) => Err(e.to_string()),
        };
        guard.first_token();
        let label = if result.is_ok() { "ok" } else { "failed" };
        gw2.metrics
            .prefill_legs
            .with_label_values(&[&leg_name, label])
            .inc();
        if let Err(e) = result {
            tracing::warn!(worker = %leg_name, error = %e, request_id = %call2.request_id, "prefill leg failed");
        }
    });
    // The decode engine waits for its KV itself: when it came is not known here.
    Handoff {
        body,
        prefill_worker: Some(name),
        kv_sent: false,
    }
}

/// The client's request `body` as `change` edits its fields (None when it is not a JSON
/// object): every leg's body is made this way.
fn edited(body: &[u8], change: impl FnOnce(&mut Map<String, Value>)) -> Option<Bytes> {
    let mut m: Map<String, Value> = serde_json::from_slice(body).ok()?;
    change(&mut m);
    serde_json::to_vec(&m).ok().map(Bytes::from)
}

/// The client's request with SGLang's bootstrap fields (None when it is not a JSON object).
fn bootstrap_body(body: &[u8], host: &str, port: u16, room: u64) -> Option<Bytes> {
    edited(body, |m| {
        m.insert("bootstrap_host".into(), json!(host));
        m.insert("bootstrap_port".into(), json!(port));
        m.insert("bootstrap_room".into(), json!(room));
    })
}

/// The prefill leg, one leg after the other (vLLM's or TensorRT-LLM's protocol): booked on
/// its worker while it runs; the decode leg's body made from its answer (None: the client's
/// request as it came).
async fn leg(
    gw: &Arc<Gateway>,
    call: &Call,
    prep: &Prepared,
    remote: &RemotePrefill,
) -> Result<Option<Bytes>, String> {
    let trtllm = gw.config().upstream.kv_transfer == KvTransfer::Trtllm;
    let body = if trtllm {
        context_body(&call.body)
    } else {
        prefill_body(&call.body)
    }
    .ok_or("the request body is not a JSON object")?;
    let mut guard = crate::routing::queue::book_prefill(gw, &prep.prompt, remote)
        .map_err(|e| format!("not booked: {e}"))?;
    let resp = send(gw, call, remote.worker, body)
        .await
        .map_err(|e| e.to_string())?;
    let status = resp.status();
    let (broken, answer) = read_body(gw, resp).await;
    if let Some(why) = broken {
        return Err(format!("its answer could not be read ({why})"));
    }
    if !status.is_success() {
        return Err(format!("it answered {status}"));
    }
    guard.first_token();
    let answer: Value =
        serde_json::from_slice(&answer).map_err(|e| format!("its answer is not JSON: {e}"))?;
    if trtllm {
        return Ok(generation_body(&call.body, call.view.endpoint, &answer));
    }
    let params = answer
        .get("kv_transfer_params")
        .filter(|p| !p.is_null())
        .cloned();
    Ok(decode_body(&call.body, params))
}

/// The client's request as TensorRT-LLM's context leg: `disaggregated_params` of a
/// `context_only` request, not streamed (None when the body is not a JSON object).
fn context_body(body: &[u8]) -> Option<Bytes> {
    edited(body, |m| {
        m.insert("stream".into(), json!(false));
        m.remove("stream_options");
        m.insert(
            "disaggregated_params".into(),
            json!({"request_type": "context_only"}),
        );
    })
}

/// TensorRT-LLM's generation leg from the context leg's `answer`: the client's request with
/// the first choice's `disaggregated_params` as a `generation_only` request and the prompt
/// as the context server's `prompt_token_ids` (`prompt` of a completion, `prompt_token_ids`
/// beside a chat's messages). None (the client's request as it came, its prompt computed
/// by the generation worker) when the context leg gave no parameters, or ended for another
/// reason than its length (its one token was the whole answer).
fn generation_body(body: &[u8], endpoint: Endpoint, answer: &Value) -> Option<Bytes> {
    let choice = answer.get("choices")?.get(0)?;
    let finish = choice.get("finish_reason").and_then(Value::as_str);
    if !matches!(finish, None | Some("length" | "not_finished")) {
        return None;
    }
    let mut params = choice.get("disaggregated_params")?.as_object()?.clone();
    params.insert("request_type".into(), json!("generation_only"));
    edited(body, |m| {
        m.insert("disaggregated_params".into(), Value::Object(params));
        if let Some(ids) = answer.get("prompt_token_ids").filter(|v| v.is_array()) {
            let field = match endpoint {
                Endpoint::Completions => "prompt",
                Endpoint::Chat => "prompt_token_ids",
            };
            m.insert(field.into(), ids.clone());
        }
    })
}

/// The client's request as a prefill leg: one token, not streamed, the engine told to keep
/// the KV for a decode elsewhere. None when the body is not a JSON object.
fn prefill_body(body: &[u8]) -> Option<Bytes> {
    edited(body, |m| {
        m.insert("max_tokens".into(), json!(1));
        if m.contains_key("max_completion_tokens") {
            m.insert("max_completion_tokens".into(), json!(1));
        }
        m.insert("stream".into(), json!(false));
        for k in ["stream_options", "min_tokens", "min_completion_tokens"] {
            m.remove(k);
        }
        m.insert(
            "kv_transfer_params".into(),
            json!({
                "do_remote_decode": true,
                "do_remote_prefill": false,
                "remote_engine_id": null,
                "remote_block_ids": null,
                "remote_host": null,
                "remote_port": null,
            }),
        );
    })
}

/// The decode leg's body: the client's request with the prefill answer's
/// `kv_transfer_params`, unchanged (None: the client's request as it is).
fn decode_body(body: &[u8], params: Option<Value>) -> Option<Bytes> {
    let params = params?;
    edited(body, |m| {
        m.insert("kv_transfer_params".into(), params);
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(b: &[u8]) -> Value {
        serde_json::from_slice(b).unwrap()
    }

    #[test]
    fn the_prefill_leg_asks_for_one_token_unstreamed_and_keeps_the_kv() {
        let client = br#"{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":64,"max_completion_tokens":64,"stream":true,"stream_options":{"include_usage":true},"min_tokens":4,"temperature":0}"#;
        let p = parse(&prefill_body(client).unwrap());
        assert_eq!(
            (&p["max_tokens"], &p["max_completion_tokens"]),
            (&json!(1), &json!(1))
        );
        assert_eq!(p["stream"], false);
        assert!(p.get("stream_options").is_none() && p.get("min_tokens").is_none());
        assert_eq!(p["kv_transfer_params"]["do_remote_decode"], true);
        assert_eq!(p["kv_transfer_params"]["do_remote_prefill"], false);
        assert_eq!((&p["model"], &p["temperature"]), (&json!("m"), &json!(0)));
        // A completions body without max_completion_tokens gets none.
        let p = parse(&prefill_body(br#"{"model":"m","prompt":"x"}"#).unwrap());
        assert!(p.get("max_completion_tokens").is_none());
        assert!(prefill_body(b"[1,2]").is_none());
    }

    #[test]
    fn the_decode_leg_carries_the_prefill_answers_parameters_unchanged() {
        let client = br#"{"model":"m","prompt":"x","max_tokens":64,"stream":true}"#;
        // NixlConnector's answer, as a real vLLM 0.32 CPU engine gave it (fields beyond
        // these pass through as they are).
        let params = json!({"do_remote_prefill": true, "do_remote_decode": false,
            "remote_block_ids": [[1, 2, 3]], "remote_engine_id": "e-1", "remote_host": "127.0.0.1",
            "remote_port": 24201, "transfer_mode": "pull", "remote_prefill_cached_tokens": 0});
        let d = parse(&decode_body(client, Some(params.clone())).unwrap());
        assert_eq!(d["kv_transfer_params"], params);
        assert_eq!((&d["max_tokens"], &d["stream"]), (&json!(64), &json!(true)));
        // The shared-storage connector returns none: the request goes as it came.
        assert!(decode_body(client, None).is_none());
    }

    #[test]
    fn sglangs_legs_carry_the_prefill_servers_bootstrap_address_and_one_room() {
        // The fields SGLang's OpenAI requests take "for PD disaggregation"
        // (python/sglang/srt/entrypoints/openai/protocol.py: `bootstrap_host`,
        // `bootstrap_port`, `bootstrap_room`, each a value or a list per prompt).
        let client = br#"{"model":"m","prompt":"x","max_tokens":64,"stream":true}"#;
        let b =
            parse(&bootstrap_body(client, "10.0.0.5", 8998, 5_577_006_791_947_779_410).unwrap());
        assert_eq!(
            (
                &b["bootstrap_host"],
                &b["bootstrap_port"],
                &b["bootstrap_room"]
            ),
            (
                &json!("10.0.0.5"),
                &json!(8998),
                &json!(5_577_006_791_947_779_410u64)
            )
        );
        assert_eq!((&b["max_tokens"], &b["stream"]), (&json!(64), &json!(true)));
        assert!(bootstrap_body(b"\"text\"", "h", 1, 1).is_none());
    }

    #[test]
    fn tensorrt_llms_generation_leg_carries_the_context_state_and_the_prompts_token_ids() {
        let client = br#"{"model":"m","prompt":"Hello","max_tokens":64,"stream":true,"stream_options":{"include_usage":true}}"#;
        let c = parse(&context_body(client).unwrap());
        assert_eq!(
            c["disaggregated_params"],
            json!({"request_type": "context_only"})
        );
        assert_eq!(
            (&c["stream"], &c["max_tokens"]),
            (&json!(false), &json!(64))
        );
        assert!(c.get("stream_options").is_none());
        // The context answer's shape (tensorrt_llm/serve/openai_protocol.py).
        let state = json!({"request_type": "context_only", "first_gen_tokens": [727],
            "ctx_request_id": 1001, "encoded_opaque_state": "AAECAw==", "draft_tokens": null});
        let answer = json!({"prompt_token_ids": [1, 15043], "choices": [{"index": 0, "text": " there",
            "finish_reason": "length", "disaggregated_params": state}]});
        let g = parse(&generation_body(client, Endpoint::Completions, &answer).unwrap());
        let mut want = state.clone();
        want["request_type"] = json!("generation_only");
        assert_eq!(g["disaggregated_params"], want);
        assert_eq!(g["prompt"], json!([1, 15043]));
        assert_eq!((&g["stream"], &g["max_tokens"]), (&json!(true), &json!(64)));
        // A chat keeps its messages, the token ids beside them.
        let chat = br#"{"model":"m","messages":[{"role":"user","content":"Hello"}]}"#;
        let g = parse(&generation_body(chat, Endpoint::Chat, &answer).unwrap());
        assert_eq!(g["prompt_token_ids"], json!([1, 15043]));
        assert_eq!(g["messages"][0]["content"], "Hello");
        // Ended by its first token, or without parameters: no generation leg of its own.
        let mut ended = answer.clone();
        ended["choices"][0]["finish_reason"] = json!("stop");
        assert!(generation_body(client, Endpoint::Completions, &ended).is_none());
        assert!(
            generation_body(client, Endpoint::Completions, &json!({"choices": [{}]})).is_none()
        );
    }

    #[test]
    fn a_real_prefill_answer_of_the_shared_storage_connector_gives_no_parameters() {
        let answer = include_str!("../../../cli/tests/fixtures/vllm-pd/resp_prefill.json");
        let v: Value = serde_json::from_str(answer).unwrap();
        assert!(v["kv_transfer_params"].is_null());
        assert_eq!(v["usage"]["completion_tokens"], 1);
    }
}
