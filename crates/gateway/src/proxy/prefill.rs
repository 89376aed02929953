//! The prefill leg of a split request (disaggregated prefill), in vLLM's protocol
//! (`upstream.kv_transfer = "vllm"`; docs/disaggregation.md): the client's request goes to
//! the prefill worker with `max_tokens: 1`, not streamed, and
//! `kv_transfer_params: {"do_remote_decode": true}`; the `kv_transfer_params` its answer
//! returns (NixlConnector: where the KV is; shared storage: none) go, unchanged, into the
//! decode leg, the client's request as it came. A prefill leg that fails (unreachable, an
//! error status, an answer that is not JSON) costs the request nothing: the decode worker
//! computes the prompt itself (counted in `kvroute_prefill_legs_total{result="failed"}`).

use super::{read_body, send, Call};
use crate::gateway::Gateway;
use crate::routing::Prepared;
use bytes::Bytes;
use kvroute_core::policy::RemotePrefill;
use serde_json::{json, Map, Value};
use std::sync::Arc;

/// The decode leg's body, and the prefill worker's name when its leg succeeded.
pub(super) struct Handoff {
    pub(super) body: Bytes,
    pub(super) prefill_worker: Option<String>,
}

/// Runs `call`'s prefill leg on `remote`'s worker; returns what the decode leg sends.
pub(super) async fn run(
    gw: &Arc<Gateway>,
    call: &Call,
    prep: &Prepared,
    remote: &RemotePrefill,
) -> Handoff {
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
    fn a_real_prefill_answer_of_the_shared_storage_connector_gives_no_parameters() {
        let answer = include_str!("../../../cli/tests/fixtures/vllm-pd/resp_prefill.json");
        let v: Value = serde_json::from_str(answer).unwrap();
        assert!(v["kv_transfer_params"].is_null());
        assert_eq!(v["usage"]["completion_tokens"], 1);
    }
}
