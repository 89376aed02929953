//! A follow-up turn finds the previous answer cached: the worker's answer, sent back in the
//! history and rendered by the chat template, tokenizes to the ids its engine cached, so
//! turn 2 prefills only its new message, the template's tokens and one partial block.

use crate::support::*;
use kvroute_preprocess::Preprocessor;

/// Turn 1's answer, streamed: the content of its chunks, and its completion tokens.
async fn streamed_answer(url: &str, messages: &[(&str, &str)], max_tokens: u32) -> (String, u64) {
    let r = client()
        .post(format!("{url}/v1/chat/completions"))
        .json(&chat(messages, true, max_tokens))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    let (mut answer, mut tokens) = (String::new(), 0);
    for data in text.lines().filter_map(|l| l.strip_prefix("data: ")) {
        if data == "[DONE]" {
            break;
        }
        let chunk: serde_json::Value = serde_json::from_str(data).unwrap();
        if let Some(piece) = chunk["choices"][0]["delta"]["content"].as_str() {
            answer.push_str(piece);
        }
        if let Some(n) = chunk["usage"]["completion_tokens"].as_u64() {
            tokens = n;
        }
    }
    (answer, tokens)
}

/// Tokens of `messages` as the builtin chat template renders them with the generation
/// prompt.
fn rendered_tokens(pre: &Preprocessor, messages: &[(&str, &str)]) -> usize {
    let messages: Vec<_> = messages
        .iter()
        .map(|(r, c)| serde_json::json!({"role": r, "content": c}))
        .collect();
    pre.encode(&pre.render_chat(&messages, true).unwrap())
        .unwrap()
        .len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follow_up_turn_prefills_only_its_new_message() {
    const ANSWER_TOKENS: u32 = 200;
    const BLOCK: u64 = 16;
    let (a, b) = (worker("a").await, worker("b").await);
    let gw = gateway(&[&a, &b], config(&[&a, &b], "kv")).await;
    let url = gw.url();
    let system = "You are a careful assistant who explains inference systems. ".repeat(12);
    let turn1 = [("system", system.as_str()), ("user", "What is a KV cache?")];
    let (answer, tokens) = streamed_answer(&url, &turn1, ANSWER_TOKENS).await;
    assert_eq!(tokens, u64::from(ANSWER_TOKENS));
    // Turn 1's blocks (prompt and answer) reach the gateway's index, so turn 2 follows them.
    assert!(
        eventually(10, async || {
            index_blocks(&url, 0).await + index_blocks(&url, 1).await > 0
        })
        .await
    );
    let question = "And why does routing matter when the fleet is busy?";
    let turn2 = [
        turn1[0],
        turn1[1],
        ("assistant", answer.as_str()),
        ("user", question),
    ];
    let (status, _, json) = post(&url, "/v1/chat/completions", &chat(&turn2, false, 8)).await;
    assert_eq!(status, 200, "{json}");
    let prompt = json["usage"]["prompt_tokens"].as_u64().unwrap();
    let cached = json["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    // What turn 2 adds besides the answer: the template's tokens closing the answer and
    // wrapping the new message, and the message itself.
    let pre = Preprocessor::builtin();
    let first = rendered_tokens(&pre, &turn1) as u64;
    let added = rendered_tokens(
        &pre,
        &[turn1[0], turn1[1], ("assistant", ""), ("user", question)],
    ) as u64
        - first;
    eprintln!(
        "turn 2: {cached} of {prompt} prompt tokens cached ({} uncached; turn 1 {first} \
         prompt + {tokens} answer tokens, {added} added)",
        prompt - cached
    );
    // The answer tokenizes to as many tokens as the engine wrote...
    assert_eq!(prompt, first + tokens + added, "{answer}");
    // ...and they are the ones it cached.
    assert!(
        prompt - cached <= added + BLOCK,
        "turn 2 prefilled {} tokens, at most {added} + a partial block of {BLOCK} expected",
        prompt - cached
    );
    gw.shutdown().await;
    a.shutdown().await;
    b.shutdown().await;
}
