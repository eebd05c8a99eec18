//! `ember serve` as a process: it listens where told, answers the official `openai` Python client as OpenAI's API
//! would (greedy output equal to `ember generate --chat --temperature 0`), refuses a port in use before loading
//! the model, and stops cleanly on SIGTERM.

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{ember, fixture, gguf_fixture};

/// A free port below the ephemeral range (see tests/multi_node.rs for why not `:0`).
fn free_port() -> u16 {
    let base = 20_000 + (std::process::id() % 5_000) as u16;
    (base..base + 5_000)
        .find(|&p| TcpListener::bind(("127.0.0.1", p)).is_ok())
        .expect("no free port")
}

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A bare HTTP/1.1 GET, enough to poll /health without an HTTP client dependency.
fn get(port: u16, path: &str) -> Option<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    Some(response)
}

fn start(port: u16, extra: &[&str]) -> Server {
    let child = ember()
        .args(["--quiet", "--backend", "cpu", "serve", "--model"])
        .arg(gguf_fixture("llama"))
        .args(["--port", &port.to_string(), "--model-name", "tiny"])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut server = Server(child);
    let start = Instant::now();
    while !get(port, "/health").is_some_and(|r| r.contains("\"ok\"")) {
        if let Some(status) = server.0.try_wait().unwrap() {
            let mut err = String::new();
            server
                .0
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut err)
                .unwrap();
            panic!("ember serve exited with {status}: {err}");
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "ember serve never became healthy"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    server
}

/// The repository's venv Python, when it has the `openai` package (scripts/test.sh installs it).
fn python_with_openai() -> Option<PathBuf> {
    let python = fixture(".venv/bin/python");
    let ok = Command::new(&python)
        .args(["-c", "import openai"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    ok.then_some(python)
}

fn generate_chat(prompt: &str, max_new: usize) -> serde_json::Value {
    let out = ember()
        .args(["--quiet", "--backend", "cpu", "generate", "--model"])
        .arg(gguf_fixture("llama"))
        .args([
            "--chat",
            "--prompt",
            prompt,
            "--temperature",
            "0",
            "--format",
            "json",
        ])
        .args(["--max-new-tokens", &max_new.to_string()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn the_openai_python_client_gets_what_ember_generate_prints() {
    let Some(python) = python_with_openai() else {
        eprintln!(
            "SKIPPED: .venv/bin/python with the `openai` package is missing (scripts/test.sh installs it: \
             python3 -m venv .venv && .venv/bin/pip install openai)"
        );
        return;
    };
    let port = free_port();
    let _server = start(port, &["--api-key", "sesame"]);
    let out = Command::new(python)
        .arg(fixture("tests/python/openai_client.py"))
        .args([&format!("http://127.0.0.1:{port}/v1"), "sesame", "tiny"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let want = generate_chat("Hello", 8);
    assert_eq!(got["models"], serde_json::json!(["tiny"]));
    for key in ["chat", "stream"] {
        assert_eq!(got[key]["content"], want["text"], "{key}: {got}");
        assert_eq!(got[key]["finish_reason"], "length");
        assert_eq!(got[key]["completion_tokens"], 8);
    }
    assert_eq!(got["completion"]["finish_reason"], "length");
    assert!(got["completion"]["text"].is_string());
    assert_eq!(got["bad_temperature"]["status"], 400, "{got}");
    assert_eq!(got["bad_temperature"]["param"], "temperature", "{got}");
    assert_eq!(got["wrong_key"]["status"], 401, "{got}");
}

#[test]
fn a_port_in_use_fails_at_once_and_sigterm_stops_the_server() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let out = ember()
        .args(["--quiet", "serve", "--model"])
        .arg(gguf_fixture("llama"))
        .args(["--port", &port.to_string()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("--port {port}")), "{err}");
    drop(taken);

    let port = free_port();
    let mut server = start(port, &[]);
    let metrics = get(port, "/metrics").unwrap();
    assert!(metrics.contains("ember_kv_blocks_total"), "{metrics}");
    let status = Command::new("kill")
        .args(["-TERM", &server.0.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let start = Instant::now();
    let exit = loop {
        if let Some(s) = server.0.try_wait().unwrap() {
            break s;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "ember serve ignored SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(exit.success(), "exit {exit}");
}
