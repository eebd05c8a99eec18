//! llama.cpp as the oracle of the GGUF files ember writes (fixtures from scripts/fixtures/gguf_export_fixtures.py):
//! llama.cpp loads and runs them with the logits ember computes from the same file, and llama.cpp's own
//! quantizer, given ember's f32 file, chooses the same type for every tensor and writes the same blocks, bit for
//! bit, as ember's quantizer does.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use common::{B, floats, max_abs_diff, tokens};
use ember_model::gguf::{self, GgufExport, GgufFile, GgufRecipe, GgufSource};
use safetensors::SafeTensors;
use serde_json::Value;

fn fixture_dir() -> PathBuf {
    common::fixture("gguf_export")
}

fn record() -> Value {
    let text = std::fs::read_to_string(fixture_dir().join("llama_cpp.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// FNV-1a 64, as the fixture script hashes files and tensors.
fn fnv1a64(bytes: &[u8]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// Writes fixture `name` under `recipe` into `dir` as `ember export` / `ember quantize --name fixture` do.
fn write(name: &str, recipe: GgufRecipe, dir: &Path) -> PathBuf {
    let source = common::fixture("gguf_families").join(format!("{name}.gguf.bin"));
    let file = GgufFile::open(&source).unwrap();
    let model = gguf::load::<B>(&file, &Default::default(), None).unwrap();
    write_model(&model, &file, name, recipe, dir)
}

fn write_model(
    model: &ember_model::Transformer<B>,
    file: &GgufFile,
    name: &str,
    recipe: GgufRecipe,
    dir: &Path,
) -> PathBuf {
    let out = dir.join(format!("{name}-{recipe}.gguf"));
    let export = GgufExport {
        recipe,
        tokenizer: gguf::tokenizer_metadata(file),
        // The fixture script's `--name`.
        name: Some("fixture".to_string()),
    };
    gguf::save_gguf(model, &export, &out, None).unwrap_or_else(|e| panic!("{name} {recipe}: {e}"));
    out
}

/// The bound on |ember - llama.cpp| for fixture `name` in `recipe`, and why. These random N(0, 0.3^2) models
/// (logits of at most 7.8) amplify rounding noise about 15x (gguf_export.rs measures it for weight rounding).
fn tolerance(name: &str, recipe: GgufRecipe) -> f32 {
    match recipe {
        // ggml's CPU GELU reads a table indexed by the f16-rounded input (`GGML_GELU_FP16` in ggml-cpu's
        // vec.h), and it is the tanh form for GPT-NeoX too; ember (like transformers, which these fixtures
        // match to 1e-4) computes it in f32, exactly (erf) for GPT-NeoX. Measured 2.0e-3 (GPT-2), 2.3e-3
        // (GPT-NeoX), 2.8e-3 (Gemma 2), 3.7e-3 (Gemma 3).
        GgufRecipe::F32 if ["gpt2", "gpt_neox", "gemma2", "gemma3"].contains(&name) => 1e-2,
        // f32 weights and (the fixture asks for it) an f32 KV cache on both sides; only the summation order
        // differs, as for every f32 parity fixture. Measured ~1e-5.
        GgufRecipe::F32 => 1e-4,
        // llama.cpp rounds the activations to f16 for its f16 products (ggml's `vec_dot_type` for F16 weights);
        // ember multiplies f32 activations with the widened f16 weights. Measured 0.0105.
        GgufRecipe::F16 => 0.02,
        // llama.cpp quantizes the activations to 8 bits per block (Q8_0 / Q8_K) for its quantized products;
        // ember's exact path (what `load` gives, and what a prefill uses) does not. Measured 0.14-0.72 across
        // the recipes. Blocks read differently by the two (a wrong scale, sub-block order or fallback type)
        // leave nothing of the weights: errors of the logits' own size (> 5, like Q4_0 against f32).
        _ => 1.0,
    }
}

#[test]
fn llama_cpp_runs_embers_files_with_embers_logits() {
    let dir = tempfile::tempdir().unwrap();
    let record = record();
    let bytes = std::fs::read(fixture_dir().join("llama_cpp.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let cases = record["cases"].as_object().unwrap();
    assert!(cases.len() >= 20, "the fixture lost cases");
    let mut failures = Vec::new();
    for (case, info) in cases {
        let (name, recipe_name) = case.split_once('.').unwrap();
        let recipe = GgufRecipe::parse(recipe_name).unwrap();
        let path = write(name, recipe, dir.path());
        let hash = fnv1a64(&std::fs::read(&path).unwrap());
        assert_eq!(
            hash,
            info["file_fnv1a64"].as_str().unwrap(),
            "{case}: ember no longer writes the file llama.cpp ran; re-run scripts/fixtures/gguf_export_fixtures.py"
        );
        let ids: Vec<u32> = info["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        let file = GgufFile::open(&path).unwrap();
        let (family, mut spec) = gguf::model_spec(&file).unwrap();
        if spec.architecture == "Phi3ForCausalLM" {
            // llama.cpp (0.3.36) runs Phi-3 without its sliding window, whatever
            // `phi3.attention.sliding_window` says; ember keeps it, as transformers does (the family fixture
            // checks that). Past the window the two models differ by design (by ~9 on this fixture), so the
            // file is compared with ember running it in full.
            spec.attention_windows = vec![None; spec.num_layers];
        }
        let model = ember_model::Transformer::<B>::from_source(
            &spec,
            &mut GgufSource::new(&file, family, &spec),
            &Default::default(),
            None,
        )
        .unwrap();
        let ours = model
            .forward(tokens(&ids))
            .unwrap()
            .into_data()
            .into_vec::<f32>()
            .unwrap();
        let theirs = floats(&st, &format!("{case}.logits"));
        let diff = max_abs_diff(&ours, &theirs);
        let bound = tolerance(name, recipe);
        if diff > bound {
            failures.push(format!(
                "{case}: max |ember - llama.cpp| = {diff} > {bound}"
            ));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn embers_quantizer_writes_llama_cpps_types_and_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let record = record();
    let quantizer = record["quantizer"].as_object().unwrap();
    assert!(!quantizer.is_empty());
    let mut failures = Vec::new();
    for (name, recipes) in quantizer {
        // llama.cpp quantized ember's f32 file; ember quantizes the model that file holds.
        let f32_path = write(name, GgufRecipe::F32, dir.path());
        let f32_file = GgufFile::open(&f32_path).unwrap();
        let model = gguf::load::<B>(&f32_file, &Default::default(), None).unwrap();
        let recipes = recipes.as_object().unwrap();
        assert!(recipes.len() >= 14, "{name}: the fixture lost recipes");
        for (recipe_name, tensors) in recipes {
            let recipe = GgufRecipe::parse(recipe_name).unwrap();
            let path = write_model(&model, &f32_file, name, recipe, dir.path());
            let file = GgufFile::open(&path).unwrap();
            let ours: BTreeMap<String, (String, String)> = file
                .tensors()
                .iter()
                .map(|t| {
                    let data = file.tensor_bytes(&t.name).unwrap();
                    (t.name.clone(), (t.ggml_type.to_string(), fnv1a64(data)))
                })
                .collect();
            let theirs: BTreeMap<String, (String, String)> = tensors
                .as_object()
                .unwrap()
                .iter()
                .map(|(n, v)| {
                    let v = v.as_array().unwrap();
                    (
                        n.clone(),
                        (
                            v[0].as_str().unwrap().to_string(),
                            v[1].as_str().unwrap().to_string(),
                        ),
                    )
                })
                .collect();
            assert_eq!(
                ours.keys().collect::<Vec<_>>(),
                theirs.keys().collect::<Vec<_>>(),
                "{name} {recipe}: tensor names"
            );
            for (tensor, (ty, hash)) in &theirs {
                let (our_ty, our_hash) = &ours[tensor];
                if our_ty != ty {
                    failures.push(format!(
                        "{name} {recipe}: {tensor} is {our_ty}, llama.cpp chose {ty}"
                    ));
                } else if our_hash != hash {
                    failures.push(format!(
                        "{name} {recipe}: {tensor} ({ty}) blocks differ from llama.cpp's"
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
