//! GGUF files of every family through the CLI: `ember info`, `ember tokenize` and `ember generate --chat` on the
//! tiny llama.cpp-converted fixtures of crates/model/tests/fixtures/gguf_families (each holds a byte-level BPE
//! tokenizer and a ChatML template, as the converter writes them).

mod common;

use burn::backend::Flex;
use burn::tensor::{Int, Tensor, TensorData};
use ember_model::gguf::{self, GgufFile};
use ember_model::{Step, Transformer};

use common::{ember, gguf_fixture, model_fixture, ok, run_cpu};

/// One fixture per GGUF architecture ember reads, with the architecture `ember info` must report.
const FAMILIES: [(&str, &str); 9] = [
    ("llama", "LlamaForCausalLM"),
    ("qwen2", "Qwen2ForCausalLM"),
    ("qwen3", "Qwen3ForCausalLM"),
    ("phi3", "Phi3ForCausalLM"),
    // Phi-3 with LongRoPE (`ember info` names it).
    ("phi3_longrope", "Phi3ForCausalLM"),
    ("gpt2", "GPT2LMHeadModel"),
    ("gpt_neox", "GPTNeoXForCausalLM"),
    ("gemma2", "Gemma2ForCausalLM"),
    ("gemma3", "Gemma3ForCausalLM"),
];

/// Greedy ids from the library, token by token through the KV cache: what the CLI must print.
fn library_greedy(name: &str, prompt: &[u32], steps: usize) -> Vec<u32> {
    let file = GgufFile::open(gguf_fixture(name)).unwrap();
    let model: Transformer<Flex> = gguf::load(&file, &Default::default(), None).unwrap();
    let vocab = model.spec().vocab_size;
    let mut cache = ember_attention::ContiguousKvCache::<Flex>::new(model.spec().num_layers);
    let mut input = prompt.to_vec();
    let mut out = Vec::new();
    for _ in 0..steps {
        let ids: Vec<i64> = input.iter().map(|&i| i as i64).collect();
        let tokens = Tensor::<Flex, 2, Int>::from_data(
            TensorData::new(ids, [1, input.len()]),
            &Default::default(),
        );
        let step = Step {
            cache: Some(&mut cache),
            ..Step::default()
        };
        let logits = model.forward_with(tokens, step).unwrap();
        let values = logits.into_data().into_vec::<f32>().unwrap();
        let last = &values[values.len() - vocab..];
        let next = (0..vocab).fold(0, |best, i| if last[i] > last[best] { i } else { best });
        out.push(next as u32);
        input = vec![next as u32];
    }
    out
}

#[test]
fn info_reports_each_gguf_familys_architecture() {
    for (name, architecture) in FAMILIES {
        let path = gguf_fixture(name).display().to_string();
        let out = ok(run_cpu(&["info", "--model", &path]));
        let text = String::from_utf8(out.stdout).unwrap();
        assert!(text.contains(architecture), "{name}: {text}");
        if name == "phi3_longrope" {
            assert!(
                text.contains("LongRoPE (short factors up to 16 positions"),
                "{text}"
            );
        }
    }
}

#[test]
fn generate_chat_runs_on_a_gguf_of_each_family() {
    for (name, _) in FAMILIES {
        let path = gguf_fixture(name).display().to_string();
        let out = ok(run_cpu(&[
            "generate",
            "--model",
            &path,
            "--chat",
            "--prompt",
            "Good morrow",
            "--temperature",
            "0",
            "--max-new-tokens",
            "6",
            "--format",
            "json",
        ]));
        let line: serde_json::Value =
            serde_json::from_slice(out.stdout.split(|&b| b == b'\n').next().unwrap()).unwrap();
        let ids = |key: &str| -> Vec<u32> {
            line[key]
                .as_array()
                .unwrap_or_else(|| panic!("{name}: no `{key}` in {line}"))
                .iter()
                .map(|v| v.as_u64().unwrap() as u32)
                .collect()
        };
        let (prompt, generated) = (ids("prompt_ids"), ids("ids"));
        // The prompt went through the file's ChatML template: it opens with `<|im_start|>`.
        let tokenizer = gguf::load_tokenizer(&gguf_fixture(name)).unwrap();
        assert_eq!(
            prompt.first().copied(),
            tokenizer.token_to_id("<|im_start|>"),
            "{name}: prompt {prompt:?}"
        );
        // Stopping at the template's end token may shorten the reply; what was generated is the greedy prefix.
        let expected = library_greedy(name, &prompt, generated.len());
        assert_eq!(generated, expected, "{name}");
    }
}

#[test]
fn tokenize_reads_the_tokenizer_of_a_gguf_file() {
    use std::io::Write;
    let mut child = ember()
        .args(["--quiet", "tokenize", "--tokenizer"])
        .arg(gguf_fixture("qwen2"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"Good morrow, cousin")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let tokenizer = gguf::load_tokenizer(&gguf_fixture("qwen2")).unwrap();
    let ids = tokenizer.encode_ordinary("Good morrow, cousin").unwrap();
    assert!(!ids.is_empty());
    let printed: Vec<u32> = text
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().unwrap())
        .collect();
    assert_eq!(printed, ids, "{text}");
}

#[test]
fn prepare_tokenizes_a_corpus_with_a_gguf_files_vocabulary() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("corpus.txt");
    std::fs::write(
        &input,
        "Good morrow, cousin.\n\nWhat news abroad?\n".repeat(40),
    )
    .unwrap();
    let output = dir.path().join("shards");
    let tokenizer = gguf_fixture("qwen2").display().to_string();
    ok(run_cpu(&[
        "prepare",
        "--tokenizer",
        &tokenizer,
        "--input",
        &input.display().to_string(),
        "--output",
        &output.display().to_string(),
    ]));
    let written = std::fs::read_dir(&output).unwrap().count();
    assert!(written > 0, "no shards in {}", output.display());
}

/// Runs ember expecting failure; returns its stderr.
fn ember_fails(args: &[&str]) -> String {
    let out = run_cpu(args);
    assert!(!out.status.success(), "ember {args:?} should have failed");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn quantize_and_export_write_gguf_files_that_ember_runs() {
    let dir = tempfile::tempdir().unwrap();
    let source = gguf_fixture("qwen3");
    for (args, types) in [
        (vec!["quantize", "--quantize", "q4_k_m"], "Q5_0"),
        (vec!["quantize", "--quantize", "Q8_0"], "Q8_0"),
        (vec!["export", "--dtype", "f16"], "F16"),
    ] {
        let out = dir.path().join(format!("{}.gguf", args.last().unwrap()));
        let mut full = args.clone();
        full.extend([
            "--model",
            source.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ]);
        ok(run_cpu(&full));
        let file = GgufFile::open(&out).unwrap();
        assert!(
            file.tensors()
                .iter()
                .any(|t| t.ggml_type.to_string() == types),
            "{args:?}: no {types} tensor"
        );
        let info =
            String::from_utf8(ok(run_cpu(&["info", "--model", out.to_str().unwrap()])).stdout)
                .unwrap();
        assert!(info.contains("Qwen3ForCausalLM"), "{info}");
        let generated = ok(run_cpu(&[
            "generate",
            "--model",
            out.to_str().unwrap(),
            "--tokens",
            "5,6,7",
            "--max-new-tokens",
            "4",
            "--temperature",
            "0",
        ]));
        assert!(!generated.stdout.is_empty());
    }
}

#[test]
fn gguf_writing_refuses_bad_requests_by_flag() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("x.gguf");
    let out = out.to_str().unwrap();
    let llama = gguf_fixture("llama");
    let llama = llama.to_str().unwrap();
    // GPT-Neo is the one family llama.cpp has no architecture for.
    let gpt_neo = model_fixture("gpt_neo");
    for (args, needle) in [
        (
            vec![
                "export", "--model", llama, "--out", out, "--dtype", "q4_k_m",
            ],
            "--dtype q4_k_m",
        ),
        (
            vec!["export", "--model", llama, "--out", out, "--format", "onnx"],
            "--format onnx",
        ),
        (
            vec![
                "export",
                "--model",
                llama,
                "--out",
                dir.path().to_str().unwrap(),
            ],
            "is a directory",
        ),
        (
            vec!["export", "--model", llama, "--out", llama],
            "must differ",
        ),
        (
            vec!["export", "--model", gpt_neo.to_str().unwrap(), "--out", out],
            "does not write",
        ),
        (
            vec![
                "quantize",
                "--model",
                llama,
                "--out",
                out,
                "--quantize",
                "q4_k_x",
            ],
            "--quantize q4_k_x",
        ),
        (
            vec![
                "quantize",
                "--model",
                llama,
                "--out",
                out,
                "--quantize",
                "q4_k_m",
                "--f32-lm-head",
            ],
            "--f32-lm-head applies to the int8/int4 schemes",
        ),
    ] {
        let err = ember_fails(&args);
        assert!(err.contains(needle), "{args:?}: {err}");
    }
    assert!(
        std::fs::read_dir(dir.path()).unwrap().next().is_none(),
        "a refused write left a file"
    );
}
