//! `POST /v1/chat/completions` and `POST /v1/completions`: read and check the request,
//! turn the prompt into token ids (chat template, tokenizer, or the ids given), submit it to
//! the engine driver, and answer with one JSON body or a stream ([`crate::stream`]).

use crate::driver::{Command, Reply};
use crate::http::{driver_gone, error_response, json_response, read_body, AppState, RequestTag};
use crate::stream::{sse_response, StreamCtx};
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::Extension;
use kvroute_core::{Namespace, RequestId};
use kvroute_engine::{EngineError, EngineRequest, Finished};
use kvroute_protocol::openai::{
    parse_request, ApiError, ChatChoice, ChatCompletion, ChatMessageOut, Completion,
    CompletionChoice, Endpoint, ErrorKind, PromptInput, Usage,
};
use serde_json::Value;
use tokio::sync::mpsc;

/// `POST /v1/chat/completions`.
pub(crate) async fn chat(
    State(s): State<AppState>,
    Extension(tag): Extension<RequestTag>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    generate(s, Endpoint::Chat, tag, headers, body)
        .await
        .unwrap_or_else(|e| error_response(&e))
}

/// `POST /v1/completions`.
pub(crate) async fn completions(
    State(s): State<AppState>,
    Extension(tag): Extension<RequestTag>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    generate(s, Endpoint::Completions, tag, headers, body)
        .await
        .unwrap_or_else(|e| error_response(&e))
}

/// Sends `Abort` for its request when dropped armed: the handler or the stream holding it
/// went away before the request completed (client gone).
pub(crate) struct AbortGuard {
    id: RequestId,
    commands: mpsc::Sender<Command>,
    armed: bool,
}

impl AbortGuard {
    /// The request completed: nothing to abort.
    pub(crate) fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for AbortGuard {
    fn drop(&mut self) {
        if self.armed {
            // When the command queue is full, the driver still notices at the request's next
            // token (its channel is closed).
            let _ = self.commands.try_send(Command::Abort { id: self.id });
        }
    }
}

/// The request's own `priority` (vLLM's field: an integer, lower served first), refused
/// when not 0 unless the engine schedules by priority, as vLLM refuses it.
fn engine_priority(
    obj: &serde_json::Map<String, Value>,
    policy: crate::config::SchedulingPolicy,
) -> Result<i32, ApiError> {
    let p = match obj.get("priority") {
        None | Some(Value::Null) => return Ok(0),
        Some(v) => v
            .as_i64()
            .and_then(|p| i32::try_from(p).ok())
            .ok_or_else(|| {
                ApiError::invalid_param("priority", "priority must be a 32-bit integer")
            })?,
    };
    if p != 0 && policy != crate::config::SchedulingPolicy::Priority {
        return Err(ApiError::invalid_param(
            "priority",
            format!("priority {p} given, but this engine does not schedule by priority (--scheduling-policy priority)"),
        ));
    }
    Ok(p)
}

async fn generate(
    s: AppState,
    endpoint: Endpoint,
    tag: RequestTag,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let bytes = read_body(
        &headers,
        body,
        s.cfg.max_body_bytes,
        kvroute_runtime::BODY_READ_TIMEOUT,
    )
    .await?;
    let (obj, view) = parse_request(endpoint, &bytes, s.cfg.max_prompt_tokens)?;
    // The base model, or one of its LoRA adapters (whose blocks are its own), named alone
    // (vLLM) or as `base:adapter` (SGLang).
    let adapter = |name: &str| s.cfg.lora_adapters.iter().any(|a| a == name);
    let lora = if view.model == s.cfg.model {
        None
    } else if adapter(&view.model) {
        Some(view.model.as_str())
    } else {
        match view.model.rsplit_once(':') {
            Some((base, a)) if base == s.cfg.model && adapter(a) => Some(a),
            _ => return Err(ApiError::model_not_found(&view.model)),
        }
    };
    match obj.get("n") {
        None | Some(Value::Null) => {}
        Some(n) if n.as_u64() == Some(1) => {}
        Some(_) => return Err(ApiError::invalid_param("n", "only `n` = 1 is supported")),
    }
    let priority = engine_priority(&obj, s.cfg.scheduling_policy)?;
    let leg = crate::kv_transfer::leg(&obj, s.cfg.role)?;
    let tokens = prompt_tokens(&s, view.input).await?;
    if tokens.len() > s.cfg.max_prompt_tokens {
        return Err(
            ApiError::prompt_too_long(tokens.len(), s.cfg.max_prompt_tokens).with_param(
                match endpoint {
                    Endpoint::Chat => "messages",
                    Endpoint::Completions => "prompt",
                },
            ),
        );
    }
    let max_tokens = match leg {
        // A context server (a prefill server) generates the first token only.
        crate::kv_transfer::Leg::Prefill(
            crate::kv_transfer::Protocol::Trtllm | crate::kv_transfer::Protocol::Sglang,
        ) => 1,
        _ => view.max_tokens.unwrap_or(s.cfg.default_max_tokens),
    };
    let (id, hex) = s.ids.next();
    let salt = view.cache_salt.as_deref().filter(|t| !t.is_empty());
    let namespace = Namespace::new(lora, salt);
    s.hub.name(namespace, lora, salt);
    let remote_tokens =
        crate::kv_transfer::receive((&s.cfg, &s.clock, &s.http), &leg, tokens.len()).await?;
    let prefill_leg = match leg {
        crate::kv_transfer::Leg::Prefill(protocol) => Some(crate::kv_transfer::PrefillLeg {
            protocol,
            engine: s.cfg.worker_name.clone(),
            prompt: match protocol {
                crate::kv_transfer::Protocol::Trtllm => tokens.clone(),
                _ => Vec::new(),
            },
            handover: match protocol {
                crate::kv_transfer::Protocol::Sglang => obj
                    .get("bootstrap_room")
                    .and_then(serde_json::Value::as_u64)
                    .map(|room| (s.rooms.clone(), room)),
                _ => None,
            },
        }),
        _ => None,
    };
    let request = EngineRequest {
        id,
        prompt: kvroute_engine::EnginePrompt::Tokens(tokens),
        max_tokens,
        namespace,
        remote_tokens,
        priority,
    };
    let (rx, guard) = submit(&s, request, view.stream).await?;
    let public_id = match endpoint {
        Endpoint::Chat => format!("chatcmpl-{hex}"),
        Endpoint::Completions => format!("cmpl-{hex}"),
    };
    tracing::debug!(
        worker = %s.cfg.worker_name,
        request = %id,
        id = %public_id,
        x_request_id = ?tag.0,
        endpoint = endpoint.label(),
        stream = view.stream,
        max_tokens,
        "accepted"
    );
    let ctx = StreamCtx {
        id: public_id,
        created: crate::http::unix_now(),
        model: s.cfg.model.clone(),
        endpoint,
        include_usage: view.include_usage,
        max_tokens,
        text: s.text.clone(),
        prefill_leg,
    };
    // A prefill leg is answered whole (SGLang's is sent as the client asked; its answer is
    // dropped, and its end hands the room over).
    if view.stream && ctx.prefill_leg.is_none() {
        return Ok(sse_response(ctx, rx, guard));
    }
    collect(ctx, rx, guard).await
}

/// The prompt's token ids, tokenized on the preprocessor's pool
/// (`kvroute_preprocess::Preprocessor::prompt_tokens_pooled`).
async fn prompt_tokens(s: &AppState, input: PromptInput) -> Result<Vec<u32>, ApiError> {
    s.pre
        .prompt_tokens_pooled(input)
        .await
        .map_err(|e| e.to_api_error())
}

/// The answer to an engine refusal: 503 (with `Retry-After`) when the queue is full, 400
/// otherwise (`context_length_exceeded` when prompt plus `max_tokens` exceed the KV cache).
fn engine_error(e: &EngineError) -> ApiError {
    match e {
        EngineError::QueueFull(_) => ApiError::unavailable("queue_full", e.to_string(), 1),
        EngineError::TooLong { .. } => {
            ApiError::invalid(e.to_string()).with_code("context_length_exceeded")
        }
        _ => ApiError::invalid(e.to_string()),
    }
}

/// Submits a request and waits for the engine to accept it.
async fn submit(
    s: &AppState,
    request: EngineRequest,
    stream: bool,
) -> Result<(mpsc::UnboundedReceiver<Reply>, AbortGuard), ApiError> {
    let (reply, mut rx) = mpsc::unbounded_channel();
    let id = request.id;
    let cmd = Command::Submit {
        request,
        reply,
        stream,
    };
    s.commands.send(cmd).await.map_err(|_| driver_gone())?;
    // Armed from here: if this handler is dropped while waiting, the request is aborted.
    let guard = AbortGuard {
        id,
        commands: s.commands.clone(),
        armed: true,
    };
    match rx.recv().await {
        Some(Reply::Accepted) => Ok((rx, guard)),
        Some(Reply::Rejected(e)) => {
            let mut guard = guard;
            guard.disarm();
            Err(engine_error(&e))
        }
        Some(_) | None => Err(driver_gone()),
    }
}

/// Waits for the completion and answers with one JSON body.
async fn collect(
    ctx: StreamCtx,
    mut rx: mpsc::UnboundedReceiver<Reply>,
    mut guard: AbortGuard,
) -> Result<Response, ApiError> {
    let finished = loop {
        match rx.recv().await {
            Some(Reply::Finished(f)) => break f,
            Some(_) => continue,
            None => return Err(driver_gone()),
        }
    };
    guard.disarm();
    let answer = match ctx.endpoint {
        Endpoint::Chat => serde_json::to_value(chat_completion(&ctx, &finished)),
        Endpoint::Completions => serde_json::to_value(completion(&ctx, &finished)),
    };
    let mut answer = answer.map_err(|e| ApiError::new(ErrorKind::Internal, e.to_string()))?;
    if let Some(leg) = &ctx.prefill_leg {
        crate::kv_transfer::annotate(&mut answer, leg, &ctx.id, &finished);
    }
    let body = serde_json::to_string(&answer)
        .map_err(|e| ApiError::new(ErrorKind::Internal, e.to_string()))?;
    Ok(json_response(StatusCode::OK, body))
}

/// The usage of a completed request.
pub(crate) fn usage(f: &Finished) -> Usage {
    Usage::new(
        f.prompt_tokens as u64,
        f.output.len() as u64,
        f.cached_tokens as u64,
    )
}

fn chat_completion(ctx: &StreamCtx, f: &Finished) -> ChatCompletion {
    ChatCompletion {
        id: ctx.id.clone(),
        object: "chat.completion".into(),
        created: ctx.created,
        model: ctx.model.clone(),
        choices: vec![ChatChoice {
            index: 0,
            message: ChatMessageOut {
                role: "assistant".into(),
                content: ctx.text.text(&f.output),
            },
            finish_reason: Some("length".into()),
        }],
        usage: Some(usage(f)),
    }
}

fn completion(ctx: &StreamCtx, f: &Finished) -> Completion {
    Completion {
        id: ctx.id.clone(),
        object: "text_completion".into(),
        created: ctx.created,
        model: ctx.model.clone(),
        choices: vec![CompletionChoice {
            index: 0,
            text: ctx.text.text(&f.output),
            finish_reason: Some("length".into()),
        }],
        usage: Some(usage(f)),
    }
}
