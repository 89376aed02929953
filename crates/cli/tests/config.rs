//! The config as an operator composes and checks it, run as processes: files layered in
//! order and `KVROUTE__` variables over them, `check-config` printing the effective config or
//! every problem with its file, line and key path (exit code 2), and `serve --print-config`
//! as a dry run whose output reads back as the same config, keys never printed.

use std::path::PathBuf;
use std::process::{Command, Output};

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kvroute-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `kvroute` with `args` and the environment variables `env` (and none of the caller's
/// `KVROUTE__` ones).
fn kvroute(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_kvroute"));
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("KVROUTE")) {
        c.env_remove(k);
    }
    c.args(args).envs(env.iter().copied()).output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn check_config_prints_the_layered_config_or_every_problem_where_it_is() {
    let dir = temp_dir("check-config");
    let base = dir.join("base.toml");
    let overlay = dir.join("overlay.toml");
    let bad = dir.join("bad.toml");
    std::fs::write(
        &base,
        "port = 9000\n[router.admission]\nmode = \"queue\"\nmax_queued_requests = 7\n\n[[workers]]\nurl = \"http://127.0.0.1:8001\"\n",
    )
    .unwrap();
    std::fs::write(&overlay, "[router.admission]\nmode = \"shed\"\n").unwrap();
    std::fs::write(&bad, "port = 9001\n\n[router.policy]\nkind = \"clever\"\n").unwrap();
    let (b, o, x) = (
        base.to_str().unwrap(),
        overlay.to_str().unwrap(),
        bad.to_str().unwrap(),
    );
    let out = kvroute(
        &["check-config", b, o],
        &[("KVROUTE__ROUTER__POLICY__KIND", "kv")],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let effective: toml::Table = toml::from_str(&text(&out.stdout)).unwrap();
    let admission = &effective["router"]["admission"];
    assert_eq!(admission["mode"].as_str(), Some("shed"), "the later file's");
    assert_eq!(admission["max_queued_requests"].as_integer(), Some(7));
    assert_eq!(effective["router"]["policy"]["kind"].as_str(), Some("kv"));
    // Every default filled in.
    assert_eq!(admission["max_queue_wait_secs"].as_float(), Some(30.0));
    // A problem: its file, line and key path; exit code 2.
    let out = kvroute(&["check-config", b, x], &[]);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(
        err.contains(&format!(
            "{x}:4: router.policy.kind: unknown variant `clever`"
        )),
        "{err}"
    );
    let out = kvroute(&["check-config", b], &[("KVROUTE__PORT", "high")]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("KVROUTE__PORT: port: invalid type"),
        "{}",
        text(&out.stderr)
    );
    // A config that parses but does not hold together.
    let out = kvroute(&["check-config", o], &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("at least one worker"),
        "{}",
        text(&out.stderr)
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn serve_print_config_is_a_dry_run_that_reads_back_and_never_shows_a_key() {
    let dir = temp_dir("print-config");
    let file = dir.join("gateway.toml");
    std::fs::write(
        &file,
        "[auth]\napi_keys = [\"sk-in-the-file\"]\n[router.admission]\nmode = \"shed\"\n",
    )
    .unwrap();
    let f = file.to_str().unwrap();
    let out = kvroute(
        &[
            "serve",
            "--config",
            f,
            "--worker",
            "http://127.0.0.1:8001",
            "--policy",
            "kv",
            "--port",
            "9123",
            "--print-config",
        ],
        &[
            ("KVROUTE_API_KEYS", "sk-from-the-env"),
            ("KVROUTE__HOST", "0.0.0.0"),
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let printed = text(&out.stdout);
    assert!(!printed.contains("sk-"), "a key printed:\n{printed}");
    let c: toml::Table = toml::from_str(&printed).unwrap();
    assert_eq!(c["port"].as_integer(), Some(9123), "the flag's");
    assert_eq!(c["host"].as_str(), Some("0.0.0.0"), "the environment's");
    assert_eq!(
        c["router"]["admission"]["mode"].as_str(),
        Some("shed"),
        "the file's"
    );
    assert_eq!(c["router"]["policy"]["kind"].as_str(), Some("kv"));
    // A flag not given leaves the file's value, whatever default its help names.
    std::fs::write(&file, "[router.policy]\nkind = \"kv\"\n").unwrap();
    let out = kvroute(
        &[
            "serve",
            "--config",
            f,
            "--worker",
            "http://127.0.0.1:8001",
            "--print-config",
        ],
        &[],
    );
    let c: toml::Table = toml::from_str(&text(&out.stdout)).unwrap();
    assert_eq!(c["router"]["policy"]["kind"].as_str(), Some("kv"));
    // What it printed is a config that reads back as itself.
    let again = dir.join("printed.toml");
    std::fs::write(&again, &printed).unwrap();
    let out = kvroute(&["check-config", again.to_str().unwrap()], &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), printed);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn help_names_each_config_flags_default_from_the_config_tree() {
    let out = kvroute(&["serve", "--help"], &[]);
    let help = text(&out.stdout);
    // The defaults a config with nothing in it has.
    let d = kvroute(
        &[
            "serve",
            "--worker",
            "http://127.0.0.1:8001",
            "--print-config",
        ],
        &[],
    );
    let d: toml::Table = toml::from_str(&text(&d.stdout)).unwrap();
    let policy = d["router"]["policy"]["kind"].as_str().unwrap().to_string();
    let wait = d["router"]["admission"]["max_queue_wait_secs"].to_string();
    for (flag, default) in [
        ("--policy", policy.as_str()),
        ("--max-queue-wait-secs", wait.as_str()),
        ("--port", "8000"),
        ("--tokenizer", "none"),
    ] {
        let at = help
            .find(&format!("{flag} <"))
            .unwrap_or_else(|| panic!("{flag}"));
        let next = help[at + 2..]
            .find("\n      --")
            .map_or(help.len(), |n| at + 2 + n);
        assert!(
            help[at..next].contains(&format!("[default: {default}]")),
            "{flag}: {}",
            &help[at..next]
        );
    }
    let w = kvroute(&["check-config", "--kind", "worker"], &[]);
    let w: toml::Table = toml::from_str(&text(&w.stdout)).unwrap();
    let profile = format!("[default: {}]", w["profile"].as_str().unwrap());
    let out = kvroute(&["worker", "--help"], &[]);
    assert!(
        text(&out.stdout).contains(&profile),
        "{}",
        text(&out.stdout)
    );
    let out = kvroute(&["epp", "--help"], &[]);
    assert!(text(&out.stdout).contains("[default: goodput]"));
    // Flags whose default is the configured part's own show it too, read from there.
    let demo = text(&kvroute(&["demo", "--help"], &[]).stdout);
    let mib = kvroute_preprocess::PIECE_CACHE_BYTES >> 20;
    assert!(demo.contains(&format!("keeps [default: {mib}]")), "{demo}");
    let simulate = text(&kvroute(&["simulate", "--help"], &[]).stdout);
    let ttft = kvroute_core::policy::GoodputConfig::default().ttft_secs * 1e3;
    assert!(
        simulate.contains(&format!("by default) [default: {ttft}]")),
        "{simulate}"
    );
}

#[path = "common/server.rs"]
mod server;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_reloads_on_sighup_and_a_changed_file_applies_workers_and_models_and_keeps_a_bad_one_out(
) {
    use server::Server;
    let dir = temp_dir("reload");
    let file = dir.join("gateway.toml");
    let (w1, spec1) = server::zmq_worker("r1");
    let (w2, spec2) = server::zmq_worker("r2");
    let url = |spec: &str| spec.split('=').next().unwrap().to_string();
    let (u1, u2) = (url(&spec1), url(&spec2));
    let workers = |urls: &[&str]| -> String {
        urls.iter()
            .map(|u| format!("[[workers]]\nurl = \"{u}\"\n"))
            .collect()
    };
    std::fs::write(&file, workers(&[&u1])).unwrap();
    let gw = Server::start(&["serve", "--config", file.to_str().unwrap(), "--port", "0"]);
    let base = gw.value_after("kvroute gateway on ");
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let names = async || -> Vec<String> {
        let v = kvroute_testkit::get_json(&client, &format!("{base}/debug/workers")).await;
        let mut n: Vec<String> = (v["workers"].as_array().unwrap().iter())
            .map(|w| w["worker"]["url"].as_str().unwrap().to_string())
            .collect();
        n.sort();
        n
    };
    assert_eq!(names().await, std::slice::from_ref(&u1));
    // SIGHUP reads the config again (nothing changed here).
    gw.signal("HUP");
    assert_eq!(
        gw.value_after("kvroute config reloaded (SIGHUP): applied "),
        "[];"
    );
    // A changed file (seen within 2 s): a second worker joins, a model name is set.
    std::fs::write(
        &file,
        format!("models = [\"m-reloaded\"]\n{}", workers(&[&u1, &u2])),
    )
    .unwrap();
    assert_eq!(
        gw.value_after("kvroute config reloaded (a config file changed): applied "),
        "[\"models\","
    );
    let mut both = vec![u1.clone(), u2.clone()];
    both.sort();
    assert_eq!(names().await, both);
    let models = kvroute_testkit::get_json(&client, &format!("{base}/v1/models")).await;
    assert_eq!(models["data"][0]["id"], "m-reloaded", "{models}");
    // A file that does not read: refused whole, the fleet as it was.
    std::fs::write(&file, "[[workers]]\nurl = \n").unwrap();
    gw.value_after("kvroute config reload refused (a config file changed)");
    assert_eq!(names().await, both);
    // The first worker leaves and a busy threshold changes, both applied; the block size
    // waits for a restart and is named.
    std::fs::write(
        &file,
        format!(
            "[limits]\nmax_prompt_tokens = 8\n[router]\nblock_size = 32\n[router.admission]\nbusy_prefill_tokens = 9000\nmax_queued_requests = 5\n{}",
            workers(&[&u2])
        ),
    )
    .unwrap();
    let line = gw.line_with("kvroute config reloaded (a config file changed)");
    assert!(
        line.ends_with(
            "applied [\"limits.max_prompt_tokens\", \"models\", \"router.admission.busy_prefill_tokens\", \"router.admission.max_queued_requests\", \"workers\"]; after a restart: [\"router.block_size\"]"
        ),
        "{line}"
    );
    assert_eq!(names().await, std::slice::from_ref(&u2));
    // The prompt limit read per request: a long prompt is refused now.
    let r = client
        .post(format!("{base}/v1/completions"))
        .json(&serde_json::json!({"model": "kvroute-sim", "prompt": "one two three four five six seven eight nine ten eleven twelve", "max_tokens": 1}))
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let body = r.text().await.unwrap();
    assert!(
        (400..500).contains(&status) && body.contains("8"),
        "{status} {body}"
    );
    let text = kvroute_testkit::get_text(&client, &format!("{base}/metrics")).await;
    for (result, n) in [
        ("unchanged", 1.0),
        ("applied", 1.0),
        ("invalid", 1.0),
        ("partial", 1.0),
    ] {
        let series = format!("kvroute_config_reloads_total{{result=\"{result}\"}}");
        assert_eq!(kvroute_testkit::sample(&text, &series), Some(n), "{series}");
    }
    drop((gw, w1, w2));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn the_endpoint_picker_reloads_too() {
    use server::Server;
    let dir = temp_dir("epp-reload");
    let file = dir.join("gateway.toml");
    let (w1, spec1) = server::zmq_worker("e1");
    let u1 = spec1.split('=').next().unwrap().to_string();
    std::fs::write(&file, format!("[[workers]]\nurl = \"{u1}\"\n")).unwrap();
    let f = file.to_str().unwrap();
    let epp = Server::start(&[
        "epp",
        "--config",
        f,
        "--port",
        "0",
        "--grpc-port",
        "0",
        "--grpc-health-port",
        "0",
    ]);
    epp.value_after("kvroute endpoint picker: ");
    std::fs::write(
        &file,
        format!("models = [\"picked\"]\n[[workers]]\nurl = \"{u1}\"\n"),
    )
    .unwrap();
    let line = epp.line_with("kvroute config reloaded (a config file changed)");
    assert!(line.contains("applied [\"models\"]"), "{line}");
    drop((epp, w1));
    std::fs::remove_dir_all(&dir).ok();
}
