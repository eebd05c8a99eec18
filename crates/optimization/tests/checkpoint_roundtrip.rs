//! Safetensors checkpoints of quantized weights: round trip, on-disk layout and metadata, and
//! named errors for inconsistent files.

mod common;

use std::collections::HashMap;

use ember_optimization::quant::checkpoint::{FORMAT, METADATA_KEY};
use ember_optimization::{
    DenseTensor, QuantError, QuantScheme, QuantizedCheckpoint, QuantizedWeight,
};
use safetensors::SafeTensors;
use safetensors::tensor::{Dtype, TensorView, serialize_to_file};

fn checkpoint() -> QuantizedCheckpoint {
    let mut checkpoint = QuantizedCheckpoint::default();
    for (i, (name, scheme, shape)) in [
        ("layers.0.q_proj", "int8", [48, 72]),
        ("layers.0.up_proj", "int4-g32", [40, 96]),
        ("lm_head", "int4-g64-asym", [30, 200]),
    ]
    .into_iter()
    .enumerate()
    {
        let scheme: QuantScheme = scheme.parse().unwrap();
        let w = common::weights(shape[0] * shape[1], i as u64);
        let weight = QuantizedWeight::quantize(&w, shape, scheme).unwrap();
        checkpoint.quantized.insert(name.to_string(), weight);
    }
    checkpoint.dense.insert(
        "norm.weight".to_string(),
        DenseTensor {
            shape: vec![72],
            values: common::activations(72, 7),
        },
    );
    checkpoint
}

#[test]
fn checkpoint_round_trips_codes_scales_mins_and_dense_tensors() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    let original = checkpoint();
    original.save(&path).unwrap();
    let loaded = QuantizedCheckpoint::load(&path).unwrap();
    assert_eq!(loaded, original);

    // The file is plain safetensors: packed U8 codes, F32 scales/mins, and the scheme metadata.
    let bytes = std::fs::read(&path).unwrap();
    let file = SafeTensors::deserialize(&bytes).unwrap();
    let codes = file.tensor("layers.0.up_proj.qcodes").unwrap();
    assert_eq!((codes.dtype(), codes.shape()), (Dtype::U8, &[40, 48][..]));
    assert_eq!(file.tensor("lm_head.mins").unwrap().shape(), &[30, 4]);
    assert!(file.tensor("layers.0.up_proj.mins").is_err());
    let (_, header) = SafeTensors::read_metadata(&bytes).unwrap();
    let metadata = header.metadata().as_ref().unwrap();
    assert_eq!(metadata["format"], FORMAT);
    let schemes: serde_json::Value = serde_json::from_str(&metadata[METADATA_KEY]).unwrap();
    assert_eq!(schemes["lm_head"]["scheme"], "int4-g64-asym");
    assert_eq!(schemes["lm_head"]["shape"], serde_json::json!([30, 200]));
    // Payload: 1 or 1/2 byte per weight plus f32 parameters, well under the f32 size.
    let f32_bytes = 4 * (48 * 72 + 40 * 96 + 30 * 200 + 72);
    assert!(original.payload_bytes() * 3 < f32_bytes);
}

#[test]
fn loading_reports_the_missing_or_mistyped_tensor_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("broken.safetensors");
    let scales = vec![0u8; 4 * 2];
    let codes = vec![0u8; 2 * 16];
    let metadata = HashMap::from([(
        METADATA_KEY.to_string(),
        r#"{"w": {"scheme": "int4-g32-asym", "shape": [2, 32]}}"#.to_string(),
    )]);
    let tensors = [
        (
            "w.qcodes",
            TensorView::new(Dtype::U8, vec![2, 16], &codes).unwrap(),
        ),
        (
            "w.scales",
            TensorView::new(Dtype::F32, vec![2, 1], &scales).unwrap(),
        ),
    ];
    serialize_to_file(tensors, &Some(metadata), &path).unwrap();
    let err = QuantizedCheckpoint::load(&path).unwrap_err();
    assert!(matches!(err, QuantError::Checkpoint { .. }));
    assert!(err.to_string().contains("w.mins"), "{err}");

    let half = vec![0u8; 2 * 4];
    let tensors = [("norm", TensorView::new(Dtype::F16, vec![4], &half).unwrap())];
    serialize_to_file(tensors, &None, &path).unwrap();
    let err = QuantizedCheckpoint::load(&path).unwrap_err();
    assert!(
        err.to_string().contains("`norm`") && err.to_string().contains("F16"),
        "{err}"
    );

    let missing = dir.path().join("absent.safetensors");
    assert!(matches!(
        QuantizedCheckpoint::load(&missing),
        Err(QuantError::Io { .. })
    ));
}
