//! The shard file format and its validation against the manifest.

mod common;

use ember_dataset::{
    DatasetError, HEADER_BYTES, Manifest, MappedShard, SHARD_MAGIC, ShardWriter, Split,
    TokenDataset, TokenDtype, stable_hash,
};

#[test]
fn header_layout_matches_the_documented_format() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.bin");
    let mut writer = ShardWriter::create(&path, TokenDtype::U16, 0x0102_0304_0506_0708).unwrap();
    writer.push(&[1, 0x1234, 65_535]).unwrap();
    writer.finish().unwrap();
    let bytes = std::fs::read(&path).unwrap();
    // Oracle: the byte layout written out by hand from the module documentation.
    let mut expected = Vec::new();
    expected.extend_from_slice(b"EMBERTOK");
    expected.extend_from_slice(&1u32.to_le_bytes());
    expected.extend_from_slice(&2u32.to_le_bytes());
    expected.extend_from_slice(&3u64.to_le_bytes());
    expected.extend_from_slice(&0x0102_0304_0506_0708u64.to_le_bytes());
    expected.extend_from_slice(&[0x01, 0x00, 0x34, 0x12, 0xff, 0xff]);
    assert_eq!(bytes, expected);
    assert_eq!(&bytes[..8], &SHARD_MAGIC);
    assert_eq!(HEADER_BYTES, 32);
}

#[test]
fn u32_shard_round_trips_ids_above_u16() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.bin");
    let ids = [0u32, 65_536, 4_000_000_000, 7];
    let mut writer = ShardWriter::create(&path, TokenDtype::U32, 9).unwrap();
    writer.push(&ids).unwrap();
    let header = writer.finish().unwrap();
    assert_eq!(header.tokens, 4);
    let shard = MappedShard::open(&path).unwrap();
    assert_eq!(shard.header(), header);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 32 + 4 * 4);
}

#[test]
fn u16_shard_rejects_an_id_that_does_not_fit() {
    let dir = tempfile::tempdir().unwrap();
    let mut writer = ShardWriter::create(&dir.path().join("s.bin"), TokenDtype::U16, 0).unwrap();
    let err = writer.push(&[65_536]).unwrap_err();
    assert!(err.to_string().contains("65536"), "{err}");
}

#[test]
fn unfinished_writer_leaves_no_file_behind() {
    let dir = tempfile::tempdir().unwrap();
    let mut writer = ShardWriter::create(&dir.path().join("s.bin"), TokenDtype::U16, 0).unwrap();
    writer.push(&[1, 2, 3]).unwrap();
    drop(writer);
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "neither the shard nor its temporary file"
    );
}

#[test]
fn truncated_shard_is_rejected_with_its_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.bin");
    let mut writer = ShardWriter::create(&path, TokenDtype::U16, 0).unwrap();
    writer.push(&[1, 2, 3]).unwrap();
    writer.finish().unwrap();
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() - 1]).unwrap();
    let err = MappedShard::open(&path).unwrap_err();
    assert!(matches!(err, DatasetError::ShardMismatch { .. }), "{err}");
    assert!(
        err.to_string().contains("s.bin") && err.to_string().contains("3 tokens"),
        "{err}"
    );
}

#[test]
fn bad_magic_and_unknown_version_are_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.bin");
    let mut writer = ShardWriter::create(&path, TokenDtype::U16, 0).unwrap();
    writer.push(&[1]).unwrap();
    writer.finish().unwrap();
    let good = std::fs::read(&path).unwrap();

    let mut bad = good.clone();
    bad[0] = b'X';
    std::fs::write(&path, &bad).unwrap();
    assert!(
        MappedShard::open(&path)
            .unwrap_err()
            .to_string()
            .contains("magic")
    );

    let mut bad = good.clone();
    bad[8] = 2;
    std::fs::write(&path, &bad).unwrap();
    assert!(
        MappedShard::open(&path)
            .unwrap_err()
            .to_string()
            .contains("version 2")
    );

    let mut bad = good;
    bad[12] = 3;
    std::fs::write(&path, &bad).unwrap();
    assert!(
        MappedShard::open(&path)
            .unwrap_err()
            .to_string()
            .contains("3 bytes per token")
    );
}

#[test]
fn dataset_rejects_a_shard_whose_header_disagrees_with_the_manifest() {
    let dir = tempfile::tempdir().unwrap();
    let manifest = common::positional_corpus(dir.path(), 1000, 100, 400);
    assert!(TokenDataset::open(dir.path(), Split::Train).is_ok());

    // Token count: the manifest claims one more token than the shard holds.
    let mut edited = manifest.clone();
    edited.shards[0].tokens += 1;
    edited.save(dir.path()).unwrap();
    let err = TokenDataset::open(dir.path(), Split::Train).unwrap_err();
    assert!(
        err.to_string().contains("train-00000.bin") && err.to_string().contains("401"),
        "{err}"
    );

    // Tokenizer: the manifest names another tokenizer than the shards were written with.
    let mut edited = manifest.clone();
    edited.tokenizer.fingerprint = "another".into();
    edited.save(dir.path()).unwrap();
    let err = TokenDataset::open(dir.path(), Split::Train).unwrap_err();
    assert!(
        err.to_string()
            .contains(&format!("{:016x}", stable_hash(b"another"))),
        "{err}"
    );

    // Dtype.
    let mut edited = manifest.clone();
    edited.dtype = TokenDtype::U16;
    edited.save(dir.path()).unwrap();
    assert!(
        TokenDataset::open(dir.path(), Split::Train)
            .unwrap_err()
            .to_string()
            .contains("dtype")
    );
}

#[test]
fn opening_for_another_tokenizer_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    common::positional_corpus(dir.path(), 1000, 100, 400);
    assert!(TokenDataset::open_for_tokenizer(dir.path(), Split::Val, "positions").is_ok());
    let err = TokenDataset::open_for_tokenizer(dir.path(), Split::Val, "tok-0000").unwrap_err();
    assert!(
        err.to_string().contains("manifest.json") && err.to_string().contains("tok-0000"),
        "{err}"
    );
}

#[test]
fn manifest_round_trips_through_json() {
    let dir = tempfile::tempdir().unwrap();
    let manifest = common::positional_corpus(dir.path(), 1000, 100, 400);
    assert_eq!(Manifest::load(dir.path()).unwrap(), manifest);
    let files: Vec<_> = manifest
        .shards
        .iter()
        .map(|s| (s.file.as_str(), s.tokens))
        .collect();
    assert_eq!(
        files,
        [
            ("train-00000.bin", 400),
            ("train-00001.bin", 400),
            ("train-00002.bin", 200),
            ("val-00000.bin", 100)
        ]
    );
}

#[test]
fn reads_across_shard_boundaries() {
    let dir = tempfile::tempdir().unwrap();
    common::positional_corpus(dir.path(), 1000, 100, 400);
    let dataset = TokenDataset::open(dir.path(), Split::Train).unwrap();
    assert_eq!(dataset.len(), 1000);
    let mut out = vec![0u32; 500];
    dataset.read(350, &mut out).unwrap();
    assert_eq!(out, (350..850).collect::<Vec<u32>>());
    assert!(
        dataset.read(600, &mut out).is_err(),
        "600..1100 runs past the end"
    );
}
