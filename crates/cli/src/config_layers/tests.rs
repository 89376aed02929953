//! Layering files and the environment into the gateway's config, and naming every problem
//! where it is.

use super::*;
use kvroute_gateway::GatewayConfig;

/// Files written into a fresh directory, in order.
fn files(name: &str, texts: &[&str]) -> Vec<PathBuf> {
    let dir = std::env::temp_dir().join(format!("kvroute-layers-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    texts
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let p = dir.join(format!("{i}.toml"));
            std::fs::write(&p, t).unwrap();
            p
        })
        .collect()
}

fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn later_files_override_earlier_ones_table_by_table_and_arrays_whole() {
    let paths = files(
        "merge",
        &[
            "port = 9000\nmodels = [\"a\", \"b\"]\n[router.admission]\nmode = \"queue\"\nmax_queued_requests = 7\n",
            "models = [\"c\"]\n[router.admission]\nmode = \"shed\"\n",
        ],
    );
    let c: GatewayConfig = load(&paths, &[]).unwrap();
    assert_eq!(c.port, 9000);
    assert_eq!(c.models, ["c"]);
    assert_eq!(c.router.admission.mode, kvroute_core::AdmissionMode::Shed);
    assert_eq!(
        c.router.admission.max_queued_requests, 7,
        "kept from the first"
    );
    // Nothing given: the defaults.
    let d: GatewayConfig = load(&[], &[]).unwrap();
    assert_eq!(d, GatewayConfig::default());
}

#[test]
fn environment_variables_override_keys_by_their_path() {
    let paths = files("env", &["port = 9000\n"]);
    let c: GatewayConfig = load(
        &paths,
        &env(&[
            ("KVROUTE__PORT", "9100"),
            ("KVROUTE__ROUTER__ADMISSION__MODE", "queue"),
            ("KVROUTE__HOST", "0.0.0.0"),
            ("KVROUTE__MODELS", "[\"m1\", \"m2\"]"),
        ]),
    )
    .unwrap();
    assert_eq!(c.port, 9100);
    assert_eq!(c.host, "0.0.0.0", "not TOML: a string");
    assert_eq!(c.router.admission.mode, kvroute_core::AdmissionMode::Queue);
    assert_eq!(c.models, ["m1", "m2"]);
}

#[test]
fn every_problem_names_its_file_line_and_key_path() {
    let paths = files(
        "problems",
        &[
            "port = 9000\n\n[router.admission]\nmode = \"sometimes\"\n",
            "port = \"high\"\n",
            "[router]\npolicy = { kind = \"kv\" }\nnot_a_key = 1\n",
            "port = = 1\n",
        ],
    );
    let e = load::<GatewayConfig>(&paths, &[]).unwrap_err();
    let lines: Vec<String> = e.0.iter().map(ToString::to_string).collect();
    assert_eq!(lines.len(), 4, "{e}");
    let (a, b, c, d) = (&lines[0], &lines[1], &lines[2], &lines[3]);
    assert!(
        a.contains("0.toml:4: router.admission.mode: unknown variant `sometimes`"),
        "{a}"
    );
    assert!(
        b.contains("1.toml:1: port: invalid type: string \"high\""),
        "{b}"
    );
    assert!(
        c.contains("2.toml:3: router.not_a_key: unknown field `not_a_key`"),
        "{c}"
    );
    assert!(d.contains("3.toml:1: "), "{d}");
    let missing = load::<GatewayConfig>(&[PathBuf::from("/nonexistent/k.toml")], &[]).unwrap_err();
    assert!(
        missing
            .to_string()
            .starts_with("/nonexistent/k.toml: cannot read it"),
        "{missing}"
    );
}

#[test]
fn a_bad_variable_is_named() {
    let e = load::<GatewayConfig>(&[], &env(&[("KVROUTE__PORT", "\"high\"")])).unwrap_err();
    assert_eq!(e.0[0].source.as_deref(), Some("KVROUTE__PORT"), "{e}");
    assert!(e.to_string().contains("port: invalid type"), "{e}");
    let e = load::<GatewayConfig>(&[], &env(&[("KVROUTE__ROUTER____X", "1")])).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("KVROUTE__ROUTER____X: not a key path"),
        "{e}"
    );
    let e = load::<GatewayConfig>(
        &[],
        &env(&[("KVROUTE__PORT__X", "1"), ("KVROUTE__PORT", "1")]),
    )
    .unwrap_err();
    assert!(
        e.to_string()
            .contains("KVROUTE__PORT__X: port is not a table"),
        "{e}"
    );
}

#[test]
fn a_table_from_a_variable_merges_and_a_bad_value_is_named() {
    let paths = files(
        "env-table",
        &["[router.admission]\nmax_queued_requests = 7\n"],
    );
    let c: GatewayConfig = load(
        &paths,
        &env(&[("KVROUTE__ROUTER__ADMISSION", "{ mode = \"shed\" }")]),
    )
    .unwrap();
    assert_eq!(c.router.admission.mode, kvroute_core::AdmissionMode::Shed);
    assert_eq!(
        c.router.admission.max_queued_requests, 7,
        "merged, not replaced"
    );
    let e = load::<GatewayConfig>(&[], &env(&[("KVROUTE__PORT", NOT_UTF8)])).unwrap_err();
    assert_eq!(e.to_string(), "KVROUTE__PORT: its value is not UTF-8");
    // Blame goes by whole parts: KVROUTE__PORT does not set `port_x`.
    assert!(env_path(ENV_PREFIX, "KVROUTE__PORT").is_some());
}

#[test]
fn a_workers_variables_are_its_own() {
    // A gateway's variable is not a worker's (whose tree has no `router`), nor the reverse.
    let gateway_var = env(&[("KVROUTE__ROUTER__ADMISSION__MODE", "queue")]);
    let w: kvroute_worker::WorkerConfig = load_with(&[], &gateway_var, WORKER_ENV_PREFIX).unwrap();
    assert_eq!(w, kvroute_worker::WorkerConfig::default());
    let worker_var = env(&[("KVROUTE_WORKER__MODEL", "m")]);
    let w: kvroute_worker::WorkerConfig = load_with(&[], &worker_var, WORKER_ENV_PREFIX).unwrap();
    assert_eq!(w.model, "m");
    let g: GatewayConfig = load(&[], &worker_var).unwrap();
    assert_eq!(g, GatewayConfig::default());
}
