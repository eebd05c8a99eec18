//! GGUF files written by ember (`gguf::save_gguf`, behind `ember export` / `ember quantize --out FILE.gguf`):
//! they load back as the same model with the same tokenizer, in every recipe's type mix, and what cannot be
//! written is refused before anything lands at the destination. llama.cpp's own reading of these files is
//! checked by `gguf_export_llama_cpp.rs` against fixtures recorded with llama.cpp.

mod common;

use std::path::{Path, PathBuf};

use common::{B, floats, max_abs_diff, tokens};
use ember_model::gguf::{
    self, GgmlType, GgufExport, GgufFile, GgufRecipe, MetadataValue, RecipeTensor,
};
use safetensors::SafeTensors;

/// llama.cpp-converted fixtures of the families ember writes (scripts/fixtures/gguf_family_fixtures.py).
const WRITABLE: [&str; 12] = [
    "llama",
    "llama_bias",
    "llama_q8_0",
    "llama3",
    "mistral",
    "qwen2",
    "qwen3",
    "phi3",
    "phi3_longrope",
    "gemma2",
    "gemma3",
    "gpt_neox",
];

fn source(name: &str) -> PathBuf {
    common::fixture("gguf_families").join(format!("{name}.gguf.bin"))
}

/// The fixture's token ids and transformers' logits on them.
fn expected(name: &str) -> (Vec<u32>, Vec<f32>) {
    let bytes = std::fs::read(common::fixture("gguf_families").join(format!("{name}.safetensors")))
        .unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let ids = st
        .tensor("tokens")
        .unwrap()
        .data()
        .chunks_exact(8)
        .map(|b| i64::from_le_bytes(b.try_into().unwrap()) as u32)
        .collect();
    (ids, floats(&st, "logits"))
}

fn logits(file: &GgufFile, ids: &[u32]) -> Vec<f32> {
    let model = gguf::load::<B>(file, &Default::default(), None).unwrap();
    model
        .forward(tokens(ids))
        .unwrap()
        .into_data()
        .into_vec::<f32>()
        .unwrap()
}

/// Writes fixture `name` under `recipe` into `dir`, returning the new file's path.
fn export(name: &str, recipe: GgufRecipe, dir: &Path) -> PathBuf {
    let file = GgufFile::open(source(name)).unwrap();
    let model = gguf::load::<B>(&file, &Default::default(), None).unwrap();
    let out = dir.join(format!("{name}-{recipe}.gguf"));
    let export = GgufExport {
        recipe,
        tokenizer: gguf::tokenizer_metadata(&file),
        name: Some(name.to_string()),
    };
    gguf::save_gguf(&model, &export, &out, None).unwrap_or_else(|e| panic!("{name}: {e}"));
    out
}

#[test]
fn f32_files_load_back_as_the_same_model_with_the_same_tokenizer() {
    let dir = tempfile::tempdir().unwrap();
    for name in WRITABLE {
        let original = GgufFile::open(source(name)).unwrap();
        let written = GgufFile::open(export(name, GgufRecipe::F32, dir.path())).unwrap();
        assert_eq!(
            gguf::model_spec(&written).unwrap().1,
            gguf::model_spec(&original).unwrap().1,
            "{name}: spec"
        );
        assert_eq!(
            gguf::tokenizer_metadata(&written),
            gguf::tokenizer_metadata(&original),
            "{name}: tokenizer keys"
        );
        // The same f32 values in the same layout, multiplied in the same order: exactly equal. A wrong
        // permutation, stacked slice or missing bias differs by far more than rounding.
        let (ids, _) = expected(name);
        let diff = max_abs_diff(&logits(&written, &ids), &logits(&original, &ids));
        assert_eq!(diff, 0.0, "{name}: logits of the written file");
        assert!(
            written
                .tensors()
                .iter()
                .all(|t| t.ggml_type == GgmlType::F32),
            "{name}: every tensor f32"
        );
        assert_eq!(
            written.get("general.file_type"),
            Some(&MetadataValue::U32(0))
        );
    }
}

#[test]
fn quantized_recipes_store_their_type_mix_and_stay_near_the_f32_logits() {
    // Bounds: about 1.5x the error measured for each recipe. These random N(0, 0.3^2) models amplify weight
    // noise about 15x (logits of at most 7.8; f16's 2^-11 relative rounding moves them by 0.016), and the
    // measured errors scale as each type's step: Q8_0 0.46, the 5-bit mixes 2.3-4.9, 4-bit 5.3-8.2. This test
    // checks the files load as the recipe's types and stay in range; llama.cpp's reading of the same bytes is
    // gguf_export_llama_cpp.rs's oracle.
    let dir = tempfile::tempdir().unwrap();
    let (ids, reference) = expected("llama");
    for (recipe, bound) in [
        (GgufRecipe::F16, 0.025),
        (GgufRecipe::Bf16, 0.2),
        (GgufRecipe::Q8_0, 0.7),
        (GgufRecipe::Q6_K, 0.7),
        (GgufRecipe::Q5_K_M, 3.5),
        (GgufRecipe::Q4_K_M, 7.5),
        (GgufRecipe::Q4_0, 12.0),
        (GgufRecipe::Q4_1, 8.0),
    ] {
        let path = export("llama", recipe, dir.path());
        let file = GgufFile::open(&path).unwrap();
        let (_, spec) = gguf::model_spec(&file).unwrap();
        for t in file.tensors() {
            let shape = t.shape();
            let role = RecipeTensor {
                name: &t.name,
                dims: shape.len(),
                cols: *shape.last().unwrap(),
                layer: RecipeTensor::layer_of(&t.name),
                layers: spec.num_layers,
                tied: file.tensor_info(gguf::OUTPUT).is_err(),
                gqa: spec.num_heads / spec.num_kv_heads,
            };
            assert_eq!(
                t.ggml_type,
                recipe.tensor_type(&role),
                "{recipe}: {}",
                t.name
            );
        }
        assert_eq!(
            file.get("general.file_type"),
            Some(&MetadataValue::U32(recipe.file_type()))
        );
        let diff = max_abs_diff(&logits(&file, &ids), &reference);
        assert!(diff <= bound, "{recipe}: max logit error {diff} > {bound}");
        assert!(diff > 0.0, "{recipe}: the weights were not rounded at all");
    }
}

/// A random model of fixture `name`'s spec changed by `edit`.
fn edited_model(
    name: &str,
    edit: impl FnOnce(&mut ember_model::ModelSpec),
) -> ember_model::Transformer<B> {
    let file = GgufFile::open(source(name)).unwrap();
    let (_, mut spec) = gguf::model_spec(&file).unwrap();
    edit(&mut spec);
    ember_model::Transformer::from_source(
        &spec,
        &mut ember_model::weights::RandomInit::with_std(7, 2, 0.3),
        &Default::default(),
        None,
    )
    .unwrap()
}

#[test]
fn a_mistral_model_is_written_as_llama_and_reads_back_as_the_same_model() {
    // llama.cpp's converter writes Mistral (without a window) as `llama`.
    let dir = tempfile::tempdir().unwrap();
    let model = edited_model("mistral", |s| {
        s.architecture = "MistralForCausalLM".to_string()
    });
    let out = dir.path().join("mistral.gguf");
    let export = GgufExport {
        recipe: GgufRecipe::F32,
        tokenizer: Vec::new(),
        name: None,
    };
    gguf::save_gguf(&model, &export, &out, None).unwrap();
    let file = GgufFile::open(&out).unwrap();
    assert_eq!(
        file.get("general.architecture"),
        Some(&MetadataValue::String("llama".to_string()))
    );
    let (_, spec) = gguf::model_spec(&file).unwrap();
    let mut as_llama = model.spec().clone();
    as_llama.architecture = "LlamaForCausalLM".to_string();
    assert_eq!(spec, as_llama);
    let (ids, _) = expected("mistral");
    let ours = model
        .forward(tokens(&ids))
        .unwrap()
        .into_data()
        .into_vec::<f32>()
        .unwrap();
    assert_eq!(max_abs_diff(&logits(&file, &ids), &ours), 0.0);
}

#[test]
fn files_that_cannot_be_written_are_refused_and_nothing_is_left_behind() {
    use ember_model::{Positions, RopeScaling};
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        // llama.cpp runs other rules than these specs say, so each file would be another model in llama.cpp.
        (
            "gemma2: every layer sliding",
            edited_model("gemma2", |s| {
                s.attention_windows = vec![Some(8); s.num_layers];
            }),
            "global",
        ),
        (
            "gemma2: no soft caps",
            edited_model("gemma2", |s| s.features.attn_softcap = None),
            "caps every Gemma 2",
        ),
        (
            "gemma3: a soft cap",
            edited_model("gemma3", |s| s.features.final_softcap = Some(30.0)),
            "no soft caps",
        ),
        (
            "phi3: two window sizes",
            edited_model("phi3", |s| s.attention_windows[0] = Some(4)),
            "one window",
        ),
        (
            "llama: dynamic NTK scaling",
            edited_model("llama", |s| {
                if let Positions::Rope(rope) = &mut s.positions {
                    rope.scaling = RopeScaling::Dynamic {
                        factor: 2.0,
                        max_position_embeddings: 32,
                    };
                }
            }),
            "dynamic",
        ),
        (
            "gpt_neox: linear scaling",
            edited_model("gpt_neox", |s| {
                if let Positions::Rope(rope) = &mut s.positions {
                    rope.scaling = RopeScaling::Linear { factor: 2.0 };
                }
            }),
            "no RoPE scaling",
        ),
        (
            "mistral: a sliding window",
            edited_model("mistral", |s| {
                s.architecture = "MistralForCausalLM".to_string();
                s.attention_windows = vec![Some(8); s.num_layers];
            }),
            "slide over 8 tokens",
        ),
        // A spec the metadata cannot carry at all is caught by reading the written file back: Qwen2 with
        // LLaMA's MLP biases reads back without them.
        (
            "qwen2: MLP biases",
            edited_model("qwen2", |s| s.features.biases.mlp_in = true),
            "load back as a different model",
        ),
    ];
    for (case, model, needle) in cases {
        let out = dir.path().join("refused.gguf");
        let export = GgufExport {
            recipe: GgufRecipe::F32,
            tokenizer: Vec::new(),
            name: None,
        };
        let err = gguf::save_gguf(&model, &export, &out, None)
            .unwrap_err()
            .to_string();
        assert!(err.contains(needle), "{case}: {err}");
    }
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert!(left.is_empty(), "files left: {left:?}");
}

#[test]
fn the_type_mix_follows_llama_cpp_on_a_smollm2_shaped_model() {
    // SmolLM2-135M: 30 layers, width 576 (not a multiple of 256: K-quants fall back), MLP 1536 (a multiple),
    // 9 query heads over 3 key/value heads, tied embeddings. llama.cpp's Q4_K_M file of it is mostly Q5_0 with
    // Q4_K/Q6_K down projections and a Q8_0 embedding, as this recipe gives.
    let role = |name: &'static str, cols: usize, layer: Option<usize>| RecipeTensor {
        name,
        dims: 2,
        cols,
        layer,
        layers: 30,
        tied: true,
        gqa: 3,
    };
    let q4km = GgufRecipe::Q4_K_M;
    assert_eq!(
        q4km.tensor_type(&role("token_embd.weight", 576, None)),
        GgmlType::Q8_0
    );
    assert_eq!(
        q4km.tensor_type(&role("blk.5.attn_q.weight", 576, Some(5))),
        GgmlType::Q5_0
    );
    // use_more_bits: the first and last eighth (layers 0..3 and 26..30) and every third layer between.
    assert_eq!(
        q4km.tensor_type(&role("blk.0.attn_v.weight", 576, Some(0))),
        GgmlType::Q8_0
    );
    assert_eq!(
        q4km.tensor_type(&role("blk.4.attn_v.weight", 576, Some(4))),
        GgmlType::Q5_0
    );
    assert_eq!(
        q4km.tensor_type(&role("blk.5.attn_v.weight", 576, Some(5))),
        GgmlType::Q8_0
    );
    assert_eq!(
        q4km.tensor_type(&role("blk.0.ffn_down.weight", 1536, Some(0))),
        GgmlType::Q6_K
    );
    assert_eq!(
        q4km.tensor_type(&role("blk.4.ffn_down.weight", 1536, Some(4))),
        GgmlType::Q4_K
    );
    assert_eq!(
        q4km.tensor_type(&role("blk.29.ffn_down.weight", 1536, Some(29))),
        GgmlType::Q6_K
    );
    let norm = RecipeTensor {
        dims: 1,
        ..role("blk.0.attn_norm.weight", 576, Some(0))
    };
    assert_eq!(q4km.tensor_type(&norm), GgmlType::F32);
    assert_eq!(
        GgufRecipe::Q8_0.tensor_type(&role("token_embd.weight", 576, None)),
        GgmlType::Q8_0
    );
    assert_eq!(
        GgufRecipe::Q4_0.tensor_type(&role("token_embd.weight", 576, None)),
        GgmlType::Q8_0,
        "a tied head is the output tensor: Q6_K, which falls back to Q8_0 at width 576"
    );
    assert_eq!(
        GgufRecipe::Q4_0.tensor_type(&role("blk.3.ffn_up.weight", 576, Some(3))),
        GgmlType::Q4_0
    );
    // A width no block divides is stored F16.
    assert_eq!(
        q4km.tensor_type(&role("blk.3.ffn_up.weight", 100, Some(3))),
        GgmlType::F16
    );
    for (name, recipe) in gguf::RECIPES {
        assert_eq!(GgufRecipe::parse(name), Some(recipe));
        assert_eq!(GgufRecipe::parse(&name.to_uppercase()), Some(recipe));
        assert_eq!(recipe.to_string(), name);
    }
    assert_eq!(GgufRecipe::parse("q4_k_x"), None);
}
