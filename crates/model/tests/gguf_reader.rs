//! The GGUF reader against a file written by the `gguf` Python package (llama.cpp's writer) and the values its
//! reference dequantizer produced (scripts/fixtures/gguf_fixtures.py).

use std::path::PathBuf;

use ember_model::gguf::{GgmlType, GgufError, GgufFile, MetadataValue, dequantize};
use serde_json::Value;

fn fixture_dir() -> PathBuf {
    std::path::PathBuf::from(
        std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"),
    )
    .join("tests/fixtures/gguf")
}

fn fixture_bytes() -> Vec<u8> {
    std::fs::read(fixture_dir().join("quants.gguf.bin")).unwrap()
}

fn expected() -> Value {
    serde_json::from_str(&std::fs::read_to_string(fixture_dir().join("quants.json")).unwrap())
        .unwrap()
}

/// Writes `bytes` to a temporary file and opens it.
fn open_bytes(bytes: &[u8]) -> (tempfile::TempDir, Result<GgufFile, GgufError>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.gguf");
    std::fs::write(&path, bytes).unwrap();
    let file = GgufFile::open(&path);
    (dir, file)
}

#[test]
fn every_supported_type_dequantizes_like_the_reference_implementation() {
    let file = GgufFile::open(fixture_dir().join("quants.gguf.bin")).unwrap();
    let expected = expected();
    let tensors = expected["tensors"].as_object().unwrap();
    assert_eq!(
        tensors.len(),
        11,
        "the fixture covers all eleven supported types"
    );
    for (name, want) in tensors {
        let info = file.tensor_info(name).unwrap();
        assert_eq!(
            info.ggml_type.id() as u64,
            want["ggml_type"].as_u64().unwrap(),
            "{name}: type"
        );
        let dims: Vec<u64> = want["dims"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_u64().unwrap())
            .collect();
        assert_eq!(info.dims, dims, "{name}: dims");
        let (shape, values) = file.tensor_f32(name).unwrap();
        assert_eq!(
            shape,
            vec![dims[1] as usize, dims[0] as usize],
            "{name}: shape is outermost first"
        );
        let want: Vec<f32> = want["values"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap() as f32)
            .collect();
        assert_eq!(values.len(), want.len(), "{name}: element count");
        for (i, (got, want)) in values.iter().zip(&want).enumerate() {
            // The dequantizers follow the reference's order of f32 operations, so the only admissible difference
            // is a rounding of the last bit where numpy fuses or reorders a multiply-add: 1e-6 relative.
            let tol = 1e-6 * want.abs().max(1e-3);
            assert!(
                (got - want).abs() <= tol,
                "{name}[{i}]: got {got}, reference {want}"
            );
        }
    }
}

#[test]
fn metadata_of_every_value_type_reads_back_as_written() {
    let file = GgufFile::open(fixture_dir().join("quants.gguf.bin")).unwrap();
    assert_eq!(file.version(), 3);
    let expected = expected();
    assert_eq!(file.alignment(), expected["alignment"].as_u64().unwrap());
    let m = |k: &str| file.get(k).unwrap_or_else(|| panic!("{k} missing"));
    assert_eq!(m("general.architecture").as_str(), Some("llama"));
    assert_eq!(m("test.u8"), &MetadataValue::U8(200));
    assert_eq!(m("test.i8"), &MetadataValue::I8(-100));
    assert_eq!(m("test.u16"), &MetadataValue::U16(60000));
    assert_eq!(m("test.i16"), &MetadataValue::I16(-30000));
    assert_eq!(m("test.u32"), &MetadataValue::U32(4_000_000_000));
    assert_eq!(m("test.i32"), &MetadataValue::I32(-2_000_000_000));
    assert_eq!(m("test.f32"), &MetadataValue::F32(0.25));
    assert_eq!(m("test.u64"), &MetadataValue::U64((1 << 63) + 5));
    assert_eq!(m("test.i64"), &MetadataValue::I64(-(1 << 62)));
    assert_eq!(m("test.f64"), &MetadataValue::F64(std::f64::consts::PI));
    assert_eq!(m("test.bool"), &MetadataValue::Bool(true));
    assert_eq!(
        m("test.string").as_str(),
        expected["metadata"]["test.string"].as_str()
    );
    let ints: Vec<i64> = m("test.array_i32")
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_i64().unwrap())
        .collect();
    assert_eq!(ints, [1, -2, 3]);
    let floats: Vec<f64> = m("test.array_f32")
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    assert_eq!(floats, [0.5, -1.5]);
    let strings: Vec<&str> = m("test.array_str")
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(strings, ["a", "bc", ""]);
    let nested: Vec<usize> = m("test.array_nested")
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_array().unwrap().len())
        .collect();
    assert_eq!(nested, [2, 1]);
}

#[test]
fn tensor_offsets_honour_a_custom_alignment() {
    let file = GgufFile::open(fixture_dir().join("quants.gguf.bin")).unwrap();
    assert_eq!(file.alignment(), 64);
    for t in file.tensors() {
        assert_eq!(t.offset % 64, 0, "{} starts at {}", t.name, t.offset);
    }
}

#[test]
fn version_2_files_read_like_version_3() {
    // v2 and v3 differ only in v3 allowing big-endian files; a little-endian v3 file relabelled v2 is a valid v2.
    let mut bytes = fixture_bytes();
    bytes[4..8].copy_from_slice(&2u32.to_le_bytes());
    let (_dir, file) = open_bytes(&bytes);
    let file = file.unwrap();
    assert_eq!(file.version(), 2);
    let v3 = GgufFile::open(fixture_dir().join("quants.gguf.bin")).unwrap();
    assert_eq!(
        file.tensor_f32("q6_k").unwrap(),
        v3.tensor_f32("q6_k").unwrap()
    );
}

#[test]
fn unknown_version_and_bad_magic_are_errors() {
    let mut bytes = fixture_bytes();
    bytes[4..8].copy_from_slice(&1u32.to_le_bytes());
    let (_dir, file) = open_bytes(&bytes);
    assert!(
        matches!(file, Err(GgufError::UnsupportedVersion { version: 1, .. })),
        "{file:?}"
    );

    let mut bytes = fixture_bytes();
    bytes[0] = b'X';
    let (_dir, file) = open_bytes(&bytes);
    let err = file.unwrap_err();
    assert!(matches!(err, GgufError::BadMagic { .. }), "{err}");
    assert!(
        err.to_string().contains("model.gguf"),
        "error names the file: {err}"
    );
}

#[test]
fn truncation_anywhere_is_an_error_never_a_panic() {
    let bytes = fixture_bytes();
    let file = GgufFile::open(fixture_dir().join("quants.gguf.bin")).unwrap();
    let last = file.tensor_info("q6_k").unwrap();
    // The file ends in alignment padding; the last tensor's data ends before it.
    let data_end = (last.offset + last.n_bytes().unwrap()) as usize;
    // Cut inside the header, inside the metadata, inside the tensor infos and inside the data section.
    for cut in [3, 10, 40, 300, 900, 1100, data_end - 1] {
        let (_dir, file) = open_bytes(&bytes[..cut]);
        match file {
            Err(GgufError::Truncated { .. }) => {}
            other => panic!("cut at {cut}: expected Truncated, got {other:?}"),
        }
    }
    let (_dir, file) = open_bytes(&bytes[..data_end - 1]);
    let err = file.unwrap_err().to_string();
    assert!(
        err.contains("q6_k"),
        "a cut in the data names the last tensor: {err}"
    );
}

#[test]
fn unsupported_tensor_type_error_names_tensor_and_type() {
    let bytes = fixture_bytes();
    let file = GgufFile::open(fixture_dir().join("quants.gguf.bin")).unwrap();
    // Relabel tensor `f32` (ggml type 0) as IQ2_XXS (16, a type ember does not decode) by patching the type field of its tensor info: the u32 just
    // before its u64 offset, found after the name and dims.
    let name = b"f32";
    let pos = bytes
        .windows(name.len() + 4)
        .position(|w| &w[..name.len()] == name && w[name.len()..] == [2, 0, 0, 0])
        .unwrap();
    let type_at = pos + name.len() + 4 + 2 * 8;
    let mut patched = bytes.clone();
    patched[type_at..type_at + 4].copy_from_slice(&16u32.to_le_bytes());
    let (_dir, opened) = open_bytes(&patched);
    let opened = opened.unwrap();
    assert_eq!(
        opened.tensor_info("f32").unwrap().ggml_type,
        GgmlType::Other(16)
    );
    let err = opened.tensor_f32("f32").unwrap_err();
    assert!(matches!(err, GgufError::UnsupportedType { .. }), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("`f32`") && msg.contains("IQ2_XXS") && msg.contains("model.gguf"),
        "{msg}"
    );
    assert!(file.tensor_f32("f32").is_ok(), "the unpatched file reads");
}

#[test]
fn missing_tensor_and_mistyped_metadata_are_named_errors() {
    let file = GgufFile::open(fixture_dir().join("quants.gguf.bin")).unwrap();
    let err = file
        .tensor_f32("blk.0.attn_q.weight")
        .unwrap_err()
        .to_string();
    assert!(err.contains("blk.0.attn_q.weight"), "{err}");
    let err = file.require_u64("test.string").unwrap_err().to_string();
    assert!(
        err.contains("test.string") && err.contains("string"),
        "{err}"
    );
    let err = file
        .require_str("llama.context_length")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("llama.context_length") && err.contains("missing"),
        "{err}"
    );
}

#[test]
fn partial_blocks_are_rejected() {
    assert_eq!(
        dequantize(GgmlType::Q4_0, &[0; 17]),
        None,
        "18 bytes make a Q4_0 block"
    );
    // IQ2_XXS (66-byte blocks): a type ember does not decode.
    assert_eq!(dequantize(GgmlType::from_id(16), &[0; 66]), None);
    assert_eq!(
        dequantize(GgmlType::Q8_0, &[0; 34]).map(|v| v.len()),
        Some(32)
    );
}
