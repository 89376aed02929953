//! Tests of flow identities: defaults for the unknown, validation of the settings.

use super::*;

fn config() -> FlowConfig {
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
                band: 0,
                ttft_secs: Some(30.0),
                engine_priority: Some(10),
                ..ClassConfig::default()
            },
        ],
        default_class: Some("batch".into()),
        tenants: vec![TenantConfig {
            name: "acme".into(),
            weight: 2.0,
            api_keys: vec!["sk-acme".into()],
            ..TenantConfig::default()
        }],
    }
}

#[test]
fn unknown_tenants_and_classes_get_the_defaults() {
    let c = config();
    c.validate().unwrap();
    let f = c.compile();
    assert!(f.is_configured());
    assert_eq!(f.tenants().len(), 2, "acme and the implicit default");
    assert_eq!(f.classes().len(), 2, "the default class is batch");
    let i = f.flow_of(Some("acme"), Some("interactive"));
    assert_eq!((f.tenant(i.tenant).name.as_str(), i.band), ("acme", 2));
    let u = f.flow_of(Some("who"), Some("what"));
    assert_eq!(f.tenant(u.tenant).name, DEFAULT_TENANT);
    assert_eq!((f.class(u.class).name.as_str(), u.band), ("batch", 0));
    assert_eq!(f.flow_of(None, None), u);
    assert_eq!(f.tenant_of_key("sk-acme"), Some(i.tenant));
    assert_eq!(f.tenant_of_key("sk-other"), None);
    assert_eq!(f.class_of_priority(0), i.class);
    assert_eq!(f.class_of_priority(7), u.class);
    // Nothing configured: one flow.
    let none = FlowConfig::default().compile();
    assert!(!none.is_configured());
    assert_eq!(none.flow_of(Some("x"), Some("y")), Flow::default());
    assert_eq!(none.class(ClassIx(9)).name, DEFAULT_CLASS);
}

#[test]
fn bad_settings_are_refused_with_their_name() {
    type Break = fn(&mut FlowConfig);
    let cases: Vec<(Break, &str)> = vec![
        (|c| c.classes[1].name = "interactive".into(), "named twice"),
        (|c| c.classes[0].name = "a b".into(), "name"),
        (|c| c.classes[0].ttft_secs = Some(0.0), "ttft_secs"),
        (|c| c.classes[0].miss_weight = f64::NAN, "miss_weight"),
        (|c| c.default_class = Some("x".into()), "default_class"),
        (|c| c.tenants[0].weight = 0.0, "weight"),
        (
            |c| c.tenants[0].tokens_per_sec = Some(-1.0),
            "tokens_per_sec",
        ),
        (|c| c.tenants[0].max_concurrent = Some(0), "max_concurrent"),
        (
            |c| {
                let mut t = c.tenants[0].clone();
                t.name = "b".into();
                c.tenants.push(t);
            },
            "API key",
        ),
    ];
    for (break_it, says) in cases {
        let mut c = config();
        break_it(&mut c);
        let e = c.validate().unwrap_err();
        assert!(e.contains(says), "{e} should mention {says}");
    }
    assert_eq!("reject".parse(), Ok(MissAction::Reject));
    assert!("drop".parse::<MissAction>().is_err());
}
