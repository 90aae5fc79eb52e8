//! No open door by accident, with the real binary: `serve` on an address other machines can
//! reach refuses `--auth none` unless told a proxy authenticates, and a server that starts on one
//! without TLS says so at start and on `GET /api/cluster/info`.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn capstan() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_capstan"));
    for (name, _) in std::env::vars() {
        if name.starts_with("CAPSTAN_") || name.starts_with("OTEL_") {
            command.env_remove(name);
        }
    }
    command
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// `GET path` on the local port with a bearer token: the response's text, once the server
/// answers (it may still be starting).
fn get(port: u16, path: &str, token: &str, child: &mut Child) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) {
            let request = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n");
            stream.write_all(request.as_bytes()).unwrap();
            let mut answer = String::new();
            stream.read_to_string(&mut answer).unwrap();
            return answer;
        }
        assert!(child.try_wait().unwrap().is_none(), "the server stopped");
        assert!(Instant::now() < deadline, "the server never answered");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn refused(output: &Output) -> String {
    assert_eq!(output.status.code(), Some(2), "{}", text(&output.stderr));
    text(&output.stderr)
}

#[test]
fn an_unauthenticated_server_on_the_network_refuses_to_start_unless_allowed() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let listen = format!("0.0.0.0:{}", free_port());
    let output = capstan()
        .args(["serve", "--listen", &listen, "--data-dir", data.to_str().unwrap()])
        .output()
        .unwrap();
    let message = refused(&output);
    assert!(
        message.contains("--allow-unauthenticated-network") && message.contains("--auth token"),
        "{message}"
    );
    assert!(!data.exists(), "a refused start touched the data directory");

    let check = capstan().args(["serve", "--check-config", "--listen", &listen]).output().unwrap();
    assert!(refused(&check).contains("--allow-unauthenticated-network"));
    let allowed = capstan()
        .args(["serve", "--check-config", "--listen", &listen, "--allow-unauthenticated-network"])
        .output()
        .unwrap();
    assert!(allowed.status.success(), "{}", text(&allowed.stderr));
    assert!(text(&allowed.stderr).contains("warning: --listen"), "{}", text(&allowed.stderr));
    let by_environment = capstan()
        .args(["serve", "--check-config", "--listen", &listen])
        .env("CAPSTAN_ALLOW_UNAUTHENTICATED_NETWORK", "true")
        .output()
        .unwrap();
    assert!(by_environment.status.success(), "{}", text(&by_environment.stderr));
    let file = dir.path().join("capstan.toml");
    std::fs::write(&file, format!("listen = \"{listen}\"\nallow_unauthenticated_network = true\n")).unwrap();
    let by_file = capstan()
        .args(["serve", "--check-config", "--config", file.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(by_file.status.success(), "{}", text(&by_file.stderr));
    assert!(
        text(&by_file.stdout).contains("allow_unauthenticated_network = \"true\"  # config file"),
        "{}",
        text(&by_file.stdout)
    );

    // On loopback nothing is demanded.
    let local = capstan()
        .args(["serve", "--check-config", "--listen", "127.0.0.1:0"])
        .output()
        .unwrap();
    assert!(
        local.status.success() && !text(&local.stderr).contains("warning"),
        "{}",
        text(&local.stderr)
    );
}

#[test]
fn tokens_over_plain_http_on_the_network_start_with_a_loud_warning() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut child = capstan()
        .args([
            "serve",
            "--listen",
            &format!("0.0.0.0:{port}"),
            "--auth",
            "token",
            "--token",
            "s3cret",
        ])
        .args(["--data-dir", dir.path().to_str().unwrap()])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let info = get(port, "/api/cluster/info", "s3cret", &mut child);
    child.kill().unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(info.starts_with("HTTP/1.1 200"), "{info}");
    assert!(
        info.contains("plaintext_network_listener") && info.contains("without TLS"),
        "{info}"
    );
    let log = text(&output.stderr);
    assert!(log.contains("WARN") && log.contains("without TLS"), "{log}");
}

/// A self-signed certificate for localhost made by openssl in `dir`: its and its key's paths.
fn self_signed(dir: &std::path::Path) -> (String, String) {
    let made = Command::new("openssl")
        .args(["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"])
        .args(["-keyout", "key.pem", "-out", "cert.pem", "-days", "2", "-subj", "/CN=localhost"])
        .args(["-addext", "subjectAltName=DNS:localhost"])
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(made.status.success(), "{}", text(&made.stderr));
    let path = |name: &str| dir.join(name).to_str().unwrap().to_string();
    (path("cert.pem"), path("key.pem"))
}

#[test]
fn tls_quiets_the_warning_and_required_client_certificates_open_the_network() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = self_signed(dir.path());
    let listen = format!("0.0.0.0:{}", free_port());
    let check = |extra: &[&str]| {
        capstan()
            .args([
                "serve",
                "--check-config",
                "--listen",
                &listen,
                "--tls-cert",
                &cert,
                "--tls-key",
                &key,
            ])
            .args(extra)
            .output()
            .unwrap()
    };
    // TLS alone does not authenticate anyone.
    assert!(refused(&check(&[])).contains("--tls-client-ca"));
    // Only holders of a certificate the CA signed get in: no proxy needed, no warning.
    let mutual = check(&["--tls-client-ca", &cert]);
    assert!(mutual.status.success(), "{}", text(&mutual.stderr));
    assert!(!text(&mutual.stderr).contains("warning"), "{}", text(&mutual.stderr));
    // Tokens over TLS: nothing crosses in clear text.
    let tokens = check(&["--auth", "token", "--token", "t"]);
    assert!(tokens.status.success(), "{}", text(&tokens.stderr));
    assert!(!text(&tokens.stderr).contains("warning"), "{}", text(&tokens.stderr));
}
