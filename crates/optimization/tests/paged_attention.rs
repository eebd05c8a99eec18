//! The paged pool on the reference CPU backend: attention over K/V gathered through block tables
//! must equal attention over a contiguous cache, with and without shared prefixes.

use burn::backend::Flex;
use burn::tensor::{Distribution, Tensor};
use ember_attention::{
    Appended, AttentionKernel, AttentionOptions, ContiguousKvCache, KvCache, attention,
};
use ember_optimization::{PagedKvConfig, PagedKvPool, PoolError};

type B = Flex;

const LAYERS: usize = 2;
const KV_HEADS: usize = 2;
const Q_HEADS: usize = 4;
const HEAD_DIM: usize = 8;
const BLOCK: usize = 4;

fn config(blocks: usize) -> PagedKvConfig {
    let base = PagedKvConfig::new(LAYERS, KV_HEADS, HEAD_DIM).with_block_size(BLOCK);
    base.with_budget_bytes(blocks * base.block_bytes(4))
}

fn random(dims: [usize; 4]) -> Tensor<B, 4> {
    Tensor::random(dims, Distribution::Normal(0.0, 1.0), &Default::default())
}

fn values(t: Tensor<B, 4>) -> Vec<f32> {
    t.into_data().convert::<f32>().into_vec().unwrap()
}

/// One decoding run (prefill then single-token steps) through any cache; returns every layer's
/// attention output of every step.
fn run(
    cache: &mut impl KvCache<B>,
    steps: &[(Tensor<B, 4>, Tensor<B, 4>, Tensor<B, 4>)],
) -> Vec<Vec<f32>> {
    let mut outputs = Vec::new();
    for (q, k, v) in steps {
        for layer in 0..LAYERS {
            let offset = cache.len();
            let (keys, vals) = cache.append(layer, k.clone(), v.clone()).unwrap();
            let options = AttentionOptions::causal().with_offset(offset);
            let out = attention(
                AttentionKernel::Manual,
                q.clone(),
                keys.clone(),
                vals,
                &options,
            );
            outputs.push(values(keys));
            outputs.push(values(out));
        }
    }
    outputs
}

fn steps(batch: usize, lens: &[usize]) -> Vec<(Tensor<B, 4>, Tensor<B, 4>, Tensor<B, 4>)> {
    lens.iter()
        .map(|&n| {
            (
                random([batch, Q_HEADS, n, HEAD_DIM]),
                random([batch, KV_HEADS, n, HEAD_DIM]),
                random([batch, KV_HEADS, n, HEAD_DIM]),
            )
        })
        .collect()
}

/// Gathering is a pure copy of the written values and both caches feed the same kernel, so the
/// keys and attention outputs must be bit-identical (no tolerance needed).
#[test]
fn paged_attention_equals_contiguous_attention() {
    let batch = 3;
    // Prefill 7 (ends mid-block), then decode steps crossing block boundaries.
    let steps = steps(batch, &[7, 1, 1, 2, 1, 5, 1]);
    let mut contiguous = ContiguousKvCache::<B>::new(LAYERS);
    let expected = run(&mut contiguous, &steps);

    let mut pool = PagedKvPool::<B>::new(config(64), &Default::default()).unwrap();
    let got = run(&mut pool.cache(Vec::new()).unwrap(), &steps);
    assert_eq!(got, expected);

    // 18 positions per sequence need ceil(18 / 4) = 5 blocks each, and no more.
    let stats = pool.stats();
    assert_eq!(stats.used_blocks, batch * 5);
    assert_eq!(stats.logical_tokens, batch * 18);
    assert_eq!(stats.physical_tokens, batch * 18);
    assert!((stats.fragmentation() - 2.0 / 20.0).abs() < 1e-12);
}

/// Forks of a prompt share its blocks; each continuation copies only the partially filled tail
/// block on its first write and then reads prompt + its own tokens, exactly like a contiguous
/// cache fed the same tokens.
#[test]
fn forked_sequences_share_the_prefix_and_copy_on_write() {
    let device = Default::default();
    let mut pool = PagedKvPool::<B>::new(config(32), &device).unwrap();
    let prompt = steps(1, &[10]);
    let parent = pool.add_sequence();
    run(&mut pool.cache(vec![parent]).unwrap(), &prompt);
    let forks = [
        parent,
        pool.fork(parent).unwrap(),
        pool.fork(parent).unwrap(),
    ];
    let stats = pool.stats();
    assert_eq!((stats.used_blocks, stats.shared_blocks), (3, 3));
    assert_eq!(stats.logical_tokens, 30);
    assert_eq!(stats.physical_tokens, 10);

    let mut final_keys = Vec::new();
    for (i, &seq) in forks.iter().enumerate() {
        let continuation = steps(1, &[1, 1, 3 + i]);
        let mut contiguous = ContiguousKvCache::<B>::new(LAYERS);
        run(&mut contiguous, &prompt);
        let expected = run(&mut contiguous, &continuation);
        let got = run(&mut pool.cache(vec![seq]).unwrap(), &continuation);
        assert_eq!(got, expected, "fork {i}");
        // `run` records [keys, output] per layer; the last step's keys are the whole sequence.
        final_keys.push(expected[expected.len() - 2 * LAYERS..].to_vec());
    }
    // Later forks' writes must not have leaked into earlier forks' blocks.
    for (i, &seq) in forks.iter().enumerate() {
        for layer in 0..LAYERS {
            let keys = values(pool.gather(&[seq], layer).unwrap().keys);
            assert_eq!(keys, final_keys[i][2 * layer], "fork {i} layer {layer}");
        }
    }
    // The two full prompt blocks are still shared by all three; each fork owns its own tail.
    let stats = pool.stats();
    assert_eq!(stats.shared_blocks, 2);
    for &seq in &forks {
        assert_eq!(
            &pool.blocks().block_table(seq).unwrap()[..2],
            &pool.blocks().block_table(parent).unwrap()[..2]
        );
    }
    // Two shared full blocks (8 positions) plus each fork's private tail: its copy of prompt
    // positions 8..10 and its 5 + i new ones.
    assert_eq!(stats.physical_tokens, 8 + (7 + 8 + 9));
}

/// The budget is hard: a write needing more blocks than are free fails with a clear error and
/// changes nothing; after a sequence finishes its blocks serve the next one.
#[test]
fn exhausted_budget_is_reported_and_freed_blocks_are_reused() {
    let device = Default::default();
    let mut pool = PagedKvPool::<B>::new(config(3), &device).unwrap();
    let a = pool.add_sequence();
    let b = pool.add_sequence();
    let chunk = |n| Tensor::<B, 3>::random([KV_HEADS, n, HEAD_DIM], Distribution::Default, &device);
    pool.append(a, 0, chunk(8), chunk(8)).unwrap();
    let err = pool.append(b, 0, chunk(5), chunk(5)).unwrap_err();
    assert_eq!(
        err,
        PoolError::OutOfBlocks {
            seq: b.0,
            needed: 2,
            free: 1,
            total: 3,
            block_size: BLOCK,
        }
    );
    assert!(err.to_string().contains("exhausted"), "{err}");
    assert_eq!(pool.seq_len(b).unwrap(), 0);
    assert_eq!(pool.stats().used_blocks, 2);

    pool.free_sequence(a).unwrap();
    pool.append(b, 0, chunk(5), chunk(5)).unwrap();
    assert_eq!(pool.stats().used_blocks, 2);
    assert_eq!(pool.stats().peak_used_blocks, 2);

    let tiny = config(1).with_budget_bytes(config(1).block_bytes(4) - 1);
    assert!(matches!(
        PagedKvPool::<B>::new(tiny, &device),
        Err(PoolError::BudgetTooSmall { .. })
    ));
}

/// Sequences of different lengths gather left-padded with a padding mask; attention with that
/// mask equals attention over each sequence alone (padding keys get exactly zero weight, so the
/// only difference is summation order: 1e-6 covers f32 rounding of softmax sums of <= 9 terms).
#[test]
fn ragged_gather_with_padding_mask_matches_per_sequence_attention() {
    let device = Default::default();
    let mut pool = PagedKvPool::<B>::new(config(16), &device).unwrap();
    let lens = [3, 9, 6];
    let mut per_seq = Vec::new();
    let mut seqs = Vec::new();
    for &len in &lens {
        let seq = pool.add_sequence();
        let k = Tensor::<B, 3>::random([KV_HEADS, len, HEAD_DIM], Distribution::Default, &device);
        let v = Tensor::<B, 3>::random([KV_HEADS, len, HEAD_DIM], Distribution::Default, &device);
        pool.append(seq, 1, k.clone(), v.clone()).unwrap();
        per_seq.push((k.unsqueeze_dim::<4>(0), v.unsqueeze_dim::<4>(0)));
        seqs.push(seq);
    }
    let gathered = pool.gather(&seqs, 1).unwrap();
    let padding = gathered.padding.clone().unwrap();
    assert_eq!(gathered.keys.dims(), [3, KV_HEADS, 9, HEAD_DIM]);
    let q = random([3, Q_HEADS, 1, HEAD_DIM]);
    let options = AttentionOptions::full().with_key_padding(padding.clone());
    let batched = attention(
        AttentionKernel::Manual,
        q.clone(),
        gathered.keys,
        gathered.values,
        &options,
    );
    let mask: Vec<bool> = padding.into_data().into_vec().unwrap();
    for (i, ((k, v), &len)) in per_seq.into_iter().zip(&lens).enumerate() {
        assert_eq!(
            mask[i * 9..(i + 1) * 9].iter().filter(|&&m| m).count(),
            9 - len
        );
        let q_i = q.clone().narrow(0, i, 1);
        let alone = attention(
            AttentionKernel::Manual,
            q_i,
            k,
            v,
            &AttentionOptions::full(),
        );
        let row = batched.clone().narrow(0, i, 1);
        for (a, b) in values(row).iter().zip(values(alone)) {
            assert!((a - b).abs() <= 1e-6, "sequence {i}: {a} vs {b}");
        }
    }
}

/// A pool that starts at one block grows by doubling as sequences need blocks, keeps every stored position
/// bit-exact across the growth, and still stops at the budget.
#[test]
fn storage_grows_on_demand_up_to_the_budget() {
    let device = Default::default();
    let mut pool = PagedKvPool::<B>::new(config(6).with_initial_blocks(1), &device).unwrap();
    let block_bytes = pool.block_bytes();
    assert_eq!(pool.allocated_bytes(), block_bytes);
    let chunk = |n| Tensor::<B, 3>::random([KV_HEADS, n, HEAD_DIM], Distribution::Default, &device);
    let a = pool.add_sequence();
    let (k1, v1) = (chunk(3), chunk(3));
    pool.append(a, 0, k1.clone(), v1.clone()).unwrap();
    assert_eq!(
        pool.stats().total_blocks,
        1,
        "3 positions fit the first block"
    );
    // 6 more positions need 2 more blocks: 1 -> max(1 + 2, 2 x 1) = 3 blocks.
    let (k2, v2) = (chunk(6), chunk(6));
    pool.append(a, 0, k2.clone(), v2.clone()).unwrap();
    assert_eq!(pool.stats().total_blocks, 3);
    assert_eq!(pool.allocated_bytes(), 3 * block_bytes);
    let gathered = pool.gather(&[a], 0).unwrap();
    let want = |first: Tensor<B, 3>, second: Tensor<B, 3>| {
        values(Tensor::cat(vec![first, second], 1).unsqueeze_dim::<4>(0))
    };
    assert_eq!(
        values(gathered.keys),
        want(k1, k2),
        "keys survive the growth"
    );
    assert_eq!(
        values(gathered.values),
        want(v1, v2),
        "values survive the growth"
    );
    // Growth stops at the 6-block budget: 3 -> 6, then the pool is exhausted.
    let b = pool.add_sequence();
    pool.append(b, 0, chunk(12), chunk(12)).unwrap();
    assert_eq!(pool.stats().total_blocks, 6);
    let err = pool.append(b, 0, chunk(4), chunk(4)).unwrap_err();
    assert!(
        matches!(err, PoolError::OutOfBlocks { total: 6, .. }),
        "{err:?}"
    );
}

/// A batch view over sequences of different lengths, fed a left-padded prefill and then decode steps: the
/// padding positions are never stored, and every row's keys come back right-aligned on the common axis.
#[test]
fn a_ragged_view_drops_leading_padding_and_right_aligns_rows() {
    let device = Default::default();
    let mut pool = PagedKvPool::<B>::new(config(16), &device).unwrap();
    let seqs = vec![pool.add_sequence(), pool.add_sequence()];
    // Row 0 has 5 real tokens, row 1 has 2 (3 leading padding positions).
    let (k, v) = (
        random([2, KV_HEADS, 5, HEAD_DIM]),
        random([2, KV_HEADS, 5, HEAD_DIM]),
    );
    {
        let mut view = pool
            .cache(seqs.clone())
            .unwrap()
            .with_leading_padding(vec![0, 3]);
        for layer in 0..LAYERS {
            let (keys, _) = view.append(layer, k.clone(), v.clone()).unwrap();
            assert_eq!(keys.dims(), [2, KV_HEADS, 5, HEAD_DIM]);
        }
        assert_eq!(view.len(), 5, "the longest row");
    }
    assert_eq!(pool.seq_len(seqs[0]).unwrap(), 5);
    assert_eq!(pool.seq_len(seqs[1]).unwrap(), 2);
    // A decode step: row 1's 2 stored keys plus its new one sit at the last 3 of 6 positions.
    let (k_new, v_new) = (
        random([2, KV_HEADS, 1, HEAD_DIM]),
        random([2, KV_HEADS, 1, HEAD_DIM]),
    );
    let mut view = pool.cache(seqs.clone()).unwrap();
    let (keys, _) = view.append(0, k_new.clone(), v_new).unwrap();
    assert_eq!(keys.dims(), [2, KV_HEADS, 6, HEAD_DIM]);
    let row1 = keys.narrow(0, 1, 1).narrow(2, 3, 3);
    let want = Tensor::cat(
        vec![k.narrow(0, 1, 1).narrow(2, 3, 2), k_new.narrow(0, 1, 1)],
        2,
    );
    assert_eq!(values(row1), values(want));
}

/// Attention reading the pool's blocks in place (`PagedKvPool::attend`, burn-flex's kernel) equals the flash
/// kernel over the gathered, left-padded copy bit for bit: both take the same products and sums in the same
/// order (crates/attention/src/cpu/paged.rs), and padding never enters either. Rows of different lengths whose
/// blocks interleave (and one forked from another), grouped query heads, 1-3 queries per row, with and without
/// a sliding window; head and value widths that leave a tail after the eight-lane chunks. Against a float64
/// reference: 1e-5, f32 rounding of dot products of at most 64 terms and softmax sums of at most 25 terms of
/// size <= 1.
#[test]
fn in_place_attention_equals_flash_over_the_gathered_copy() {
    // Widths with a tail past the chunks of eight, and a 64-wide head with a value past 64 columns.
    in_place_equals_flash(20, 12);
    in_place_equals_flash(64, 72);
}

fn in_place_equals_flash(head: usize, value: usize) {
    let device = Default::default();
    let config = PagedKvConfig::new(LAYERS, KV_HEADS, head)
        .with_v_dim(value)
        .with_block_size(BLOCK)
        .with_budget_bytes(64 << 20);
    let mut pool = PagedKvPool::<B>::new(config, &device).unwrap();
    let chunk = |n: usize| {
        (
            Tensor::<B, 3>::random([KV_HEADS, n, head], Distribution::Normal(0.0, 1.0), &device),
            Tensor::<B, 3>::random(
                [KV_HEADS, n, value],
                Distribution::Normal(0.0, 1.0),
                &device,
            ),
        )
    };
    let mut seqs = vec![
        pool.add_sequence(),
        pool.add_sequence(),
        pool.add_sequence(),
    ];
    // Interleaved appends, so each sequence's blocks are scattered through the storage.
    for round in [[5, 1, 7], [3, 2, 6], [4, 2, 8]] {
        for (&seq, n) in seqs.iter().zip(round) {
            let (k, v) = chunk(n);
            pool.append(seq, 1, k, v).unwrap();
        }
    }
    let fork = pool.fork(seqs[0]).unwrap();
    pool.truncate(fork, 10).unwrap();
    let (k, v) = chunk(3);
    pool.append(fork, 1, k, v).unwrap();
    seqs.push(fork);
    for (q_len, window) in [(1, None), (1, Some(5)), (2, None), (3, Some(4))] {
        for &seq in &seqs {
            let (k, v) = chunk(q_len);
            pool.append(seq, 1, k, v).unwrap();
        }
        let lens: Vec<usize> = seqs.iter().map(|&s| pool.seq_len(s).unwrap()).collect();
        let width = *lens.iter().max().unwrap();
        let gathered = pool.gather(&seqs, 1).unwrap();
        let q = random([seqs.len(), Q_HEADS, q_len, head]);
        let mut options = AttentionOptions::causal()
            .with_offset(width - q_len)
            .with_window_opt(window);
        if let Some(padding) = gathered.padding.clone() {
            options = options.with_key_padding(padding);
        }
        let in_place = pool
            .attend(&seqs, 1, &q, &options)
            .unwrap()
            .expect("burn-flex attends in place");
        assert_eq!(in_place.dims(), [seqs.len(), Q_HEADS, q_len, value]);
        let flash = attention(
            AttentionKernel::Flash,
            q.clone(),
            gathered.keys.clone(),
            gathered.values.clone(),
            &options,
        );
        let got = values(in_place);
        assert_eq!(got, values(flash), "q_len {q_len}, window {window:?}");

        let (q, keys, vals) = (values(q), values(gathered.keys), values(gathered.values));
        let group = Q_HEADS / KV_HEADS;
        for (b, &len) in lens.iter().enumerate() {
            for h in 0..Q_HEADS {
                let kv = b * KV_HEADS + h / group;
                for i in 0..q_len {
                    // Own position of the query, and the first axis position of the row's keys.
                    let (pos, lead) = (len - q_len + i, width - len);
                    let lo = window.map_or(0, |w| (pos + 1).saturating_sub(w));
                    let query = &q[((b * Q_HEADS + h) * q_len + i) * head..][..head];
                    let scores: Vec<f64> = (lo..=pos)
                        .map(|p| {
                            let key = &keys[(kv * width + lead + p) * head..][..head];
                            let dot: f64 = query
                                .iter()
                                .zip(key)
                                .map(|(&a, &b)| f64::from(a) * f64::from(b))
                                .sum();
                            dot / (head as f64).sqrt()
                        })
                        .collect();
                    let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                    let sum: f64 = weights.iter().sum();
                    for c in 0..value {
                        let want: f64 = (lo..=pos)
                            .zip(&weights)
                            .map(|(p, w)| w * f64::from(vals[(kv * width + lead + p) * value + c]))
                            .sum::<f64>()
                            / sum;
                        let at = ((b * Q_HEADS + h) * q_len + i) * value + c;
                        assert!(
                            (f64::from(got[at]) - want).abs() <= 1e-5,
                            "row {b} head {h} query {i} column {c}: {} vs {want}",
                            got[at]
                        );
                    }
                }
            }
        }
    }
}

/// The cache view attends in place on decode steps and hands out the gathered copy where it must: a step whose
/// rows carry leading padding (a batched prompt), and the reference kernels, which the model keeps on the copy.
#[test]
fn the_cache_view_attends_in_place_only_on_unpadded_steps() {
    let device = Default::default();
    let mut pool = PagedKvPool::<B>::new(config(16), &device).unwrap();
    let seqs = vec![pool.add_sequence(), pool.add_sequence()];
    let options = AttentionOptions::causal();
    let (q, k, v) = (
        random([2, Q_HEADS, 4, HEAD_DIM]),
        random([2, KV_HEADS, 4, HEAD_DIM]),
        random([2, KV_HEADS, 4, HEAD_DIM]),
    );
    let mut view = pool
        .cache(seqs.clone())
        .unwrap()
        .with_leading_padding(vec![0, 2]);
    let padded = view.append_attend(0, &q, k, v, &options).unwrap();
    assert!(
        matches!(padded, Appended::Keys { .. }),
        "a padded prompt gathers"
    );
    let mut view = pool.cache(seqs).unwrap();
    let (q, k, v) = (
        random([2, Q_HEADS, 1, HEAD_DIM]),
        random([2, KV_HEADS, 1, HEAD_DIM]),
        random([2, KV_HEADS, 1, HEAD_DIM]),
    );
    match view.append_attend(0, &q, k, v, &options).unwrap() {
        Appended::Attended(out) => assert_eq!(out.dims(), [2, Q_HEADS, 1, HEAD_DIM]),
        Appended::Keys { .. } => panic!("a decode step attends in place on burn-flex"),
    }
    let softcapped = options.with_softcap(30.0);
    let (k, v) = (
        random([2, KV_HEADS, 1, HEAD_DIM]),
        random([2, KV_HEADS, 1, HEAD_DIM]),
    );
    let capped = view.append_attend(0, &q, k, v, &softcapped).unwrap();
    assert!(
        matches!(capped, Appended::Keys { .. }),
        "soft-capped scores gather"
    );
}

/// A batch append writes every row's new positions where the per-row appends would, reports wrong shapes without
/// touching the pool, and when the pool runs out appends the rows before the one that did not fit.
#[test]
fn a_batch_append_equals_per_row_appends_and_reports_what_did_not_fit() {
    let device = Default::default();
    let (k, v) = (
        random([3, KV_HEADS, 2, HEAD_DIM]),
        random([3, KV_HEADS, 2, HEAD_DIM]),
    );
    let mut batched = PagedKvPool::<B>::new(config(16), &device).unwrap();
    let mut one_by_one = PagedKvPool::<B>::new(config(16), &device).unwrap();
    let seqs: Vec<_> = (0..3).map(|_| batched.add_sequence()).collect();
    let same: Vec<_> = (0..3).map(|_| one_by_one.add_sequence()).collect();
    // One position in each, then two more that continue its block.
    for step in [
        (k.clone().narrow(2, 0, 1), v.clone().narrow(2, 0, 1)),
        (k.clone(), v.clone()),
    ] {
        batched
            .append_rows(&seqs, 1, step.0.clone(), step.1.clone())
            .unwrap();
        for (row, &seq) in same.iter().enumerate() {
            let pick = |t: &Tensor<B, 4>| t.clone().narrow(0, row, 1).squeeze_dim::<3>(0);
            one_by_one
                .append(seq, 1, pick(&step.0), pick(&step.1))
                .unwrap();
        }
    }
    let (a, b) = (
        batched.gather(&seqs, 1).unwrap(),
        one_by_one.gather(&same, 1).unwrap(),
    );
    assert_eq!(values(a.keys), values(b.keys));
    assert_eq!(values(a.values), values(b.values));

    let wrong = random([2, KV_HEADS, 1, HEAD_DIM]);
    let err = batched
        .append_rows(&seqs, 1, wrong.clone(), wrong)
        .unwrap_err();
    assert!(matches!(err, PoolError::BadWrite { .. }), "{err:?}");
    assert_eq!(
        batched.seq_len(seqs[0]).unwrap(),
        3,
        "a refused write changes nothing"
    );

    // Two blocks in all: two sequences fit one block each, the third finds none.
    let mut small = PagedKvPool::<B>::new(config(2), &device).unwrap();
    let seqs: Vec<_> = (0..3).map(|_| small.add_sequence()).collect();
    let err = small
        .append_rows(&seqs, 0, k.clone(), v.clone())
        .unwrap_err();
    assert!(matches!(err, PoolError::OutOfBlocks { .. }), "{err:?}");
    let lens: Vec<usize> = seqs.iter().map(|&s| small.seq_len(s).unwrap()).collect();
    assert_eq!(lens, [2, 2, 0]);
}
