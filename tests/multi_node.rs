//! Two `ember train` processes joined through `ember orchestrator` on loopback: burn-collective's global level
//! all-reduces their gradients, so the two machines, each drawing its own windows, end with the same weights.
//!
//! Ignored: with burn-collective 0.21 both nodes register with the orchestrator and reach their first all-reduce
//! (a too-short tensor is refused with `RingReduceImpossible`, so they do get that far), but the ring all-reduce
//! between the two processes never completes (nor does the tree strategy): the test times out. Run it with
//! `cargo test --test multi_node -- --ignored` when trying a newer burn.

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn ember() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ember"))
}

/// A port nothing listens on right now (the OS picks it; the listener is closed before it is used).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Kills the child when dropped, so a failed assertion leaves no process behind.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn config(dir: &Path, orchestrator: u16, port: u16) -> std::path::PathBuf {
    let config = format!(
        r#"
name: node
seed: 7
data:
  inputs: [corpus.txt]
  val_fraction: 0.1
  cache_dir: cache-{port}
tokenizer:
  vocab_size: 300
model:
  hidden_size: 32
  num_layers: 1
  num_heads: 4
  num_kv_heads: 2
  intermediate_size: 64
  block_size: 16
training:
  batch_size: 4
  max_steps: 4
  warmup_steps: 1
  log_interval: 1
  eval_interval: 4
  eval_batches: 2
  checkpoint_interval: 4
  nodes:
    count: 2
    orchestrator: "ws://127.0.0.1:{orchestrator}"
    address: "ws://127.0.0.1:{port}"
    data_port: {port}
"#
    );
    let path = dir.join(format!("node-{port}.yaml"));
    std::fs::write(&path, config).unwrap();
    path
}

fn weights(run: &Path) -> Vec<u8> {
    std::fs::read(run.join("last").join("model.safetensors")).unwrap()
}

/// Waits for `child` up to `limit`; its stderr on failure.
fn finish(child: &mut Reaped, limit: Duration) -> Result<(), String> {
    let start = Instant::now();
    loop {
        if let Some(status) = child.0.try_wait().unwrap() {
            if status.success() {
                return Ok(());
            }
            let mut err = String::new();
            if let Some(mut stderr) = child.0.stderr.take() {
                use std::io::Read;
                let _ = stderr.read_to_string(&mut err);
            }
            return Err(format!("{status}: {err}"));
        }
        if start.elapsed() > limit {
            return Err("timed out".into());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
#[ignore = "burn-collective 0.21: the all-reduce between two processes never completes (see the module doc)"]
fn two_machines_on_loopback_all_reduce_their_gradients() {
    let dir = tempfile::tempdir().unwrap();
    let mut text = String::new();
    for i in 0..400 {
        text.push_str(&format!(
            "ROMEO: speak, sweet love, speak {i} times.\nJULIET: not I, my lord; the night is young.\n\n"
        ));
    }
    std::fs::write(dir.path().join("corpus.txt"), text).unwrap();
    let orchestrator_port = free_port();
    let _orchestrator = Reaped(
        ember()
            .args(["--quiet", "orchestrator", "--port"])
            .arg(orchestrator_port.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let runs: Vec<_> = (0..2)
        .map(|_| {
            let port = free_port();
            let out = dir.path().join(format!("run-{port}"));
            let child = ember()
                .args([
                    "--backend",
                    "cpu",
                    "--quiet",
                    "--threads",
                    "1",
                    "train",
                    "--config",
                ])
                .arg(config(dir.path(), orchestrator_port, port))
                .arg("--out")
                .arg(&out)
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            (Reaped(child), out)
        })
        .collect();
    let mut outs = Vec::new();
    for (mut child, out) in runs {
        if let Err(e) = finish(&mut child, Duration::from_secs(120)) {
            panic!("node training {}: {e}", out.display());
        }
        outs.push(out);
    }
    // Different windows on each machine (seeded by the node's address), the same all-reduced gradients: the same
    // weights, bit for bit.
    let (a, b) = (weights(&outs[0]), weights(&outs[1]));
    assert_eq!(a, b, "the two machines' weights differ");
    let losses = |run: &Path| -> Vec<f64> {
        std::fs::read_to_string(run.join("metrics.jsonl"))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .filter_map(|v| v.get("loss").and_then(|l| l.as_f64()))
            .collect()
    };
    // ... while their own losses differ: each trained on its own rows.
    let (first, second) = (losses(&outs[0]), losses(&outs[1]));
    assert_eq!(first.len(), 4);
    assert_ne!(first, second);
}
