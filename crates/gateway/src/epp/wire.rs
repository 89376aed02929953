//! The endpoint picker's wire forms: Envoy `ext_proc` messages built and read (the
//! Gateway API Inference Extension's endpoint picker protocol: the chosen endpoint in a
//! header and in `envoy.lb` dynamic metadata, the subset hint in `envoy.lb.subset_hint`
//! filter metadata, bodies echoed as streamed chunks).

use envoy_types::pb::envoy::config::core::v3::{HeaderValue, HeaderValueOption, Metadata};
use envoy_types::pb::envoy::r#type::v3::HttpStatus;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    body_mutation, processing_response, BodyMutation, BodyResponse, CommonResponse, HeaderMutation,
    HeadersResponse, HttpHeaders, ImmediateResponse, ProcessingResponse, StreamedBodyResponse,
    TrailersResponse,
};
use envoy_types::pb::google::protobuf::{value::Kind, Struct, Value};
use kvroute_protocol::openai::ApiError;

/// The header naming the endpoint the proxy must send the request to.
pub const DESTINATION_HEADER: &str = "x-gateway-destination-endpoint";
/// The dynamic metadata namespace of the destination (Envoy's load balancers read it).
pub const LB_NAMESPACE: &str = "envoy.lb";
/// The filter metadata namespace of the subset hint.
pub const SUBSET_NAMESPACE: &str = "envoy.lb.subset_hint";
/// The subset hint's key: a list of `ip:port` the request may go to.
pub const SUBSET_KEY: &str = "x-gateway-destination-endpoint-subset";
/// The conformance suite's request header restricting the endpoints a request may go to
/// (comma-separated `IP` or `IP:port`; `[epp] conformance_headers`).
pub const TEST_SELECTION_HEADER: &str = "test-epp-endpoint-selection";
/// The conformance suite's response header naming the endpoint that served the request.
pub const TEST_SERVED_HEADER: &str = "x-conformance-test-served-endpoint";
/// The data plane's `envoy.lb` metadata key naming the endpoint that served the request.
pub const SERVED_KEY: &str = "x-gateway-destination-endpoint-served";
/// The header naming a split request's prefill endpoint (`ip:port`) for the routing sidecar
/// on the decode endpoint (llm-d's), which runs the prefill leg there first. A client's own
/// copy is always removed.
pub const PREFILLER_HEADER: &str = "x-prefiller-host-port";
/// The `ext_proc` gRPC service's name (Envoy health-checks it by this name).
pub const EXT_PROC_SERVICE: &str = "envoy.service.ext_proc.v3.ExternalProcessor";
/// The largest body chunk sent back (the protocol's limit on one streamed chunk).
pub const MAX_CHUNK: usize = 62_000;
/// Envoy's body modes (`ProcessingMode.BodySendMode`) the picker reads.
pub mod mode {
    /// No body sent.
    pub const NONE: i32 = 0;
    /// The whole body in one message, the headers held until it is answered.
    pub const BUFFERED: i32 = 2;
    /// Chunks streamed both ways, given back by the processor.
    pub const FULL_DUPLEX_STREAMED: i32 = 4;
}

/// A header's value as Envoy sends it (`raw_value`, or `value` from older versions).
pub fn header<'a>(headers: &'a HttpHeaders, name: &str) -> Option<&'a str> {
    let h = headers
        .headers
        .as_ref()?
        .headers
        .iter()
        .find(|h| h.key.eq_ignore_ascii_case(name))?;
    if h.raw_value.is_empty() {
        Some(h.value.as_str())
    } else {
        std::str::from_utf8(&h.raw_value).ok()
    }
}

/// The endpoints of the subset hint in `metadata`: `None` without a hint, else the listed
/// `ip:port` strings (possibly none).
pub fn subset_hint(metadata: Option<&Metadata>) -> Option<Vec<String>> {
    let hint = metadata?
        .filter_metadata
        .get(SUBSET_NAMESPACE)?
        .fields
        .get(SUBSET_KEY)?;
    Some(match &hint.kind {
        Some(Kind::ListValue(l)) => l
            .values
            .iter()
            .filter_map(|v| match &v.kind {
                Some(Kind::StringValue(s)) => Some(s.clone()),
                _ => None,
            })
            .collect(),
        Some(Kind::StringValue(s)) => s.split(',').map(|e| e.trim().to_string()).collect(),
        _ => Vec::new(),
    })
}

/// The endpoint the data plane says served the request (`envoy.lb`
/// `x-gateway-destination-endpoint-served` in `metadata`), when it says.
pub fn served_endpoint(metadata: Option<&Metadata>) -> Option<String> {
    let v = metadata?
        .filter_metadata
        .get(LB_NAMESPACE)?
        .fields
        .get(SERVED_KEY)?;
    match &v.kind {
        Some(Kind::StringValue(s)) => Some(s.chars().take(256).collect()),
        _ => None,
    }
}

/// A header to set (replacing any the client sent).
pub fn set_header(key: &str, value: &str) -> HeaderValueOption {
    HeaderValueOption {
        header: Some(HeaderValue {
            key: key.to_string(),
            raw_value: value.as_bytes().to_vec(),
            ..HeaderValue::default()
        }),
        ..HeaderValueOption::default()
    }
}

fn string(s: &str) -> Value {
    Value {
        kind: Some(Kind::StringValue(s.to_string())),
    }
}

/// The answer routing a request: the destination in the header and in `envoy.lb` metadata,
/// `more` headers set, the route cache cleared (the route may depend on the new header).
/// It answers the request headers, or, when the body was buffered (the headers held until
/// it is answered), the body, replacing it with `new_body` when given (streamed bodies are
/// given back after this answer, changed or not).
pub fn routed(
    endpoint: &str,
    more: &[(&str, String)],
    on_body: bool,
    new_body: Option<Vec<u8>>,
) -> ProcessingResponse {
    let mut set_headers = vec![set_header(DESTINATION_HEADER, endpoint)];
    set_headers.extend(more.iter().map(|(k, v)| set_header(k, v)));
    let lb = Struct {
        fields: [(DESTINATION_HEADER.to_string(), string(endpoint))].into(),
    };
    let metadata = Struct {
        fields: [(
            LB_NAMESPACE.to_string(),
            Value {
                kind: Some(Kind::StructValue(lb)),
            },
        )]
        .into(),
    };
    let common = CommonResponse {
        header_mutation: Some(HeaderMutation {
            // Only the picker names a prefill endpoint.
            remove_headers: if more.iter().any(|(k, _)| *k == PREFILLER_HEADER) {
                Vec::new()
            } else {
                vec![PREFILLER_HEADER.to_string()]
            },
            set_headers,
        }),
        body_mutation: new_body.filter(|_| on_body).map(|b| BodyMutation {
            mutation: Some(body_mutation::Mutation::Body(b)),
        }),
        clear_route_cache: true,
        ..CommonResponse::default()
    };
    ProcessingResponse {
        response: Some(if on_body {
            processing_response::Response::RequestBody(BodyResponse {
                response: Some(common),
            })
        } else {
            processing_response::Response::RequestHeaders(HeadersResponse {
                response: Some(common),
            })
        }),
        dynamic_metadata: Some(metadata),
        ..ProcessingResponse::default()
    }
}

/// The answer letting the request headers go on unchanged (a buffered body follows).
pub fn headers_unchanged() -> ProcessingResponse {
    ProcessingResponse {
        response: Some(processing_response::Response::RequestHeaders(
            HeadersResponse {
                response: Some(CommonResponse::default()),
            },
        )),
        ..ProcessingResponse::default()
    }
}

/// The answer to a buffered request body passed on unchanged (a request routed at its
/// headers).
pub fn request_body_unchanged() -> ProcessingResponse {
    ProcessingResponse {
        response: Some(processing_response::Response::RequestBody(BodyResponse {
            response: Some(CommonResponse::default()),
        })),
        ..ProcessingResponse::default()
    }
}

/// The answer to a response body chunk that is shown, not streamed back (modes other than
/// `FULL_DUPLEX_STREAMED`): no change.
pub fn response_body_unchanged() -> ProcessingResponse {
    ProcessingResponse {
        response: Some(processing_response::Response::ResponseBody(BodyResponse {
            response: Some(CommonResponse::default()),
        })),
        ..ProcessingResponse::default()
    }
}

/// The answer to the response headers: `set` headers added for the client.
pub fn response_headers(set: &[(&str, String)]) -> ProcessingResponse {
    ProcessingResponse {
        response: Some(processing_response::Response::ResponseHeaders(
            HeadersResponse {
                response: Some(CommonResponse {
                    header_mutation: Some(HeaderMutation {
                        set_headers: set.iter().map(|(k, v)| set_header(k, v)).collect(),
                        ..HeaderMutation::default()
                    }),
                    ..CommonResponse::default()
                }),
            },
        )),
        ..ProcessingResponse::default()
    }
}

/// One body chunk given back, on the request path (`request`) or the response path.
pub fn body_chunk(request: bool, body: Vec<u8>, end_of_stream: bool) -> ProcessingResponse {
    let r = BodyResponse {
        response: Some(CommonResponse {
            body_mutation: Some(BodyMutation {
                mutation: Some(body_mutation::Mutation::StreamedResponse(
                    StreamedBodyResponse {
                        body,
                        end_of_stream,
                        ..StreamedBodyResponse::default()
                    },
                )),
            }),
            ..CommonResponse::default()
        }),
    };
    ProcessingResponse {
        response: Some(if request {
            processing_response::Response::RequestBody(r)
        } else {
            processing_response::Response::ResponseBody(r)
        }),
        ..ProcessingResponse::default()
    }
}

/// `body` given back in chunks of at most [`MAX_CHUNK`] bytes, the last one ending the
/// stream when `end_of_stream` (an empty body is one empty chunk).
pub fn body_chunks(request: bool, body: &[u8], end_of_stream: bool) -> Vec<ProcessingResponse> {
    if body.is_empty() {
        return vec![body_chunk(request, Vec::new(), end_of_stream)];
    }
    let n = body.len().div_ceil(MAX_CHUNK);
    body.chunks(MAX_CHUNK)
        .enumerate()
        .map(|(i, c)| body_chunk(request, c.to_vec(), end_of_stream && i + 1 == n))
        .collect()
}

/// The answer to trailers: nothing changed.
pub fn trailers(request: bool) -> ProcessingResponse {
    let t = TrailersResponse::default();
    ProcessingResponse {
        response: Some(if request {
            processing_response::Response::RequestTrailers(t)
        } else {
            processing_response::Response::ResponseTrailers(t)
        }),
        ..ProcessingResponse::default()
    }
}

/// The picker answers the client itself: `e` as an OpenAI error object with its status
/// (`Retry-After` when it has one) and the request id.
pub fn immediate(e: &ApiError, request_id: &str) -> ProcessingResponse {
    let mut set = vec![
        set_header("content-type", "application/json"),
        set_header(kvroute_fleet::headers::REQUEST_ID_HEADER, request_id),
    ];
    if let Some(s) = e.retry_after_secs {
        set.push(set_header("retry-after", &s.to_string()));
    }
    ProcessingResponse {
        response: Some(processing_response::Response::ImmediateResponse(
            ImmediateResponse {
                status: Some(HttpStatus {
                    code: i32::from(e.status()),
                }),
                headers: Some(HeaderMutation {
                    set_headers: set,
                    ..HeaderMutation::default()
                }),
                body: e.to_json().into_bytes(),
                details: format!("kvroute_epp_{}", e.code.as_deref().unwrap_or("refused")),
                ..ImmediateResponse::default()
            },
        )),
        ..ProcessingResponse::default()
    }
}

/// The answer when the picker already holds as many streams as it may.
pub fn too_many_streams() -> ProcessingResponse {
    let e = ApiError::unavailable(
        "picker_busy",
        "the endpoint picker holds as many requests as it may (epp.max_streams)",
        1,
    );
    immediate(&e, "")
}

/// `host:port` of a worker URL (`http://10.0.0.7:8000/` gives `10.0.0.7:8000`; IPv6 in
/// brackets), as the proxy dials it.
pub fn endpoint_of(url: &str) -> Option<String> {
    let u = reqwest::Url::parse(url).ok()?;
    let host = u.host_str()?;
    let port = u.port_or_known_default()?;
    Some(format!("{host}:{port}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::config::core::v3::HeaderMap;
    use envoy_types::pb::google::protobuf::ListValue;

    #[test]
    fn endpoints_are_host_and_port() {
        assert_eq!(
            endpoint_of("http://10.0.0.7:8000/").as_deref(),
            Some("10.0.0.7:8000")
        );
        assert_eq!(
            endpoint_of("http://[fd00::7]:8000").as_deref(),
            Some("[fd00::7]:8000")
        );
        assert_eq!(
            endpoint_of("http://10.0.0.7").as_deref(),
            Some("10.0.0.7:80")
        );
        assert_eq!(endpoint_of("not a url"), None);
    }

    #[test]
    fn headers_are_read_from_raw_or_plain_values() {
        let h = HttpHeaders {
            headers: Some(HeaderMap {
                headers: vec![
                    HeaderValue {
                        key: ":path".into(),
                        raw_value: b"/v1/chat/completions".to_vec(),
                        ..HeaderValue::default()
                    },
                    HeaderValue {
                        key: "X-Request-Id".into(),
                        value: "abc".into(),
                        ..HeaderValue::default()
                    },
                ],
            }),
            ..HttpHeaders::default()
        };
        assert_eq!(header(&h, ":path"), Some("/v1/chat/completions"));
        assert_eq!(header(&h, "x-request-id"), Some("abc"));
        assert_eq!(header(&h, "content-type"), None);
    }

    #[test]
    fn the_subset_hint_is_a_list_of_endpoints() {
        let meta = |v: Value| Metadata {
            filter_metadata: [(
                SUBSET_NAMESPACE.to_string(),
                Struct {
                    fields: [(SUBSET_KEY.to_string(), v)].into(),
                },
            )]
            .into(),
            ..Metadata::default()
        };
        let list = Value {
            kind: Some(Kind::ListValue(ListValue {
                values: vec![string("10.0.0.1:8000"), string("10.0.0.2:8000")],
            })),
        };
        assert_eq!(
            subset_hint(Some(&meta(list))),
            Some(vec!["10.0.0.1:8000".into(), "10.0.0.2:8000".into()])
        );
        let empty = Value {
            kind: Some(Kind::ListValue(ListValue::default())),
        };
        assert_eq!(subset_hint(Some(&meta(empty))), Some(vec![]));
        assert_eq!(subset_hint(Some(&Metadata::default())), None);
        assert_eq!(subset_hint(None), None);
    }

    #[test]
    fn bodies_go_back_in_bounded_chunks_ending_once() {
        let body = vec![7u8; MAX_CHUNK * 2 + 5];
        let chunks = body_chunks(true, &body, true);
        assert_eq!(chunks.len(), 3);
        let mut total = 0;
        for (i, c) in chunks.iter().enumerate() {
            let Some(processing_response::Response::RequestBody(b)) = &c.response else {
                panic!("not a request body answer")
            };
            let Some(body_mutation::Mutation::StreamedResponse(s)) = b
                .response
                .as_ref()
                .and_then(|r| r.body_mutation.as_ref())
                .and_then(|m| m.mutation.as_ref())
            else {
                panic!("not streamed")
            };
            assert!(s.body.len() <= MAX_CHUNK);
            assert_eq!(s.end_of_stream, i == 2);
            total += s.body.len();
        }
        assert_eq!(total, body.len());
        assert_eq!(body_chunks(false, &[], true).len(), 1);
    }

    #[test]
    fn the_destination_is_in_the_header_and_the_metadata_alike() {
        let on_body = routed("10.0.0.7:8000", &[], true, Some(b"{}".to_vec()));
        let Some(processing_response::Response::RequestBody(b)) = &on_body.response else {
            panic!("not a body answer")
        };
        // A buffered body is replaced in the answer; a streamed one is given back after it.
        let mutation = b.response.as_ref().unwrap().body_mutation.as_ref();
        assert_eq!(
            mutation.and_then(|m| m.mutation.clone()),
            Some(body_mutation::Mutation::Body(b"{}".to_vec()))
        );
        let on_headers = routed("10.0.0.7:8000", &[], false, Some(b"{}".to_vec()));
        let Some(processing_response::Response::RequestHeaders(h)) = &on_headers.response else {
            panic!("not a headers answer")
        };
        assert!(h.response.as_ref().unwrap().body_mutation.is_none());
        let r = routed(
            "10.0.0.7:8000",
            &[("x-data-parallel-rank", "1".into())],
            false,
            None,
        );
        let Some(processing_response::Response::RequestHeaders(h)) = &r.response else {
            panic!("not a headers answer")
        };
        let common = h.response.as_ref().unwrap();
        assert!(common.clear_route_cache);
        let set = &common.header_mutation.as_ref().unwrap().set_headers;
        let first = set[0].header.as_ref().unwrap();
        assert_eq!(
            (first.key.as_str(), first.raw_value.as_slice()),
            (DESTINATION_HEADER, b"10.0.0.7:8000".as_slice())
        );
        assert_eq!(set.len(), 2);
        // A client's prefill endpoint header is removed unless the picker names one.
        let removed = &common.header_mutation.as_ref().unwrap().remove_headers;
        assert_eq!(removed, &[PREFILLER_HEADER.to_string()]);
        let split = routed(
            "10.0.0.7:8000",
            &[(PREFILLER_HEADER, "10.0.0.8:8000".into())],
            false,
            None,
        );
        let Some(processing_response::Response::RequestHeaders(h)) = &split.response else {
            panic!("not a headers answer")
        };
        let m = h
            .response
            .as_ref()
            .unwrap()
            .header_mutation
            .as_ref()
            .unwrap();
        assert!(m.remove_headers.is_empty());
        assert_eq!(
            m.set_headers[1].header.as_ref().unwrap().key,
            PREFILLER_HEADER
        );
        let lb = &r.dynamic_metadata.as_ref().unwrap().fields[LB_NAMESPACE];
        let Some(Kind::StructValue(lb)) = &lb.kind else {
            panic!("no envoy.lb struct")
        };
        assert_eq!(
            lb.fields[DESTINATION_HEADER].kind,
            Some(Kind::StringValue("10.0.0.7:8000".into()))
        );
    }

    #[test]
    fn refusals_carry_status_body_and_retry_after() {
        let e = ApiError::unavailable("no_healthy_workers", "none", 2);
        let r = immediate(&e, "req-1");
        let Some(processing_response::Response::ImmediateResponse(i)) = &r.response else {
            panic!("not immediate")
        };
        assert_eq!(i.status.as_ref().unwrap().code, 503);
        assert!(String::from_utf8_lossy(&i.body).contains("no_healthy_workers"));
        let keys: Vec<_> = i
            .headers
            .as_ref()
            .unwrap()
            .set_headers
            .iter()
            .map(|h| h.header.as_ref().unwrap().key.clone())
            .collect();
        assert!(keys.contains(&"retry-after".to_string()), "{keys:?}");
    }
}
