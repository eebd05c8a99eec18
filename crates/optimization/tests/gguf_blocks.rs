//! GGUF Q8_0 / Q4_0 / Q4_1 block import, checked against the `gguf` Python package's reference
//! dequantizer (fixture written by scripts/fixtures/quant_blocks_fixtures.py).

use burn::backend::Flex;
use burn::tensor::{Tensor, TensorData};
use ember_optimization::{QuantError, QuantScheme, QuantizedLinear, QuantizedWeight};
use serde_json::Value;

type Loader = fn(&[u8], [usize; 2]) -> Result<QuantizedWeight, QuantError>;

const CASES: [(&str, Loader, &str); 3] = [
    ("Q8_0", QuantizedWeight::from_gguf_q8_0, "int8-g32"),
    ("Q4_0", QuantizedWeight::from_gguf_q4_0, "int4-g32"),
    ("Q4_1", QuantizedWeight::from_gguf_q4_1, "int4-g32-asym"),
];

fn fixture(kind: &str) -> (Vec<u8>, [usize; 2], Vec<f32>) {
    let text = include_str!("fixtures/gguf_blocks.json");
    let json: Value = serde_json::from_str(text).unwrap();
    let entry = &json[kind];
    let shape = [
        entry["shape"][0].as_u64().unwrap() as usize,
        entry["shape"][1].as_u64().unwrap() as usize,
    ];
    let hex = entry["bytes_hex"].as_str().unwrap();
    let bytes = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect();
    // The JSON holds each f32 as the shortest decimal of its exact value, so the f64 parse
    // narrows back to the same f32.
    let values = entry["values"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap() as f32)
        .collect();
    (bytes, shape, values)
}

/// ggml dequantizes with the same single f32 operations (`q * d`, `(q - 8) * d`, `q * d + m`)
/// that ember's schemes use, and widening f16 to f32 is exact, so values must match bit for bit.
#[test]
fn gguf_blocks_dequantize_exactly_like_the_gguf_reference() {
    for (kind, load, scheme) in CASES {
        let (bytes, shape, expected) = fixture(kind);
        let weight = load(&bytes, shape).unwrap();
        assert_eq!(
            weight.scheme(),
            scheme.parse::<QuantScheme>().unwrap(),
            "{kind}"
        );
        assert_eq!(weight.dequantize(), expected, "{kind}");
        // Codes are copied, not re-quantized: storage is exactly the GGUF payload re-laid out.
        assert_eq!(
            weight.packed_codes().len() * 8 / weight.scheme().bits(),
            shape[0] * shape[1]
        );
    }
}

/// The imported weight runs on the device unchanged: dequantization and a matmul there match the
/// reference.
#[test]
fn gguf_weights_load_into_quantized_linear() {
    let device = Default::default();
    for (kind, load, _) in CASES {
        let (bytes, shape, expected) = fixture(kind);
        let layer =
            QuantizedLinear::<Flex>::new(&load(&bytes, shape).unwrap(), None, &device).unwrap();
        let got = layer
            .dequantize()
            .into_data()
            .convert::<f32>()
            .into_vec::<f32>()
            .unwrap();
        assert_eq!(got, expected, "{kind}");
        // A one-hot input selects column 5 of the weight; every other product is an exact 0, so
        // the matmul returns that column exactly.
        let mut one_hot = vec![0.0f32; shape[1]];
        one_hot[5] = 1.0;
        let x = Tensor::<Flex, 2>::from_data(TensorData::new(one_hot, [1, shape[1]]), &device);
        let column: Vec<f32> = (0..shape[0]).map(|o| expected[o * shape[1] + 5]).collect();
        let y = layer
            .forward(x)
            .into_data()
            .convert::<f32>()
            .into_vec::<f32>()
            .unwrap();
        assert_eq!(y, column, "{kind}");
    }
}

#[test]
fn gguf_blocks_with_wrong_sizes_are_rejected() {
    let (bytes, _, _) = fixture("Q4_0");
    let err = QuantizedWeight::from_gguf_q4_0(&bytes[1..], [3, 64]).unwrap_err();
    assert!(
        err.to_string().contains("expected 108 bytes"),
        "unexpected message: {err}"
    );
    assert!(matches!(
        QuantizedWeight::from_gguf_q8_0(&bytes, [3, 60]),
        Err(QuantError::GgufBlocks { kind: "Q8_0", .. })
    ));
}
