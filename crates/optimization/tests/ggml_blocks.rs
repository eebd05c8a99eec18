//! ggml block dequantization of every type ember keeps packed, bit for bit against the `gguf` Python package's
//! reference (fixtures written by scripts/fixtures/ggml_quant_fixtures.py), and the checks that refuse block
//! bytes that are not the matrix they claim to be.

use ember_ggml::{GgmlType, dequantize};
use ember_optimization::{GgmlWeight, QuantError};

/// The fixtures' shape: three rows of one K-quant super-block (eight 32-element blocks).
const SHAPE: [usize; 2] = [3, 256];

fn fixture(ty: GgmlType) -> (Vec<u8>, Vec<f32>) {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/ggml");
    let blocks = std::fs::read(format!("{dir}/{ty}.bin")).unwrap();
    let values = std::fs::read(format!("{dir}/{ty}.f32"))
        .unwrap()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    (blocks, values)
}

#[test]
fn every_packed_type_dequantizes_bit_for_bit_like_ggml() {
    for ty in GgmlType::BLOCK_QUANTIZED {
        let (blocks, expected) = fixture(ty);
        let weight = GgmlWeight::new(ty, SHAPE, blocks.clone()).unwrap();
        let values = weight.dequantize();
        // Exact: the dequantizers apply ggml's f32 operations in its order, so any difference is a bug (a wrong
        // bit, nibble or scale index), never rounding.
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&values), bits(&expected), "{ty}");
        assert_eq!(
            dequantize(ty, &blocks).as_deref(),
            Some(&expected[..]),
            "{ty}"
        );
        // Rows dequantized on their own are the same rows.
        assert_eq!(
            weight.dequantize_rows(1, 2),
            expected[256..],
            "{ty} rows 1..3"
        );
        assert_eq!(weight.storage_bytes(), blocks.len(), "{ty}");
    }
}

#[test]
fn ggml_ids_and_names_match_the_gguf_numbering() {
    // gguf.GGMLQuantizationType's numbers.
    let ids = [
        (GgmlType::Q4_0, 2, "Q4_0"),
        (GgmlType::Q4_1, 3, "Q4_1"),
        (GgmlType::Q5_0, 6, "Q5_0"),
        (GgmlType::Q5_1, 7, "Q5_1"),
        (GgmlType::Q8_0, 8, "Q8_0"),
        (GgmlType::Q2_K, 10, "Q2_K"),
        (GgmlType::Q3_K, 11, "Q3_K"),
        (GgmlType::Q4_K, 12, "Q4_K"),
        (GgmlType::Q5_K, 13, "Q5_K"),
        (GgmlType::Q6_K, 14, "Q6_K"),
        (GgmlType::IQ4_NL, 20, "IQ4_NL"),
        (GgmlType::IQ4_XS, 23, "IQ4_XS"),
    ];
    for (ty, id, name) in ids {
        assert_eq!(GgmlType::from_id(id), ty);
        assert_eq!(ty.id(), id);
        assert_eq!(ty.to_string(), name);
        assert!(ty.is_block_quantized(), "{ty}");
    }
    assert!(!GgmlType::F16.is_block_quantized());
    assert_eq!(GgmlType::from_id(16).to_string(), "#16 (IQ2_XXS)");
}

fn reason(result: Result<GgmlWeight, QuantError>) -> String {
    match result {
        Err(QuantError::GgmlBlocks { reason }) => reason,
        other => panic!("expected a GgmlBlocks error, got {other:?}"),
    }
}

#[test]
fn block_bytes_that_do_not_fit_the_shape_are_refused_with_the_type_and_sizes() {
    let (blocks, _) = fixture(GgmlType::Q4_K);
    let short = reason(GgmlWeight::new(
        GgmlType::Q4_K,
        SHAPE,
        blocks[..blocks.len() - 1].to_vec(),
    ));
    assert!(
        short.contains("Q4_K") && short.contains("432 bytes") && short.contains("got 431"),
        "{short}"
    );
    // 128 columns are half a Q4_K super-block.
    let ragged = reason(GgmlWeight::new(GgmlType::Q4_K, [6, 128], blocks.clone()));
    assert!(
        ragged.contains("multiple of the Q4_K block length 256"),
        "{ragged}"
    );
    let dense = reason(GgmlWeight::new(GgmlType::F16, [3, 72], blocks.clone()));
    assert!(
        dense.contains("F16 is not a block-quantized type"),
        "{dense}"
    );
    let empty = reason(GgmlWeight::new(GgmlType::Q8_0, [0, 32], Vec::new()));
    assert!(empty.contains("positive multiple"), "{empty}");
    // A shape whose byte count overflows is refused before anything is allocated by it.
    let huge = reason(GgmlWeight::new(GgmlType::Q8_0, [usize::MAX, 64], blocks));
    assert!(huge.contains("overflow"), "{huge}");
}
