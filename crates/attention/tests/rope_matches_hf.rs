//! RoPE against values produced by Hugging Face transformers (scripts/fixtures/rope_fixtures.py):
//! LLaMA default / linear / llama3 / dynamic NTK, GPT-NeoX partial rotary, GPT-J interleaved, per-row positions.

mod common;

use burn::backend::Flex;
use burn::tensor::{Int, Tensor, TensorData};
use common::{assert_close, to_vec};
use ember_attention::{AttentionError, Rope, RopeConfig, RopeLayout, RopeScaling};
use serde_json::Value;

type B = Flex;

/// HF computes inverse frequencies with f32 `pow`; ours are f64 rounded to f32: they may differ by 1 ulp
/// (relative 6e-8), plus the f32 `1/x` rounding: 3e-7 relative covers both.
const INV_FREQ_RTOL: f64 = 3e-7;
/// Output tolerance for positions up to `max_position` and inputs up to `max_abs_x`. Both sides compute the
/// angle `f32(p) * inv_freq` in f32, whose resolution is one ulp of `p * inv_freq <= p`, i.e. `p * 2^-23`;
/// with inverse frequencies 1 ulp apart the two angles can be 2 such ulps apart. A rotation moves each
/// output by at most `|x| * sqrt(2)` per radian, so the bound is `2 * p * 2^-23 * |x| * sqrt(2)`, plus 1e-6 for
/// the f32 products. (At p = 304, the largest fixture position, that is ~1e-4 for |x| ~ 1.4; a wrong
/// frequency or position moves outputs by O(|x|).)
fn output_atol(max_position: usize, max_abs_x: f64) -> f64 {
    2.0 * max_position as f64 * 2f64.powi(-23) * max_abs_x * std::f64::consts::SQRT_2 + 1e-6
}

fn load_cases() -> Vec<Value> {
    let text = include_str!("fixtures/rope.json");
    let root: Value = serde_json::from_str(text).expect("rope.json is JSON");
    root["cases"].as_array().expect("cases array").clone()
}

fn floats(value: &Value) -> Vec<f64> {
    value
        .as_array()
        .expect("array")
        .iter()
        .map(|v| v.as_f64().expect("number"))
        .collect()
}

#[test]
fn rope_matches_hugging_face_fixtures() {
    let device = Default::default();
    let cases = load_cases();
    assert_eq!(cases.len(), 10, "every fixture case is checked");
    for case in cases {
        let name = case["name"].as_str().expect("name");
        let config: RopeConfig =
            serde_json::from_value(case["config"].clone()).expect("config deserialises");
        let shape: Vec<usize> = case["shape"]
            .as_array()
            .expect("shape")
            .iter()
            .map(|v| v.as_u64().expect("dim") as usize)
            .collect();
        let shape = [shape[0], shape[1], shape[2], shape[3]];
        let positions: Vec<Vec<i64>> =
            serde_json::from_value(case["positions"].clone()).expect("positions");
        let expected = floats(&case["expected"]);
        let x_values = floats(&case["x"]);
        let max_position = positions.iter().flatten().copied().max().unwrap_or(0) as usize;
        let atol = output_atol(
            max_position,
            x_values.iter().fold(0.0, |m, v| v.abs().max(m)),
        );
        let x = common::tensor::<B>(&x_values, shape, &device);

        if !case["inv_freq"].is_null() {
            let seq_len = positions
                .iter()
                .flatten()
                .max()
                .map_or(0, |p| *p as usize + 1);
            let ours: Vec<f64> = config
                .inv_freq(seq_len)
                .iter()
                .map(|f| f64::from(*f))
                .collect();
            assert_close(
                &format!("{name} inv_freq"),
                &ours,
                &floats(&case["inv_freq"]),
                0.0,
                INV_FREQ_RTOL,
            );
        }

        // A small cache (32 positions) makes the later cases exercise the on-the-fly table path too.
        let rope = Rope::<B>::new(config, 32, &device).expect("valid config");
        let flat: Vec<i64> = positions.iter().flatten().copied().collect();
        let position_tensor =
            Tensor::<B, 2, Int>::from_data(TensorData::new(flat, [shape[0], shape[2]]), &device);
        let at = to_vec(rope.apply_at(x.clone(), position_tensor));
        assert_close(&format!("{name} apply_at"), &at, &expected, atol, 0.0);

        let contiguous = positions
            .iter()
            .all(|row| row.windows(2).all(|w| w[1] == w[0] + 1) && row[0] == positions[0][0]);
        if contiguous {
            let offset = positions[0][0] as usize;
            let applied = to_vec(rope.apply(x, offset));
            assert_close(&format!("{name} apply"), &applied, &expected, atol, 0.0);
        }
    }
}

#[test]
fn rope_positions_past_the_cache_match_cached_ones() {
    let device = Default::default();
    let config = RopeConfig::new(16).with_layout(RopeLayout::Interleaved);
    let small = Rope::<B>::new(config.clone(), 4, &device).expect("config");
    let large = Rope::<B>::new(config, 64, &device).expect("config");
    let x = common::tensor::<B>(
        &(0..2 * 3 * 10 * 16)
            .map(|i| (i as f64 * 0.37).sin())
            .collect::<Vec<_>>(),
        [2, 3, 10, 16],
        &device,
    );
    // Same f32 table arithmetic either way: identical bits.
    assert_eq!(
        to_vec(small.apply(x.clone(), 20)),
        to_vec(large.apply(x, 20))
    );
}

#[test]
fn rope_rejects_invalid_configs_naming_the_key() {
    let device = Default::default();
    let cases = [
        (RopeConfig::new(64).with_rotary_dim(65), "rotary_dim"),
        (RopeConfig::new(64).with_rotary_dim(66), "rotary_dim"),
        (RopeConfig::new(64).with_theta(0.0), "theta"),
        (
            RopeConfig::new(64).with_scaling(RopeScaling::Linear { factor: -1.0 }),
            "rope_scaling.factor",
        ),
        (
            RopeConfig::new(64).with_scaling(RopeScaling::Llama3 {
                factor: 8.0,
                low_freq_factor: 4.0,
                high_freq_factor: 1.0,
                original_max_position_embeddings: 8192,
            }),
            "rope_scaling.high_freq_factor",
        ),
        (
            // 64-wide heads rotate 32 pairs: 31 factors cannot be LongRoPE's.
            RopeConfig::new(64).with_scaling(long_rope(vec![1.0; 32], vec![2.0; 31], 1.2)),
            "rope_scaling.long_factor",
        ),
        (
            RopeConfig::new(64).with_scaling(long_rope(vec![0.0; 32], vec![2.0; 32], 1.2)),
            "rope_scaling.short_factor",
        ),
        (
            RopeConfig::new(64).with_scaling(long_rope(vec![1.0; 32], vec![2.0; 32], f64::NAN)),
            "rope_scaling.attention_factor",
        ),
    ];
    for (config, key) in cases {
        match Rope::<B>::new(config, 8, &device) {
            Err(AttentionError::RopeConfig { key: got, .. }) => assert_eq!(got, key),
            other => panic!("expected a RopeConfig error for {key}, got {other:?}"),
        }
    }
}

fn long_rope(short_factor: Vec<f64>, long_factor: Vec<f64>, attention_factor: f64) -> RopeScaling {
    RopeScaling::LongRope {
        short_factor,
        long_factor,
        original_max_position_embeddings: 4096,
        attention_factor,
    }
}

#[test]
fn partial_rotary_factor_matches_hugging_face_rounding() {
    // HF: int(head_dim * partial_rotary_factor); GPT-NeoX-20B has head_dim 96 and rotary_pct 0.25.
    assert_eq!(
        RopeConfig::new(96)
            .with_partial_rotary_factor(0.25)
            .rotary_dim,
        24
    );
}
