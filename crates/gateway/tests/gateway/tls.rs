//! TLS on the gateway's listener: a client that trusts the certificate is served (plain
//! requests and streams), plain HTTP on the TLS port gets nothing, bad files stop the start.

use crate::support::*;
use std::path::PathBuf;

/// A self-signed certificate for `localhost` and `127.0.0.1`, written as PEM files.
fn certificate(dir: &str) -> (PathBuf, PathBuf, reqwest::Certificate) {
    let c =
        rcgen::generate_simple_self_signed(vec!["localhost".into(), "127.0.0.1".into()]).unwrap();
    let dir = std::env::temp_dir().join(format!("kvroute-tls-{dir}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::write(&cert, c.cert.pem()).unwrap();
    std::fs::write(&key, c.key_pair.serialize_pem()).unwrap();
    let trusted = reqwest::Certificate::from_pem(c.cert.pem().as_bytes()).unwrap();
    (cert, key, trusted)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_serves_over_tls_when_given_a_certificate() {
    let w = worker("w").await;
    let (cert, key, trusted) = certificate("serve");
    let mut cfg = config(&[&w], "kv");
    cfg.tls.cert_file = Some(cert.clone());
    cfg.tls.key_file = Some(key.clone());
    let gw = gateway(&[&w], cfg).await;
    let https = format!("https://localhost:{}", gw.addr().port());
    let client = reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(trusted)
        .build()
        .unwrap();
    let r = client.get(format!("{https}/health")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let r = client
        .post(format!("{https}/v1/chat/completions"))
        .json(&chat(&[("user", "over TLS")], true, 6))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    assert!(text.contains("[DONE]"), "{text}");
    // A client that does not trust the certificate is refused by its own TLS check; plain
    // HTTP on the TLS port gets no HTTP answer.
    let untrusting = reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .build()
        .unwrap();
    assert!(untrusting
        .get(format!("{https}/health"))
        .send()
        .await
        .is_err());
    let plain = crate::support::client()
        .get(format!("http://127.0.0.1:{}/health", gw.addr().port()))
        .send()
        .await;
    assert!(plain.is_err(), "{plain:?}");
    // Still serving after both.
    let r = client.get(format!("{https}/live")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    gw.shutdown().await;

    // Files that do not make a TLS setup stop the start with a clear error.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut bad = config(&[&w], "kv");
    bad.tls.cert_file = Some(key.clone());
    bad.tls.key_file = Some(key.clone());
    let pre = kvroute_gateway::load_preprocessor(&bad).unwrap();
    let err = kvroute_gateway::spawn(bad, pre, listener, Default::default())
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("tls") && err.contains("certificate"), "{err}");
    let mut half = config(&[&w], "kv");
    half.tls.cert_file = Some(cert);
    assert!(half
        .validate()
        .unwrap_err()
        .to_string()
        .contains("tls.key_file"));
    w.shutdown().await;
}
