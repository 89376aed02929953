use super::*;

fn chat(body: &str) -> Result<RequestView, ApiError> {
    parse_request(Endpoint::Chat, body.as_bytes(), 1000).map(|(_, v)| v)
}

fn completion(body: &str) -> Result<RequestView, ApiError> {
    parse_request(Endpoint::Completions, body.as_bytes(), 4).map(|(_, v)| v)
}

#[test]
fn a_chat_request_is_read_and_unknown_fields_are_kept() {
    let body = r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,
        "stream_options":{"include_usage":true},"max_tokens":7,"user":"u","top_k":3}"#;
    let (obj, v) = parse_request(Endpoint::Chat, body.as_bytes(), 10).unwrap();
    assert_eq!(v.model, "m");
    assert!(v.stream && v.include_usage);
    assert_eq!(v.max_tokens, Some(7));
    assert_eq!(v.user.as_deref(), Some("u"));
    assert_eq!(obj["top_k"], 3);
    match v.input {
        PromptInput::Messages(m) => assert_eq!(m.len(), 1),
        other => panic!("{other:?}"),
    }
}

#[test]
fn include_usage_counts_only_when_streaming_and_max_completion_tokens_wins() {
    let v = chat(
        r#"{"model":"m","messages":[{"role":"user","content":"x"}],
        "stream_options":{"include_usage":true},"max_tokens":5,"max_completion_tokens":9}"#,
    )
    .unwrap();
    assert!(!v.include_usage);
    assert_eq!(v.max_tokens, Some(9));
}

#[test]
fn prompts_of_every_accepted_shape() {
    let text = completion(r#"{"model":"m","prompt":"abc"}"#).unwrap();
    assert_eq!(text.input, PromptInput::Text("abc".into()));
    let one = completion(r#"{"model":"m","prompt":["abc"]}"#).unwrap();
    assert_eq!(one.input, PromptInput::Text("abc".into()));
    let ids = completion(r#"{"model":"m","prompt":[1,2,4294967295]}"#).unwrap();
    assert_eq!(ids.input, PromptInput::Tokens(vec![1, 2, u32::MAX]));
    let nested = completion(r#"{"model":"m","prompt":[[5]]}"#).unwrap();
    assert_eq!(nested.input, PromptInput::Tokens(vec![5]));
}

#[test]
fn bad_requests_are_400_with_the_field_named() {
    let cases = [
        ("not json", None),
        ("[1,2]", None),
        (
            r#"{"messages":[{"role":"user","content":"x"}]}"#,
            Some("model"),
        ),
        (r#"{"model":3,"messages":[]}"#, Some("model")),
        (r#"{"model":"m","messages":[]}"#, Some("messages")),
        (r#"{"model":"m","messages":"hi"}"#, Some("messages")),
        (
            r#"{"model":"m","messages":[{"content":"x"}]}"#,
            Some("messages"),
        ),
        (r#"{"model":"m","messages":[1]}"#, Some("messages")),
        (
            r#"{"model":"m","messages":[{"role":"user"}],"stream":"yes"}"#,
            Some("stream"),
        ),
        (
            r#"{"model":"m","messages":[{"role":"user"}],"max_tokens":-1}"#,
            Some("max_tokens"),
        ),
        (
            r#"{"model":"m","messages":[{"role":"user"}],"max_tokens":0}"#,
            Some("max_tokens"),
        ),
        (
            r#"{"model":"m","messages":[{"role":"user"}],"max_tokens":1.5}"#,
            Some("max_tokens"),
        ),
        (
            r#"{"model":"m","messages":[{"role":"user"}],"stream_options":1}"#,
            Some("stream_options"),
        ),
        (
            r#"{"model":"m","messages":[{"role":"user"}],"user":5}"#,
            Some("user"),
        ),
    ];
    for (body, param) in cases {
        let e = chat(body).unwrap_err();
        assert_eq!(e.status(), 400, "{body}");
        assert_eq!(e.param.as_deref(), param, "{body}");
    }
    for body in [
        r#"{"model":"m"}"#,
        r#"{"model":"m","prompt":""}"#,
        r#"{"model":"m","prompt":[]}"#,
        r#"{"model":"m","prompt":[-1]}"#,
        r#"{"model":"m","prompt":[4294967296]}"#,
        r#"{"model":"m","prompt":["a","b"]}"#,
        r#"{"model":"m","prompt":[[1],[2]]}"#,
        r#"{"model":"m","prompt":{"a":1}}"#,
        r#"{"model":"m","prompt":[[]]}"#,
    ] {
        let e = completion(body).unwrap_err();
        assert_eq!(
            (e.status(), e.param.as_deref()),
            (400, Some("prompt")),
            "{body}"
        );
    }
}

#[test]
fn too_many_token_ids_is_413() {
    let e = completion(r#"{"model":"m","prompt":[1,2,3,4,5]}"#).unwrap_err();
    assert_eq!(e.status(), 413);
    assert_eq!(e.code.as_deref(), Some("context_length_exceeded"));
}

proptest::proptest! {
    #[test]
    fn any_bytes_give_a_view_or_a_client_error(data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..256)) {
        for endpoint in [Endpoint::Chat, Endpoint::Completions] {
            if let Err(e) = parse_request(endpoint, &data, 16) {
                proptest::prop_assert!((400..500).contains(&e.status()));
            }
        }
    }

    #[test]
    fn any_json_object_gives_a_view_or_a_client_error(
        model in proptest::option::of("[a-z]{0,3}"),
        prompt in proptest::option::of(proptest::collection::vec(-2i64..5_000_000_000, 0..20)),
        max_tokens in proptest::option::of(-5i64..10),
        stream in proptest::option::of(proptest::prelude::any::<bool>()),
    ) {
        let mut obj = serde_json::Map::new();
        if let Some(m) = model { obj.insert("model".into(), m.into()); }
        if let Some(p) = prompt { obj.insert("prompt".into(), p.into()); }
        if let Some(n) = max_tokens { obj.insert("max_tokens".into(), n.into()); }
        if let Some(s) = stream { obj.insert("stream".into(), s.into()); }
        let body = serde_json::to_vec(&obj).unwrap();
        match parse_request(Endpoint::Completions, &body, 16) {
            Ok((_, v)) => proptest::prop_assert!(!v.model.is_empty() && v.max_tokens != Some(0)),
            Err(e) => proptest::prop_assert!((400..500).contains(&e.status())),
        }
    }
}
