//! The configuration's tests: worker specs, the file form, validation.

use super::*;

#[test]
fn worker_specs_parse_from_the_command_line_form() {
    let w = WorkerSpec::parse("http://h:1=tcp://h:2=tcp://h:3").unwrap();
    assert_eq!(w.url, "http://h:1");
    assert_eq!(w.events.as_deref(), Some("tcp://h:2"));
    assert_eq!(w.replay.as_deref(), Some("tcp://h:3"));
    assert_eq!(w.display_name(), "h:1");
    assert!(WorkerSpec::parse("http://h:1").unwrap().events.is_none());
    let w = WorkerSpec::parse("http://h:1=bind:tcp://*:5557=tcp://h:3").unwrap();
    assert_eq!(w.event_socket(), Some(("tcp://*:5557", true)));
    let w = WorkerSpec::parse("http://h:1=tcp://h:2").unwrap();
    assert_eq!(w.event_socket(), Some(("tcp://h:2", false)));
    for bad in [
        "h:1",
        "http://h:1=h:2",
        "http://h:1=tcp://h:2=udp://x",
        "http://h:1=tcp://h",
        "http://h:1=bind:udp://h:2",
        "http://h:1=tcp://h:2=tcp://:3",
        "http://[::1",
        "http://h:99999",
        "http://",
    ] {
        assert!(WorkerSpec::parse(bad).is_err(), "{bad}");
    }
    // Options after the endpoints, in any order.
    let w = WorkerSpec::parse("http://h:1=tcp://h:2,role=prefill,dp=2").unwrap();
    assert_eq!((w.role, w.dp_size), (WorkerRole::Prefill, Some(2)));
    assert_eq!(w.events.as_deref(), Some("tcp://h:2"));
    let w = WorkerSpec::parse("http://h:1,priority=higher_first,dp=2").unwrap();
    assert_eq!(w.priority, Some(EnginePriority::HigherFirst));
    assert_eq!(
        (
            EnginePriority::HigherFirst.value(3),
            EnginePriority::LowerFirst.value(3)
        ),
        (-3, 3)
    );
    assert!(WorkerSpec::parse("http://h:1,priority=first")
        .unwrap_err()
        .to_string()
        .contains("lower_first, higher_first"));
    let w = WorkerSpec::parse("http://h:1,dp=2,role=decode").unwrap();
    assert_eq!((w.role, w.dp_size), (WorkerRole::Decode, Some(2)));
    assert_eq!(
        WorkerSpec::parse("http://h:1").unwrap().role,
        WorkerRole::Both
    );
    for (bad, says) in [
        ("http://h:1,role=leader", "not one of both, prefill, decode"),
        ("http://h:1,role=decode,role=both", "role= is given twice"),
        ("http://h:1,dp=x", "not a rank count"),
    ] {
        let e = WorkerSpec::parse(bad).unwrap_err().to_string();
        assert!(e.contains(says), "{bad}: {e}");
    }
    let from_file: WorkerSpec = toml::from_str("url = \"http://h:1\"\nrole = \"prefill\"").unwrap();
    assert_eq!(from_file.role, WorkerRole::Prefill);
    assert!(toml::from_str::<WorkerSpec>("url = \"http://h:1\"\nrole = \"x\"").is_err());
    // The endpoints are parsed once, with or without a trailing slash.
    let w = crate::registry::Registry::new(&[WorkerSpec::parse("http://h:1/").unwrap()]);
    let entry = w.all().into_iter().next().unwrap();
    let url = entry.url(kvroute_protocol::openai::Endpoint::Chat).unwrap();
    assert_eq!(url.as_str(), "http://h:1/v1/chat/completions");
}

#[test]
fn a_toml_file_is_read_and_checked() {
    let c = GatewayConfig::from_toml(
        r#"
        port = 9000
        models = ["m"]
        [router]
        block_size = 32
        [router.tiers]
        host_load_ratio = 0.05
        [router.policy]
        kind = "kv"
        [[workers]]
        url = "http://127.0.0.1:8001"
        events = "tcp://127.0.0.1:5557"
        kv_blocks = 1000
        "#,
    )
    .unwrap();
    assert_eq!(c.port, 9000);
    assert_eq!(c.router.block_size, 32);
    assert_eq!(c.router.tiers.host_load_ratio, 0.05);
    assert_eq!(c.router.tiers.disk_load_ratio, 0.4);
    assert_eq!(c.capacity_of(&c.workers[0]).kv_blocks, Some(1000));
    c.validate().unwrap();
    let mut slow = c.clone();
    slow.router.tiers.disk_load_ratio = 2.0;
    assert!(slow.validate().is_err());
    assert!(GatewayConfig::from_toml("prot = 1").is_err());
    assert!(GatewayConfig::default().validate().is_err());
    let mut dup = c.clone();
    dup.workers.push(c.workers[0].clone());
    assert!(dup.validate().is_err());
}

#[test]
fn the_gateways_max_batch_stands_in_for_workers_that_give_none() {
    let c = GatewayConfig::from_toml(
        r#"
        max_batch = 64
        [[workers]]
        url = "http://h:1"
        max_num_seqs = 8
        [[workers]]
        url = "http://h:2"
        "#,
    )
    .unwrap();
    c.validate().unwrap();
    let batch = |i: usize| c.capacity_of(&c.workers[i]).max_batch;
    assert_eq!((batch(0), batch(1)), (Some(8), Some(64)));
    let none = GatewayConfig {
        max_batch: None,
        ..c.clone()
    };
    assert_eq!(none.capacity_of(&none.workers[1]).max_batch, None);
    for zero in [
        "max_batch = 0\n[[workers]]\nurl = \"http://h:1\"",
        "[[workers]]\nurl = \"http://h:1\"\nmax_batch = 0",
    ] {
        let z = GatewayConfig::from_toml(zero).unwrap();
        assert!(z.validate().unwrap_err().0.contains("max_batch"), "{zero}");
    }
}

#[test]
fn client_limits_out_of_range_are_refused() {
    let mut c = GatewayConfig::default();
    c.workers.push(WorkerSpec::parse("http://h:1").unwrap());
    c.validate().unwrap();
    let cases: [fn(&mut Limits); 9] = [
        |l| l.header_read_timeout_secs = f64::NAN,
        |l| l.header_read_timeout_secs = 0.0,
        |l| l.body_read_timeout_secs = 1e30,
        |l| l.max_connections = 0,
        |l| l.max_connections = usize::MAX,
        |l| l.tokenizer_threads = 0,
        |l| l.tokenizer_threads = MAX_TOKENIZER_THREADS + 1,
        |l| l.tokenizer_queue = 0,
        |l| l.tokenizer_queue = usize::MAX,
    ];
    for bad in cases {
        let mut b = c.clone();
        bad(&mut b.limits);
        assert!(b.validate().is_err(), "{:?}", b.limits);
    }
}
