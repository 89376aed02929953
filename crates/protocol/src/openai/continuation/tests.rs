//! Tests of continuations: what a stream carried, the request for the rest, the rest's
//! chunks rewritten.

use super::*;
use crate::openai::parse_request;
use serde_json::json;

fn streamed(payloads: &[Value]) -> Streamed {
    let mut s = Streamed::new();
    for p in payloads {
        s.observe(&p.to_string());
    }
    s
}

fn chat_chunk(content: &str) -> Value {
    json!({"id": "chatcmpl-1", "object": "chat.completion.chunk",
           "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": null}]})
}

fn parsed(endpoint: Endpoint, body: Value) -> (Map<String, Value>, RequestView) {
    parse_request(endpoint, body.to_string().as_bytes(), 1 << 20).unwrap()
}

#[test]
fn a_chat_stream_is_read_for_its_text_id_and_end() {
    let role = json!({"id": "chatcmpl-1", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]});
    let s = streamed(&[
        role,
        chat_chunk("Hel"),
        chat_chunk("lo"),
        json!({"error": {"message": "x"}}),
    ]);
    assert_eq!(
        (s.id(), s.text(), s.chunks()),
        (Some("chatcmpl-1"), "Hello", 2)
    );
    assert!(!s.finished());
    assert_eq!(s.blocked(), None);
    let end = json!({"id": "chatcmpl-1", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]});
    let s = streamed(&[chat_chunk("Hel"), end]);
    assert!(s.finished());
    // A completions stream's text.
    let s = streamed(&[json!({"id": "cmpl-9", "choices": [{"index": 0, "text": "ab"}]})]);
    assert_eq!((s.id(), s.text()), (Some("cmpl-9"), "ab"));
}

#[test]
fn tool_calls_reasoning_and_other_choices_block_a_continuation() {
    let tools = json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0}]}}]});
    assert_eq!(streamed(&[tools]).blocked(), Some(NotContinuable::Tools));
    let think = json!({"choices": [{"index": 0, "delta": {"reasoning_content": "hmm"}}]});
    assert_eq!(
        streamed(&[think]).blocked(),
        Some(NotContinuable::Reasoning)
    );
    let second = json!({"choices": [{"index": 1, "delta": {"content": "x"}}]});
    assert_eq!(streamed(&[second]).blocked(), Some(NotContinuable::Choices));
    let (obj, view) = parsed(
        Endpoint::Chat,
        json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}),
    );
    let s = streamed(&[json!({"choices": [{"index": 0, "delta": {"tool_calls": []}}]})]);
    let carried = Carried {
        streamed: &s,
        tokens: 1,
        token_ids: None,
    };
    assert_eq!(
        continuation(&obj, &view, carried),
        Err(NotContinuable::Tools)
    );
}

#[test]
fn a_chat_answer_continues_as_the_assistants_final_message() {
    let (obj, view) = parsed(
        Endpoint::Chat,
        json!({"model": "m", "messages": [{"role": "user", "content": "hi"}],
               "max_tokens": 10, "min_tokens": 1, "stream": true, "temperature": 0.5}),
    );
    let s = streamed(&[chat_chunk("Hel"), chat_chunk("lo")]);
    let carried = Carried {
        streamed: &s,
        tokens: 2,
        token_ids: None,
    };
    let out = continuation(&obj, &view, carried).unwrap().unwrap();
    assert_eq!(
        Value::Object(out.clone()),
        json!({"model": "m", "stream": true, "temperature": 0.5,
               "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello"}],
               "continue_final_message": true, "add_generation_prompt": false,
               "max_tokens": 8, "min_tokens": 0})
    );
    // The continuation is itself a valid request, continuing the final message; continued
    // again, the new text goes onto the same message.
    let (obj2, view2) = parsed(Endpoint::Chat, Value::Object(out));
    assert!(matches!(view2.input, PromptInput::Continue(_)));
    let s2 = streamed(&[chat_chunk(", you")]);
    let carried = Carried {
        streamed: &s2,
        tokens: 2,
        token_ids: None,
    };
    let out2 = continuation(&obj2, &view2, carried).unwrap().unwrap();
    assert_eq!(out2["messages"][1]["content"], "Hello, you");
    assert_eq!(out2["max_tokens"], 6);
    // Every token asked for already streamed: nothing to continue.
    let carried = Carried {
        streamed: &s,
        tokens: 10,
        token_ids: None,
    };
    assert_eq!(continuation(&obj, &view, carried), Ok(None));
}

#[test]
fn completions_continue_their_text_or_token_ids() {
    let s = streamed(&[json!({"id": "cmpl-1", "choices": [{"index": 0, "text": " world"}]})]);
    let (obj, view) = parsed(
        Endpoint::Completions,
        json!({"model": "m", "prompt": ["Hello"], "max_tokens": 5}),
    );
    let carried = Carried {
        streamed: &s,
        tokens: 1,
        token_ids: None,
    };
    let out = continuation(&obj, &view, carried).unwrap().unwrap();
    assert_eq!(
        (&out["prompt"], &out["max_tokens"]),
        (&json!("Hello world"), &json!(4))
    );
    let (obj, view) = parsed(
        Endpoint::Completions,
        json!({"model": "m", "prompt": [1, 2, 3]}),
    );
    let carried = Carried {
        streamed: &s,
        tokens: 1,
        token_ids: None,
    };
    assert_eq!(
        continuation(&obj, &view, carried),
        Err(NotContinuable::TokenIds)
    );
    let carried = Carried {
        streamed: &s,
        tokens: 1,
        token_ids: Some(&[7, 8]),
    };
    let out = continuation(&obj, &view, carried).unwrap().unwrap();
    assert_eq!(out["prompt"], json!([1, 2, 3, 7, 8]));
    assert!(!out.contains_key("max_tokens"));
    for bad in [
        json!({"n": 2}),
        json!({"best_of": 3}),
        json!({"echo": true}),
    ] {
        let mut body = json!({"model": "m", "prompt": "x"});
        body.as_object_mut()
            .unwrap()
            .extend(bad.as_object().unwrap().clone());
        let (obj, view) = parsed(Endpoint::Completions, body);
        let carried = Carried {
            streamed: &s,
            tokens: 1,
            token_ids: None,
        };
        assert!(continuation(&obj, &view, carried).is_err(), "{obj:?}");
    }
}

#[test]
fn a_continuations_chunks_read_as_the_first_streams() {
    let first = json!({"id": "chatcmpl-new", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]});
    let out: Value = serde_json::from_str(
        &rewrite_continued(&first.to_string(), Some("chatcmpl-1"), 3).unwrap(),
    )
    .unwrap();
    assert_eq!(
        out,
        json!({"id": "chatcmpl-1", "choices": [{"index": 0, "delta": {"content": ""}}]})
    );
    let usage = json!({"id": "chatcmpl-new", "choices": [],
                       "usage": {"prompt_tokens": 13, "completion_tokens": 4, "total_tokens": 17}});
    let out: Value = serde_json::from_str(
        &rewrite_continued(&usage.to_string(), Some("chatcmpl-1"), 3).unwrap(),
    )
    .unwrap();
    assert_eq!(
        out["usage"],
        json!({"prompt_tokens": 10, "completion_tokens": 7, "total_tokens": 17})
    );
    assert_eq!(rewrite_continued("[DONE]", None, 1), None);
    assert_eq!(rewrite_continued("not json", None, 1), None);
}

#[test]
fn continue_final_message_is_checked_like_vllm_checks_it() {
    let ok = json!({"model": "m", "continue_final_message": true, "add_generation_prompt": false,
                    "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "He"}]});
    assert!(matches!(
        parsed(Endpoint::Chat, ok).1.input,
        PromptInput::Continue(_)
    ));
    let both = json!({"model": "m", "continue_final_message": true, "add_generation_prompt": true,
                      "messages": [{"role": "assistant", "content": "He"}]});
    let user_last = json!({"model": "m", "continue_final_message": true,
                           "messages": [{"role": "user", "content": "hi"}]});
    for bad in [both, user_last] {
        let e = parse_request(Endpoint::Chat, bad.to_string().as_bytes(), 100).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("continue_final_message"), "{e:?}");
    }
}

#[test]
fn a_complete_answer_is_closed_with_what_it_did_not_get() {
    // A completions stream with its finish reason but no usage yet, usage asked for.
    let (_, view) = parsed(
        Endpoint::Completions,
        json!({"model": "m", "prompt": "hi", "stream": true, "max_tokens": 2,
               "stream_options": {"include_usage": true}}),
    );
    let s = streamed(&[
        json!({"id": "cmpl-1", "object": "text_completion", "created": 7, "model": "m",
               "choices": [{"index": 0, "text": " a", "finish_reason": null}]}),
        json!({"id": "cmpl-1", "choices": [{"index": 0, "text": " b", "finish_reason": "length"}]}),
    ]);
    let out: Vec<Value> = s
        .closing(&view, 5, 2)
        .iter()
        .map(|c| serde_json::from_str(c).unwrap())
        .collect();
    assert_eq!(
        out,
        [
            json!({"id": "cmpl-1", "object": "text_completion", "created": 7, "model": "m",
                "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}})
        ]
    );
    // Not finished: a finish reason first (completions' form).
    let cut = streamed(&[json!({"id": "cmpl-1", "choices": [{"index": 0, "text": " a"}]})]);
    let out = cut.closing(&view, 5, 2);
    assert_eq!(out.len(), 2);
    assert!(out[0].contains("\"finish_reason\":\"length\"") && out[0].contains("\"text\":\"\""));
    // Usage already sent, or not asked for: nothing more.
    let mut done = s.clone();
    done.observe(
        &json!({"id": "cmpl-1", "choices": [], "usage": {"prompt_tokens": 5}}).to_string(),
    );
    assert!(done.closing(&view, 5, 2).is_empty());
    let (_, quiet) = parsed(
        Endpoint::Completions,
        json!({"model": "m", "prompt": "hi", "stream": true}),
    );
    assert!(s.closing(&quiet, 5, 2).is_empty());
}
