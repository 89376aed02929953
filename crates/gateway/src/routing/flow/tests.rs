//! Tests of a request's identity: keys, trusted headers, classes, objectives, defaults.

use super::*;
use kvroute_core::flow::{ClassConfig, FlowConfig, TenantConfig};
use kvroute_protocol::openai::{parse_request, Endpoint};

fn flows() -> Flows {
    FlowConfig {
        classes: vec![
            ClassConfig {
                name: "interactive".into(),
                band: 2,
                ttft_secs: Some(0.6),
                engine_priority: Some(0),
                ..ClassConfig::default()
            },
            ClassConfig {
                name: "batch".into(),
                engine_priority: Some(10),
                output_estimate: 500,
                ..ClassConfig::default()
            },
        ],
        default_class: Some("batch".into()),
        tenants: vec![
            TenantConfig {
                name: "acme".into(),
                api_keys: vec!["sk-acme".into()],
                ..TenantConfig::default()
            },
            TenantConfig {
                name: "globex".into(),
                ..TenantConfig::default()
            },
        ],
    }
    .compile()
}

fn view(body: &str) -> RequestView {
    parse_request(Endpoint::Chat, body.as_bytes(), 1 << 20)
        .unwrap()
        .1
}

fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.insert(*k, v.parse().unwrap());
    }
    h
}

const BODY: &str = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;

#[test]
fn keys_headers_and_the_body_name_the_flow_and_the_unknown_get_the_defaults() {
    let f = flows();
    let trusting = FlowHeaders {
        tenant: Some("x-tenant".into()),
        ..FlowHeaders::default()
    };
    let id = |names: &FlowHeaders, h: &[(&'static str, &str)], body: &str| {
        identify(&f, names, &headers(h), &view(body)).unwrap()
    };
    let name = |i: Identity| {
        (
            f.tenant(i.flow.tenant).name.clone(),
            f.class(i.flow.class).name.clone(),
        )
    };
    let plain = FlowHeaders::default();
    assert_eq!(
        name(id(&plain, &[], BODY)),
        ("default".into(), "batch".into())
    );
    // A tenant's key names it; a key of nobody's is the default tenant.
    let acme = id(&plain, &[("authorization", "Bearer sk-acme")], BODY);
    assert_eq!(name(acme).0, "acme");
    assert_eq!(
        name(id(&plain, &[("authorization", "Bearer sk-other")], BODY)).0,
        "default"
    );
    // The tenant header counts only when trusted; the key wins over it.
    assert_eq!(
        name(id(&plain, &[("x-tenant", "globex")], BODY)).0,
        "default"
    );
    assert_eq!(
        name(id(&trusting, &[("x-tenant", "globex")], BODY)).0,
        "globex"
    );
    assert_eq!(
        name(id(
            &trusting,
            &[("x-tenant", "globex"), ("authorization", "Bearer sk-acme")],
            BODY
        ))
        .0,
        "acme"
    );
    // The class header, else the body's priority, else the default.
    let i = id(&plain, &[("x-kvroute-class", "interactive")], BODY);
    assert_eq!((name(i).1.as_str(), i.flow.band), ("interactive", 2));
    assert_eq!(i.objective, Some(Duration::from_millis(600)));
    let p0 = r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"priority":0}"#;
    assert_eq!(name(id(&plain, &[], p0)).1, "interactive");
    let p7 = r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"priority":7}"#;
    assert_eq!(name(id(&plain, &[], p7)).1, "batch");
    assert_eq!(
        name(id(&plain, &[("x-kvroute-class", "what")], BODY)).1,
        "batch"
    );
    // Output charged: max_tokens, else the class's estimate.
    assert_eq!(id(&plain, &[], BODY).output, 500);
    let m = r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":9}"#;
    assert_eq!(id(&plain, &[], m).output, 9);
}

#[test]
fn a_requests_own_objective_is_never_looser_than_its_classs_and_must_be_a_number() {
    let f = flows();
    let plain = FlowHeaders::default();
    let with = |h: &[(&'static str, &str)]| identify(&f, &plain, &headers(h), &view(BODY));
    let tight = with(&[
        ("x-kvroute-class", "interactive"),
        ("x-kvroute-ttft-ms", "200"),
    ]);
    assert_eq!(tight.unwrap().objective, Some(Duration::from_millis(200)));
    let loose = with(&[
        ("x-kvroute-class", "interactive"),
        ("x-kvroute-ttft-ms", "5000"),
    ]);
    assert_eq!(loose.unwrap().objective, Some(Duration::from_millis(600)));
    let own = with(&[("x-kvroute-ttft-ms", "1500")]).unwrap();
    assert_eq!(own.objective, Some(Duration::from_millis(1500)));
    for bad in ["soon", "-1", "0", "NaN", "1e12"] {
        let e = with(&[("x-kvroute-ttft-ms", bad)]).unwrap_err();
        assert!(
            e.message.contains("x-kvroute-ttft-ms"),
            "{bad}: {}",
            e.message
        );
    }
}
