//! A block's modules are listed once: `Block::modules` (what lookup, saving, quantization and weight memory read)
//! must name exactly the tensors `ModelSpec::tensors` expects, for every family's fixture.

mod common;

use common::{B, FIXTURES, fixture};
use ember_model::nn::BlockModule;
use ember_model::tensors::block_modules;
use ember_model::{ModelDir, QuantScheme, Quantization};

#[test]
fn block_modules_name_exactly_the_expected_tensors_of_every_family() {
    let device = Default::default();
    for name in FIXTURES {
        let dir = ModelDir::open(&fixture(name)).unwrap();
        let model = dir.load::<B>(&device, None).unwrap().model;
        let spec = model.spec().clone();
        let expected: Vec<String> = spec
            .tensors()
            .into_iter()
            .map(|t| t.name)
            .filter(|n| n.starts_with("layers."))
            .collect();
        let mut listed = Vec::new();
        for (layer, block) in model.layers.iter().enumerate() {
            for (suffix, module) in block.modules() {
                for param in ["weight", "bias"] {
                    let present = match module {
                        BlockModule::Norm(norm) => norm.parameter(param).is_some(),
                        BlockModule::Linear(linear) => linear.parameter(param).is_some(),
                    };
                    if present {
                        listed.push(format!("layers.{layer}.{suffix}.{param}"));
                    }
                }
            }
        }
        assert_eq!(
            listed, expected,
            "{name}: Block::modules vs ModelSpec::tensors"
        );
        let spec_suffixes: Vec<&str> = block_modules(&spec).iter().map(|(s, _)| *s).collect();
        let block_suffixes: Vec<&str> = model.layers[0].modules().iter().map(|(s, _)| *s).collect();
        assert_eq!(block_suffixes, spec_suffixes, "{name}: block_modules");
        // Every listed parameter is found by name, with the value the enumerator holds.
        for tensor in spec.tensors() {
            assert!(
                model.parameter(&tensor.name).is_some(),
                "{name}: parameter({}) found nothing",
                tensor.name
            );
        }
    }
}

#[test]
fn the_mutable_projection_list_matches_the_modules_and_quantization_uses_it() {
    let device = Default::default();
    let dir = ModelDir::open(&fixture("qwen3")).unwrap();
    let mut model = dir.load::<B>(&device, None).unwrap().model;
    let linear_suffixes: Vec<&str> = model.layers[0]
        .modules()
        .into_iter()
        .filter_map(|(s, m)| matches!(m, BlockModule::Linear(_)).then_some(s))
        .collect();
    let mutable: Vec<&str> = model.layers[0]
        .linears_mut()
        .into_iter()
        .map(|(s, _)| s)
        .collect();
    assert_eq!(mutable, linear_suffixes);
    let dense_bytes = model.weight_memory_bytes();
    model = model
        .quantize(&Quantization::new(QuantScheme::INT8))
        .unwrap();
    for block in &model.layers {
        for (suffix, module) in block.modules() {
            if let BlockModule::Linear(linear) = module {
                assert!(linear.is_quantized(), "{suffix} was not quantized");
            }
        }
    }
    assert!(
        model.weight_memory_bytes() < dense_bytes,
        "int8 weights take less memory than f32 ones"
    );
}
