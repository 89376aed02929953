//! Tests of the tenants workload: the built-in spec runs on any profile, bad specs are
//! refused with what is wrong.

use super::super::tests::args;
use super::super::{fleets, prepare, Load};
use super::*;

#[test]
fn the_builtin_spec_runs_on_a_small_fleet_with_every_tenant_reported() {
    let a = args(&[
        "--workload",
        "tenants",
        "--profile",
        "tiny-fast",
        "--workers",
        "2",
        "--duration-secs",
        "20",
    ]);
    let p = prepare(&a).unwrap();
    let Load::Tenants(spec) = &p.load else {
        panic!("not a tenants load")
    };
    let fleet = fleets(&a).unwrap()[0];
    let (r, json, rows) = run_cell(&a, &p, spec, fleet, PolicyKind::Goodput).unwrap();
    let names: Vec<&str> = json
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(names, ["batch", "flood", "interactive"]);
    for (name, t) in json.as_object().unwrap() {
        assert!(t["sent"].as_u64().unwrap() > 0, "{name}: {t}");
        assert!(t["goodput"]["per_s"].is_number() && t["refused"].is_object());
        assert!(rows.contains(&format!("| {name} |")));
    }
    // Only the flooding tenant is over its quota.
    let limited = |n: &str| json[n]["refused"]["tenant_limit"].as_u64().unwrap_or(0);
    assert!(limited("flood") > 0);
    assert_eq!((limited("interactive"), limited("batch")), (0, 0));
    assert_eq!(r.tenants.len(), 3);
    // By class: each tenant's class (the flood's is the default class, `standard`).
    let classes = classes_json(&r);
    let names: Vec<&str> = classes
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(names, ["batch", "interactive", "standard"]);
    assert_eq!(classes["standard"]["tenants"], serde_json::json!(["flood"]));
    assert_eq!(classes["batch"]["sent"], json["batch"]["sent"]);
    assert!(rows.contains("| class | tenants |"), "{rows}");
}

#[test]
fn bad_specs_are_refused_with_what_is_wrong() {
    let dir = std::env::temp_dir().join(format!("kvroute-tenants-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cases = [
        ("loads = []", "between 1 and"),
        (
            "[[loads]]\ntenant = \"a\"\nkind = \"open\"\n",
            "needs one of rate",
        ),
        (
            "[[loads]]\ntenant = \"a\"\nkind = \"chat\"\nrate = 1.0\n",
            "closed loop",
        ),
        (
            "[[loads]]\ntenant = \"a\"\nkind = \"open\"\nrate = 1.0\n[[loads]]\ntenant = \"a\"\nkind = \"open\"\nrate = 2.0\n",
            "tenant of its own",
        ),
        ("[[loads]]\ntenant = \"a\"\nkind = \"fast\"\n", "unknown variant"),
        (
            "[[loads]]\ntenant = \"a\"\nkind = \"open\"\nrate = 1.0\nburst_secs = 30.0\n",
            "burst_secs needs quota_of_capacity",
        ),
        (
            "[[loads]]\ntenant = \"a\"\nkind = \"open\"\nrate = 1.0\nquota_of_capacity = 0.1\nburst_secs = -1.0\n",
            "burst_secs must be within",
        ),
        (
            "[[flow.tenants]]\nname = \"a\"\nweight = 0\n[[loads]]\ntenant = \"a\"\nkind = \"open\"\nrate = 1.0\n",
            "weight",
        ),
    ];
    for (i, (text, says)) in cases.iter().enumerate() {
        let f = dir.join(format!("{i}.toml"));
        std::fs::write(&f, text).unwrap();
        let e = format!(
            "{:#}",
            Spec::load(&format!("tenants:{}", f.display())).unwrap_err()
        );
        assert!(e.contains(says), "{text}: {e}");
    }
    let e = format!(
        "{:#}",
        Spec::load("tenants:/nonexistent/x.toml").unwrap_err()
    );
    assert!(e.contains("reading tenants spec"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_quota_s_bucket_holds_its_burst_secs_of_the_quota() {
    let spec: Spec = toml::from_str(
        "[[flow.tenants]]\nname = \"a\"\nweight = 2.0\n[[loads]]\ntenant = \"a\"\nkind = \"open\"\nrate = 1.0\nquota_of_capacity = 0.5\nburst_secs = 60.0\n[[loads]]\ntenant = \"b\"\nkind = \"open\"\nrate = 1.0\nquota_of_capacity = 0.5\n",
    )
    .unwrap();
    let quota = Resolved {
        rate: Some(1.0),
        quota_tokens_per_s: Some(100.5),
    };
    let flow = flow_config(&spec, &[quota, quota]);
    let a = flow.tenants.iter().find(|t| t.name == "a").unwrap();
    assert_eq!(
        (a.weight, a.tokens_per_sec, a.burst_tokens),
        (2.0, Some(100.5), Some(6_030))
    );
    // Without burst_secs: the flow settings' default (10 s of the rate, left unset here).
    let b = flow.tenants.iter().find(|t| t.name == "b").unwrap();
    assert_eq!((b.tokens_per_sec, b.burst_tokens), (Some(100.5), None));
}

#[test]
fn the_shipped_specs_read() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench/tenants");
    let mut read = 0;
    let mut dirs = vec![dir];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).expect("bench/tenants") {
            let p = e.expect("entry").path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "toml") {
                Spec::load(&format!("tenants:{}", p.display()))
                    .unwrap_or_else(|e| panic!("{}: {e:#}", p.display()));
                read += 1;
            }
        }
    }
    assert!(read >= 4, "{read} specs");
}
