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

use super::{read_body, send, Call};
use crate::gateway::Gateway;
use crate::routing::Prepared;
use bytes::Bytes;
use kvroute_core::policy::RemotePrefill;
use kvroute_fleet::config::{KvTransfer, DEFAULT_BOOTSTRAP_PORT};
use serde_json::{json, Map, Value};
use std::hash::{Hash, Hasher};
use std::sync::Arc;

/// The decode leg's body, and the prefill worker's name when its leg succeeded.
pub(super) struct Handoff {
    pub(super) body: Bytes,
    pub(super) prefill_worker: Option<String>,
}

/// Runs `call`'s prefill leg on `remote`'s worker (or starts it, in SGLang's protocol);
/// returns what the decode leg sends.
pub(super) async fn run(
    gw: &Arc<Gateway>,
    call: &Call,
    prep: &Prepared,
    remote: &RemotePrefill,
) -> Handoff {
    if gw.config.upstream.kv_transfer == KvTransfer::Sglang {
        return sglang(gw, call, prep, remote);
    }
    let name = super::worker_name(gw, remote.worker);
    match leg(gw, call, prep, remote).await {
        Ok(params) => {
            gw.metrics
                .prefill_legs
                .with_label_values(&[&name, "ok"])
                .inc();
            Handoff {
                body: decode_body(&call.body, params).unwrap_or_else(|| call.body.clone()),
                prefill_worker: Some(name),
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
    Handoff {
        body,
        prefill_worker: Some(name),
    }
}

/// The client's request with SGLang's bootstrap fields (None when it is not a JSON object).
fn bootstrap_body(body: &[u8], host: &str, port: u16, room: u64) -> Option<Bytes> {
    let mut m: Map<String, Value> = serde_json::from_slice(body).ok()?;
    m.insert("bootstrap_host".into(), json!(host));
    m.insert("bootstrap_port".into(), json!(port));
    m.insert("bootstrap_room".into(), json!(room));
    serde_json::to_vec(&m).ok().map(Bytes::from)
}

/// The prefill leg: booked on its worker while it runs; the answer's `kv_transfer_params`
/// (None when it gives none).
async fn leg(
    gw: &Arc<Gateway>,
    call: &Call,
    prep: &Prepared,
    remote: &RemotePrefill,
) -> Result<Option<Value>, String> {
    let body = prefill_body(&call.body).ok_or("the request body is not a JSON object")?;
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
    Ok(answer
        .get("kv_transfer_params")
        .filter(|p| !p.is_null())
        .cloned())
}

/// The client's request as a prefill leg: one token, not streamed, the engine told to keep
/// the KV for a decode elsewhere. None when the body is not a JSON object.
fn prefill_body(body: &[u8]) -> Option<Bytes> {
    let mut m: Map<String, Value> = serde_json::from_slice(body).ok()?;
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
    serde_json::to_vec(&m).ok().map(Bytes::from)
}

/// The decode leg's body: the client's request with the prefill answer's
/// `kv_transfer_params`, unchanged (None: the client's request as it is).
fn decode_body(body: &[u8], params: Option<Value>) -> Option<Bytes> {
    let params = params?;
    let mut m: Map<String, Value> = serde_json::from_slice(body).ok()?;
    m.insert("kv_transfer_params".into(), params);
    serde_json::to_vec(&m).ok().map(Bytes::from)
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
    fn a_real_prefill_answer_of_the_shared_storage_connector_gives_no_parameters() {
        let answer = include_str!("../../../cli/tests/fixtures/vllm-pd/resp_prefill.json");
        let v: Value = serde_json::from_str(answer).unwrap();
        assert!(v["kv_transfer_params"].is_null());
        assert_eq!(v["usage"]["completion_tokens"], 1);
    }
}
