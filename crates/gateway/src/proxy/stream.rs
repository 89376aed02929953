//! A streamed answer on its way to the client. The gateway watches it (first token,
//! inter-token gaps, usage; the ledger's prefill booking released at the first token) and,
//! when the worker's stream breaks off or goes silent after the client got its `200`, either
//! ends it with an error event or — mid-stream migration — carries it on: the request goes
//! to another worker as a continuation of what the client already has (the prompt plus the
//! streamed text, [`kvroute_protocol::openai::continuation`]), and that worker's chunks are
//! rewritten to read as the same answer (same `id`, no second role, usage counted from the
//! original prompt). While migration is possible the stream is passed on event by event
//! (`data:` lines re-framed), so a chunk cut in half by a dying worker never reaches the
//! client; otherwise the worker's bytes go through untouched.

use super::watch::Watch;
use super::{send, start_reading, worker_name, Call, Prediction, ReadBody};
use crate::error::GatewayError;
use crate::gateway::Gateway;
use crate::routing::{admit, LedgerGuard, Prepared};
use axum::http::StatusCode;
use bytes::Bytes;
use futures_util::stream::BoxStream;
use futures_util::StreamExt;

use kvroute_core::WorkerId;
use kvroute_protocol::openai::continuation::{continuation, rewrite_continued, Carried, Streamed};
use kvroute_protocol::openai::{PromptInput, SseEvent};
use std::sync::Arc;

type Upstream = BoxStream<'static, reqwest::Result<Bytes>>;

/// The stream to send the client: the worker's (`first` chunk already read, then `rest`),
/// watched, and migrated when it fails and `call` allows it.
pub(super) fn relay(
    gw: &Arc<Gateway>,
    call: Arc<Call>,
    prep: Arc<Prepared>,
    guard: LedgerGuard,
    (first, rest): (Bytes, Upstream),
    prediction: Prediction,
) -> impl futures_util::Stream<Item = Result<Bytes, std::io::Error>> {
    let class = {
        let (flows, flow) = gw.flow_now(prep.identity.flow, prep.identity.generation);
        flows.class(flow.class).name.clone()
    };
    let watch = Watch::new(
        gw.clone(),
        guard,
        (call.view.model.clone(), class),
        call.started,
        prediction,
    );
    let migration = if call.migrate {
        Ok(Migration {
            left: gw.config().upstream.migration_limit,
            streamed: Streamed::new(),
            carried: 0,
            continued: false,
            call,
            prep,
        })
    } else {
        Err("off")
    };
    let relay = Relay {
        gw: gw.clone(),
        up: upstream(first, rest),
        watch,
        migration,
        over: false,
    };
    futures_util::stream::unfold(relay, |mut r| async move {
        let bytes = r.next().await?;
        Some((Ok(bytes), r))
    })
}

fn upstream(first: Bytes, rest: Upstream) -> Upstream {
    futures_util::stream::once(async move { Ok(first) })
        .filter(|c: &reqwest::Result<Bytes>| {
            std::future::ready(c.as_ref().map_or(true, |b| !b.is_empty()))
        })
        .chain(rest)
        .boxed()
}

/// The stream's state between chunks.
struct Relay {
    gw: Arc<Gateway>,
    up: Upstream,
    watch: Watch,
    /// What migrating needs, or why the stream cannot migrate (a metric label).
    migration: Result<Migration, &'static str>,
    over: bool,
}

/// A request that may be carried on elsewhere.
struct Migration {
    call: Arc<Call>,
    prep: Arc<Prepared>,
    /// What the client has been sent.
    streamed: Streamed,
    /// Migrations left.
    left: u32,
    /// Tokens the current worker's stream carries on from.
    carried: u32,
    /// The current worker's stream is a continuation (its chunks are rewritten).
    continued: bool,
}

/// How a worker's stream failed.
struct Failure {
    kind: &'static str,
    message: String,
    timeout: bool,
}

impl Relay {
    /// The next bytes for the client; `None` at the end.
    async fn next(&mut self) -> Option<Bytes> {
        loop {
            if self.over {
                return None;
            }
            let idle = self.watch.idle;
            let failure = match tokio::time::timeout(idle, self.up.next()).await {
                Ok(Some(Ok(chunk))) => {
                    let out = self.pass(chunk);
                    if out.is_empty() {
                        continue;
                    }
                    return Some(out);
                }
                Ok(None) => {
                    self.over = true;
                    let tail = self.end_of_stream();
                    self.watch.end(StatusCode::OK);
                    return (!tail.is_empty()).then_some(tail);
                }
                Ok(Some(Err(e))) => Failure {
                    kind: "stream_broken",
                    message: format!("its stream broke off: {e}"),
                    timeout: false,
                },
                Err(_) => Failure {
                    kind: "stream_idle",
                    message: format!("its stream sent nothing for {idle:?}"),
                    timeout: true,
                },
            };
            let failed = self.watch.worker_failed(failure.kind, &failure.message);
            if let Some(end) = self.carry_on(failed, failure).await {
                self.over = true;
                return Some(end);
            }
        }
    }

    /// A chunk of the worker's stream, watched; what of it goes to the client.
    fn pass(&mut self, chunk: Bytes) -> Bytes {
        let Ok(m) = &mut self.migration else {
            self.watch.observe(&chunk, |_| {});
            return chunk;
        };
        let mut out = Vec::with_capacity(chunk.len() + 16);
        let understood = self.watch.observe(&chunk, |ev| reframe(m, ev, &mut out));
        if !understood {
            // Not a stream the gateway can read: passed on untouched from here, and not
            // migrated.
            self.migration = Err("unsupported");
            out.extend_from_slice(&chunk);
        }
        Bytes::from(out)
    }

    /// The worker's stream ended: an event it did not close with a blank line.
    fn end_of_stream(&mut self) -> Bytes {
        let mut tail = Vec::new();
        let mut events = Vec::new();
        let _ = self.watch.parser.finish(&mut events);
        if let Ok(m) = &mut self.migration {
            for ev in &events {
                reframe(m, ev, &mut tail);
            }
        }
        Bytes::from(tail)
    }

    /// The worker's stream failed: move it to another worker when allowed and possible
    /// (`None`: the new stream is in place); else the last bytes to send the client.
    async fn carry_on(&mut self, failed: Option<WorkerId>, failure: Failure) -> Option<Bytes> {
        let result = match &mut self.migration {
            Err(why) => Err(*why),
            Ok(m) => migrate(&self.gw, m, failed).await,
        };
        let mut closing = Vec::new();
        let outcome = match result {
            Ok(Moved::To(up, guard)) => {
                self.watch
                    .switch(guard, self.migration.as_ref().map_or(0, |m| m.carried));
                self.up = up;
                "migrated"
            }
            Ok(Moved::Complete(tokens)) => {
                if let Ok(m) = &self.migration {
                    let prompt = m.prep.prompt.tokens as u64;
                    for chunk in m.streamed.closing(&m.call.view, prompt, u64::from(tokens)) {
                        closing.extend_from_slice(b"data: ");
                        closing.extend_from_slice(chunk.as_bytes());
                        closing.extend_from_slice(b"\n\n");
                    }
                }
                "complete"
            }
            Err(why) => why,
        };
        self.gw
            .metrics
            .migrations
            .with_label_values(&[outcome])
            .inc();
        match outcome {
            "migrated" => None,
            "complete" => {
                // The client has every token: the stream ends as a whole answer, with the
                // finish reason and usage it did not get yet.
                self.watch.end(StatusCode::OK);
                closing.extend_from_slice(b"data: [DONE]\n\n");
                Some(Bytes::from(closing))
            }
            _ => {
                let err = self.watch.give_up(failure.message, failure.timeout);
                Some(Bytes::from(format!("data: {}\n\n", err.to_json())))
            }
        }
    }
}

/// One event of the worker's stream, as the client gets it: read into what was streamed and,
/// from a continuation, rewritten to read as the first stream; framed as `data:` lines.
fn reframe(m: &mut Migration, ev: &SseEvent, out: &mut Vec<u8>) {
    let payload = match ev {
        SseEvent::Done => {
            out.extend_from_slice(b"data: [DONE]\n\n");
            return;
        }
        SseEvent::Data(d) => d,
    };
    m.streamed.observe(payload);
    let rewritten = m
        .continued
        .then(|| rewrite_continued(payload, m.streamed.id(), m.carried))
        .flatten();
    for line in rewritten.as_deref().unwrap_or(payload).split('\n') {
        out.extend_from_slice(b"data: ");
        out.extend_from_slice(line.as_bytes());
        out.push(b'\n');
    }
    out.push(b'\n');
}

/// Where a migration went.
enum Moved {
    /// Another worker's stream carries the answer on.
    To(Upstream, LedgerGuard),
    /// Nothing was left to generate: the answer has this many tokens.
    Complete(u32),
}

/// Re-issues `m`'s request as a continuation to a worker other than `failed`, trying others
/// while migrations are left. `Err` is why it could not (a metric label).
async fn migrate(
    gw: &Arc<Gateway>,
    m: &mut Migration,
    failed: Option<WorkerId>,
) -> Result<Moved, &'static str> {
    let call = &m.call;
    if m.streamed.finished() {
        return Ok(Moved::Complete(m.streamed.chunks()));
    }
    if m.left == 0 {
        return Err("limit");
    }
    let text = m.streamed.text();
    // Engines send about a token per chunk; the tokenizer's count guards against engines
    // that send several (the token limits are never exceeded by undercounting).
    let encoded = if gw.preprocessor.is_approximate() {
        None
    } else {
        gw.preprocessor.encode_pooled(text.to_owned()).await.ok()
    };
    let tokens = m
        .streamed
        .chunks()
        .max(encoded.as_ref().map_or(0, |ids| ids.len() as u32));
    let obj = serde_json::from_slice(&call.body).map_err(|_| "unsupported")?;
    let carried = Carried {
        streamed: &m.streamed,
        tokens,
        token_ids: encoded
            .as_deref()
            .filter(|_| matches!(call.view.input, PromptInput::Tokens(_))),
    };
    let body = match continuation(&obj, &call.view, carried) {
        Ok(Some(body)) => body,
        Ok(None) => {
            // At its token limit: the engine wrote exactly that many (the count of the text
            // may differ from the engine's by re-tokenizing).
            let limit = ["max_tokens", "max_completion_tokens"]
                .iter()
                .filter_map(|k| obj.get(*k).and_then(serde_json::Value::as_u64))
                .min()
                .map_or(tokens, |l| u32::try_from(l).unwrap_or(u32::MAX));
            return Ok(Moved::Complete(tokens.min(limit)));
        }
        Err(e) => {
            tracing::warn!(request_id = %call.request_id, reason = %e, "a broken stream cannot be carried on");
            return Err("unsupported");
        }
    };
    let body = Bytes::from(serde_json::to_vec(&body).map_err(|_| "unsupported")?);
    let next = Call {
        body: body.clone(),
        started: gw.now(),
        explain: false,
        ..(**call).clone()
    };
    let mut eligible = kvroute_core::Eligible::except(failed);
    while m.left > 0 {
        m.left -= 1;
        let Ok((_, guard, _)) = admit(gw, &m.prep, &eligible, false, next.started).await else {
            return Err("failed");
        };
        let worker = guard.worker;
        let name = worker_name(gw, worker);
        let stream = match send(gw, &next, worker, body.clone()).await {
            Ok(resp) if resp.status().is_success() => match start_reading(gw, &next, resp).await {
                Ok(read) => match read.body {
                    ReadBody::Stream { first, rest } => Ok(upstream(first, rest)),
                    ReadBody::Whole(..) => Err("answered without a stream".to_string()),
                },
                Err(e) => Err(e),
            },
            Ok(resp) => Err(format!("answered {}", resp.status())),
            Err(e) => {
                if matches!(e, GatewayError::Upstream { timeout: false, .. }) {
                    gw.workers.take_out(worker, "connection failed");
                }
                Err(e.to_string())
            }
        };
        match stream {
            Ok(up) => {
                let from = failed.map(|w| worker_name(gw, w));
                tracing::info!(request_id = %call.request_id, from = ?from, to = %name, carried_tokens = tokens, "stream migrated");
                m.carried = tokens;
                m.continued = true;
                return Ok(Moved::To(up, guard));
            }
            Err(e) => {
                gw.metrics
                    .upstream_errors
                    .with_label_values(&[&name, "migration"])
                    .inc();
                tracing::warn!(request_id = %call.request_id, worker = %name, error = %e, "a continuation failed");
                eligible = eligible.after_failure(worker);
            }
        }
    }
    Err("failed")
}
