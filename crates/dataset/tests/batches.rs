//! Random training batches, evaluation windows, data-parallel ranks, resumption and prefetching.
//!
//! The corpus is "positional": the train split's id at position `p` is `p` itself, so every batch row reveals
//! where its window starts and whether it is contiguous.

mod common;

use std::sync::Arc;

use ember_dataset::{
    Batch, DatasetError, EvalBatches, Prefetcher, RandomBatches, ReaderState, Split, TokenDataset,
};

const TOKENS: u64 = 10_000;

fn dataset(dir: &std::path::Path) -> Arc<TokenDataset> {
    // Shards of 3,000 tokens so that windows regularly straddle a shard boundary.
    common::positional_corpus(dir, TOKENS, 500, 3_000);
    Arc::new(TokenDataset::open(dir, Split::Train).unwrap())
}

/// Start position of every row, checking each row is a contiguous window with targets shifted by one.
fn row_starts(batch: &Batch) -> Vec<u64> {
    assert_eq!(batch.inputs.len(), batch.batch_size * batch.block_size);
    assert_eq!(batch.targets.len(), batch.inputs.len());
    (0..batch.batch_size)
        .map(|r| {
            let row = &batch.inputs[r * batch.block_size..(r + 1) * batch.block_size];
            let targets = &batch.targets[r * batch.block_size..(r + 1) * batch.block_size];
            for i in 0..batch.block_size {
                assert_eq!(row[i], row[0] + i as u32, "row {r} is contiguous");
                assert_eq!(targets[i], row[i] + 1, "row {r}: target is the next token");
            }
            u64::from(row[0])
        })
        .collect()
}

#[test]
fn random_batches_are_contiguous_windows_covering_the_split() {
    let dir = tempfile::tempdir().unwrap();
    let mut reader = RandomBatches::new(dataset(dir.path()), ReaderState::new(7, 8, 64)).unwrap();
    // Windows of 65 tokens fit at 10,000 - 64 start positions.
    assert_eq!(reader.windows(), TOKENS - 64);
    let mut starts = Vec::new();
    for _ in 0..200 {
        starts.extend(row_starts(&reader.next_batch().unwrap()));
    }
    assert!(starts.iter().all(|&s| s + 65 <= TOKENS));
    // 1,600 uniform draws over ~9,936 positions: the mean start is 4,968 with a standard error of ~72; the bounds
    // are > 5 standard errors away, and the extremes must reach both ends of the split.
    let mean = starts.iter().sum::<u64>() as f64 / starts.len() as f64;
    assert!((4_600.0..5_300.0).contains(&mean), "mean start {mean}");
    assert!(*starts.iter().min().unwrap() < 200 && *starts.iter().max().unwrap() > TOKENS - 300);
}

#[test]
fn same_seed_gives_the_same_batches_and_another_seed_does_not() {
    let dir = tempfile::tempdir().unwrap();
    let data = dataset(dir.path());
    let draw = |seed| {
        let mut r = RandomBatches::new(data.clone(), ReaderState::new(seed, 4, 16)).unwrap();
        (0..10).map(|_| r.next_batch().unwrap()).collect::<Vec<_>>()
    };
    assert_eq!(draw(1), draw(1));
    assert_ne!(draw(1), draw(2));
}

#[test]
fn resumed_reader_continues_with_exactly_the_next_batches() {
    let dir = tempfile::tempdir().unwrap();
    let data = dataset(dir.path());
    let mut original = RandomBatches::new(data.clone(), ReaderState::new(3, 4, 32)).unwrap();
    for _ in 0..5 {
        original.next_batch().unwrap();
    }
    let saved = serde_json::to_string(&original.state()).unwrap();
    let expected: Vec<Batch> = (0..5).map(|_| original.next_batch().unwrap()).collect();
    let state: ReaderState = serde_json::from_str(&saved).unwrap();
    assert_eq!(state.next_batch, 5);
    let mut resumed = RandomBatches::new(data, state).unwrap();
    let got: Vec<Batch> = (0..5).map(|_| resumed.next_batch().unwrap()).collect();
    assert_eq!(got, expected);
}

#[test]
fn ranks_read_disjoint_parts_of_the_split() {
    let dir = tempfile::tempdir().unwrap();
    let data = dataset(dir.path());
    let block = 32u64;
    let mut spans = Vec::new();
    for rank in 0..3 {
        let state = ReaderState::new(11, 16, block as usize).with_rank(rank, 3);
        let mut reader = RandomBatches::new(data.clone(), state).unwrap();
        let starts: Vec<u64> = (0..50)
            .flat_map(|_| row_starts(&reader.next_batch().unwrap()))
            .collect();
        let lo = *starts.iter().min().unwrap();
        let hi = starts.iter().max().unwrap() + block + 1;
        spans.push((lo, hi));
    }
    // The token ranges touched by each rank (first window start to last window end) must not overlap; the rank
    // boundaries are at 10,000 * k / 3.
    spans.sort();
    for pair in spans.windows(2) {
        assert!(pair[0].1 <= pair[1].0, "{spans:?}");
    }
    assert!(
        spans[0].1 <= 3_333 && spans[1].0 >= 3_333 && spans[1].1 <= 6_666 && spans[2].0 >= 6_666
    );
}

#[test]
fn eval_batches_walk_the_split_once_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let data = dataset(dir.path());
    let block = 100;
    let batches: Vec<Batch> = EvalBatches::new(data, 16, block, 0, 1)
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let starts: Vec<u64> = batches.iter().flat_map(row_starts).collect();
    // Windows of 101 tokens stepping by 100: starts 0, 100, ..., 9,800 (9,900 + 101 > 10,000): 99 windows, in 6
    // full batches of 16 and a last one of 3.
    assert_eq!(starts, (0..99).map(|i| i * 100).collect::<Vec<u64>>());
    assert_eq!(
        batches.iter().map(|b| b.batch_size).collect::<Vec<_>>(),
        [16, 16, 16, 16, 16, 16, 3]
    );
}

#[test]
fn eval_batches_of_a_rank_stay_in_its_part() {
    let dir = tempfile::tempdir().unwrap();
    let data = dataset(dir.path());
    let starts: Vec<u64> = EvalBatches::new(data, 8, 50, 1, 2)
        .unwrap()
        .flat_map(|b| row_starts(&b.unwrap()))
        .collect();
    assert_eq!(starts.first(), Some(&5_000));
    assert_eq!(starts.last().map(|s| s + 51), Some(9_951));
}

#[test]
fn prefetcher_hands_out_the_readers_batches_and_its_consumer_position() {
    let dir = tempfile::tempdir().unwrap();
    let data = dataset(dir.path());
    let state = ReaderState::new(5, 4, 16);
    let mut direct = RandomBatches::new(data.clone(), state).unwrap();
    let expected: Vec<Batch> = (0..20).map(|_| direct.next_batch().unwrap()).collect();
    let mut prefetcher = Prefetcher::spawn(RandomBatches::new(data.clone(), state).unwrap(), 4);
    let first: Vec<Batch> = (0..12).map(|_| prefetcher.next_batch().unwrap()).collect();
    // The thread is up to 4 batches ahead, but the saved position is what the consumer has taken.
    assert_eq!(prefetcher.state().next_batch, 12);
    drop(prefetcher);
    let mut resumed = Prefetcher::spawn(
        RandomBatches::new(
            data,
            ReaderState {
                next_batch: 12,
                ..state
            },
        )
        .unwrap(),
        2,
    );
    let rest: Vec<Batch> = (0..8).map(|_| resumed.next_batch().unwrap()).collect();
    assert_eq!([first, rest].concat(), expected);
}

#[test]
fn too_short_split_and_bad_state_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let data = dataset(dir.path());
    let err = RandomBatches::new(data.clone(), ReaderState::new(0, 1, 10_000)).unwrap_err();
    assert!(
        matches!(
            err,
            DatasetError::SplitTooShort {
                tokens: 10_000,
                needed: 10_001,
                ..
            }
        ),
        "{err}"
    );
    let err =
        RandomBatches::new(data.clone(), ReaderState::new(0, 1, 8).with_rank(2, 2)).unwrap_err();
    assert!(matches!(err, DatasetError::StateMismatch(_)), "{err}");
    assert!(RandomBatches::new(data, ReaderState::new(0, 0, 8)).is_err());
}
