//! HTTPS as `vllm serve --ssl-certfile ... --ssl-keyfile ...` serves it: certificates made by
//! the test (rcgen), the binary started with the flags, and reqwest trusting the test's CA.
//! Plain HTTP on the TLS port fails, a missing or wrong file stops the start naming it,
//! client certificates are asked for with `--ssl-cert-reqs`, a silent client is closed after
//! `--header-read-timeout` (and does not hold the shutdown), and `--enable-ssl-refresh` picks
//! up new files.

mod common;

use std::io::Write;
use std::net::TcpStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::{closed_within, must, run_to_exit, tiny_args, Gateway, TempDir};
use rcgen::{
    BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use serde_json::{json, Value};

/// A test CA that signs server and client certificates.
struct Ca {
    pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl Ca {
    fn new() -> Self {
        let mut params = must(CertificateParams::new(Vec::new()).map_err(|e| e.to_string()));
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = must(KeyPair::generate().map_err(|e| e.to_string()));
        let cert = must(params.self_signed(&key).map_err(|e| e.to_string()));
        Self {
            pem: cert.pem(),
            issuer: Issuer::new(params, key),
        }
    }

    /// A certificate for `names` with `usage`, signed by this CA: (certificate PEM, key PEM).
    fn sign(&self, names: &[&str], usage: ExtendedKeyUsagePurpose) -> (String, String) {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = must(CertificateParams::new(names).map_err(|e| e.to_string()));
        params.extended_key_usages = vec![usage];
        let key = must(KeyPair::generate().map_err(|e| e.to_string()));
        let cert = must(
            params
                .signed_by(&key, &self.issuer)
                .map_err(|e| e.to_string()),
        );
        (cert.pem(), key.serialize_pem())
    }

    fn server(&self) -> (String, String) {
        self.sign(
            &["localhost", "127.0.0.1"],
            ExtendedKeyUsagePurpose::ServerAuth,
        )
    }

    fn root(&self) -> reqwest::Certificate {
        must(reqwest::Certificate::from_pem(self.pem.as_bytes()).map_err(|e| e.to_string()))
    }
}

/// A client that trusts `ca` only, with `identity` (certificate and key PEM) when given.
fn client(ca: &Ca, identity: Option<&(String, String)>) -> reqwest::Client {
    let mut builder = reqwest::Client::builder()
        .no_proxy()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(ca.root())
        // Every request on a new connection, so each one shakes hands with the files in force.
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(60));
    if let Some((cert, key)) = identity {
        let pem = format!("{cert}{key}");
        builder = builder.identity(must(
            reqwest::Identity::from_pem(pem.as_bytes()).map_err(|e| e.to_string()),
        ));
    }
    must(builder.build().map_err(|e| e.to_string()))
}

/// The server's files in a temp folder: (folder, cert path, key path, CA path).
fn files(ca: &Ca) -> (TempDir, String, String, String) {
    let dir = must(TempDir::new("tls"));
    let (cert, key) = ca.server();
    let path = |p: PathBuf| p.display().to_string();
    let cert = path(must(dir.write("cert.pem", &cert)));
    let key = path(must(dir.write("key.pem", &key)));
    let ca_path = path(must(dir.write("ca.pem", &ca.pem)));
    (dir, cert, key, ca_path)
}

/// The tiny model served over HTTPS with `files`' certificate and key, then `extra`; probed
/// with `client`.
async fn start_https(
    files: &(TempDir, String, String, String),
    extra: &[&str],
    client: &reqwest::Client,
) -> Gateway {
    let (_, cert, key, _) = files;
    let mut args = tiny_args(&["--ssl-certfile", cert, "--ssl-keyfile", key]);
    args.extend_from_slice(extra);
    must(Gateway::start_with_client(&args, &[], "https", client).await)
}

async fn models(client: &reqwest::Client, base: &str) -> Result<Value, String> {
    let response = client
        .get(format!("{base}/v1/models"))
        .send()
        .await
        .map_err(|e| format!("{e:?}"))?;
    if response.status().as_u16() != 200 {
        return Err(format!("status {}", response.status()));
    }
    response.json().await.map_err(|e| e.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_serves_with_the_flags_and_plain_http_fails() {
    let ca = Ca::new();
    let https = client(&ca, None);
    let gateway = start_https(&files(&ca), &[], &https).await;
    assert!(gateway.base_url.starts_with("https://"));

    let listed = must(models(&https, &gateway.base_url).await);
    assert_eq!(listed["data"][0]["id"], "tiny", "{listed}");
    let chat = must(
        https
            .post(format!("{}/v1/chat/completions", gateway.base_url))
            .json(&json!({"model": "tiny", "max_tokens": 3,
                          "messages": [{"role": "user", "content": "hi"}]}))
            .send()
            .await
            .map_err(|e| e.to_string()),
    );
    assert_eq!(chat.status().as_u16(), 200);
    let body: Value = must(chat.json().await.map_err(|e| e.to_string()));
    assert_eq!(body["object"], "chat.completion", "{body}");

    // Plain HTTP to the TLS port gets no HTTP answer.
    let plain = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap_or_default();
    let answer = plain
        .get(format!("http://127.0.0.1:{}/v1/models", gateway.port))
        .send()
        .await;
    assert!(answer.is_err(), "plain HTTP was answered: {answer:?}");

    // A client that does not trust the test CA refuses the server.
    let stranger = client(&Ca::new(), None);
    assert!(models(&stranger, &gateway.base_url).await.is_err());
}

/// A server started with `--ssl-cert-reqs reqs` serves a client with a certificate of its
/// CA, serves one without a certificate only when `served_without`, and never one with a
/// certificate of another CA.
async fn client_certificates(reqs: &str, served_without: bool) {
    let ca = Ca::new();
    let files = files(&ca);
    let mine = ca.sign(&["client"], ExtendedKeyUsagePurpose::ClientAuth);
    let with_cert = client(&ca, Some(&mine));
    let extra = ["--ssl-ca-certs", &files.3, "--ssl-cert-reqs", reqs];
    let gateway = start_https(&files, &extra, &with_cert).await;
    assert!(models(&with_cert, &gateway.base_url).await.is_ok());

    let without = models(&client(&ca, None), &gateway.base_url).await;
    assert_eq!(without.is_ok(), served_without, "{without:?}");

    let foreign = Ca::new().sign(&["client"], ExtendedKeyUsagePurpose::ClientAuth);
    let refused = models(&client(&ca, Some(&foreign)), &gateway.base_url).await;
    assert!(
        refused.is_err(),
        "served a client certificate of another CA"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificates_are_required_with_cert_reqs_2() {
    client_certificates("2", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificates_are_optional_with_cert_reqs_1() {
    client_certificates("1", true).await;
}

/// The server must exit 2 with one line naming `named`.
fn refuses(args: &[&str], named: &[&str]) {
    let (status, stderr) = must(run_to_exit(args, Duration::from_secs(60)));
    assert_eq!(status.code(), Some(2), "{args:?}: {stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{args:?} should print one line:\n{stderr}");
    for name in named {
        assert!(
            lines[0].contains(name),
            "{:?} should name {name:?}",
            lines[0]
        );
    }
}

#[test]
fn a_missing_or_wrong_file_stops_the_start_naming_it() {
    let ca = Ca::new();
    let (dir, cert, key, _) = files(&ca);
    let missing = dir.path.join("absent-key.pem").display().to_string();
    refuses(
        &tiny_args(&["--ssl-certfile", &cert, "--ssl-keyfile", &missing]),
        &["--ssl-keyfile", &missing, "No such file"],
    );
    refuses(
        &tiny_args(&["--ssl-certfile", &key, "--ssl-keyfile", &key]),
        &["--ssl-certfile", &key, "no PEM certificate"],
    );
    let (_, other_key) = ca.server();
    let other_key = must(dir.write("other-key.pem", &other_key))
        .display()
        .to_string();
    refuses(
        &tiny_args(&["--ssl-certfile", &cert, "--ssl-keyfile", &other_key]),
        &["--ssl-keyfile", &other_key, "does not fit"],
    );
    let with_pair = |extra: &[&'static str]| {
        let mut args = tiny_args(&["--ssl-certfile", &cert, "--ssl-keyfile", &key]);
        args.extend_from_slice(extra);
        args.into_iter().map(String::from).collect::<Vec<String>>()
    };
    let args = with_pair(&["--ssl-cert-reqs", "2"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    refuses(&args, &["--ssl-cert-reqs 2", "--ssl-ca-certs"]);
    refuses(
        &tiny_args(&["--ssl-keyfile", &key]),
        &["--ssl-keyfile", "--ssl-certfile"],
    );
    let args = with_pair(&["--ssl-ciphers", "TLSv1"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    refuses(&args, &["--ssl-ciphers", "OpenSSL cipher strings"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_finishes_the_handshake_is_closed() {
    let ca = Ca::new();
    let https = client(&ca, None);
    let gateway = start_https(&files(&ca), &["--header-read-timeout", "1"], &https).await;
    let connect = || {
        TcpStream::connect(("127.0.0.1", gateway.port)).unwrap_or_else(|e| panic!("connect: {e}"))
    };
    let mut silent = connect();
    // The first bytes of a TLS record header, then nothing.
    let mut partial = connect();
    partial
        .write_all(&[0x16, 0x03, 0x01])
        .unwrap_or_else(|e| panic!("write: {e}"));
    // 20 times the 1 s timeout, and short of every other timer that would close them.
    assert!(closed_within(&mut silent, Duration::from_secs(20)).is_some());
    assert!(closed_within(&mut partial, Duration::from_secs(20)).is_some());
    assert!(models(&https, &gateway.base_url).await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handshake_in_progress_does_not_hold_the_shutdown() {
    let ca = Ca::new();
    let https = client(&ca, None);
    // Both timers far beyond the wait below: only the shutdown can end the handshake.
    let extra = ["--header-read-timeout", "600", "--shutdown-timeout", "600"];
    let mut gateway = start_https(&files(&ca), &extra, &https).await;
    let mut partial =
        TcpStream::connect(("127.0.0.1", gateway.port)).unwrap_or_else(|e| panic!("connect: {e}"));
    partial
        .write_all(&[0x16, 0x03, 0x01])
        .unwrap_or_else(|e| panic!("write: {e}"));
    assert!(models(&https, &gateway.base_url).await.is_ok());
    let status = gateway.terminate(Duration::from_secs(60)).await;
    assert!(
        status.is_some_and(|s| s.success()),
        "{status:?}; log:\n{}",
        gateway.output()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_files_are_served_with_enable_ssl_refresh() {
    let ca = Ca::new();
    let files = files(&ca);
    let dir = &files.0;
    let first = client(&ca, None);
    let gateway = start_https(&files, &["--enable-ssl-refresh"], &first).await;
    let renewed = Ca::new();
    let second = client(&renewed, None);
    assert!(models(&second, &gateway.base_url).await.is_err());

    // A certificate without its key does not load: the old pair stays in force.
    let (new_cert, new_key) = renewed.server();
    must(dir.write("cert.pem", &new_cert));
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(models(&first, &gateway.base_url).await.is_ok());

    must(dir.write("key.pem", &new_key));
    let started = Instant::now();
    while models(&second, &gateway.base_url).await.is_err() {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the renewed certificate was not served; log:\n{}",
            gateway.output()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(models(&first, &gateway.base_url).await.is_err());
    assert!(gateway.output().contains("do not load"));
}
