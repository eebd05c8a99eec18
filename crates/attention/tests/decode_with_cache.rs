//! Incremental decoding through the KV cache reproduces full-sequence attention, and the cache itself keeps
//! exactly what was appended.

mod common;

use burn::backend::Flex;
use burn::tensor::Tensor;
use common::{assert_close, random_vec, to_vec};
use ember_attention::{
    AttentionError, AttentionKernel, AttentionOptions, ContiguousKvCache, KvCache, Rope,
    RopeConfig, attention,
};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

type B = Flex;

/// Same f32 math in a different order (one query row vs all rows; cached vs whole K/V): agreement to a few
/// ulps of values of size ~1, far below the ~0.1 change a wrong mask or position would cause.
const ATOL: f64 = 1e-5;
const RTOL: f64 = 1e-5;

fn random(rng: &mut ChaCha8Rng, shape: [usize; 4]) -> Tensor<B, 4> {
    common::tensor::<B>(
        &random_vec(rng, shape.iter().product()),
        shape,
        &Default::default(),
    )
}

fn slice_seq(x: &Tensor<B, 4>, range: std::ops::Range<usize>) -> Tensor<B, 4> {
    let [b, h, _, d] = x.dims();
    x.clone().slice([0..b, 0..h, range, 0..d])
}

/// Runs a prefill of `prompt` positions, then decodes one token at a time, and compares every output with
/// one causal pass over the whole sequence.
fn decode_matches_full_sequence(kernel: AttentionKernel, window: Option<usize>, prompt: usize) {
    let (batch, q_heads, kv_heads, seq, head_dim) = (2, 4, 2, 23, 32);
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let device = Default::default();
    let rope = Rope::<B>::new(RopeConfig::new(head_dim).with_theta(500.0), 64, &device)
        .expect("rope config");
    let q = rope.apply(random(&mut rng, [batch, q_heads, seq, head_dim]), 0);
    let k = rope.apply(random(&mut rng, [batch, kv_heads, seq, head_dim]), 0);
    let v = random(&mut rng, [batch, kv_heads, seq, head_dim]);

    let full_options = AttentionOptions::<B>::causal().with_window_opt(window);
    let full = to_vec(attention(
        kernel,
        q.clone(),
        k.clone(),
        v.clone(),
        &full_options,
    ));

    let mut cache = ContiguousKvCache::<B>::new(2);
    let steps = std::iter::once(0..prompt).chain((prompt..seq).map(|t| t..t + 1));
    let mut outputs = Vec::new();
    for step in steps {
        let offset = cache.len();
        assert_eq!(offset, step.start, "cache length is the position offset");
        // Layer 1 stores the same tensors: checks layers are independent and len() waits for all layers.
        let (k_all, v_all) = cache
            .append(0, slice_seq(&k, step.clone()), slice_seq(&v, step.clone()))
            .expect("append layer 0");
        assert_eq!(cache.len(), offset, "layer 1 not yet appended");
        cache
            .append(1, slice_seq(&k, step.clone()), slice_seq(&v, step.clone()))
            .expect("append layer 1");
        let options = AttentionOptions::<B>::causal()
            .with_offset(offset)
            .with_window_opt(window);
        outputs.push(attention(
            kernel,
            slice_seq(&q, step),
            k_all,
            v_all,
            &options,
        ));
    }
    let decoded = to_vec(Tensor::cat(outputs, 2));
    assert_close(
        &format!("{kernel} decode window {window:?}"),
        &decoded,
        &full,
        ATOL,
        RTOL,
    );
}

#[test]
fn decoding_with_cache_equals_full_sequence_for_every_kernel() {
    for kernel in AttentionKernel::ALL {
        decode_matches_full_sequence(kernel, None, 1);
    }
}

#[test]
fn decoding_with_cache_and_sliding_window_equals_full_sequence() {
    for kernel in AttentionKernel::ALL {
        decode_matches_full_sequence(kernel, Some(6), 9);
    }
}

#[test]
fn cache_returns_exactly_what_was_appended_across_growth() {
    let mut rng = ChaCha8Rng::seed_from_u64(12);
    // Capacity 2 forces several doublings over 9 appends.
    let mut cache = ContiguousKvCache::<B>::with_capacity(1, 2);
    let mut ks = Vec::new();
    let mut vs = Vec::new();
    for step in [3, 1, 1, 4, 1, 2, 1, 1, 1] {
        let k = random(&mut rng, [1, 2, step, 8]);
        let v = random(&mut rng, [1, 2, step, 4]);
        ks.push(k.clone());
        vs.push(v.clone());
        let (k_all, v_all) = cache.append(0, k, v).expect("append");
        // Bit-exact: the cache copies, it does not compute.
        assert_eq!(to_vec(k_all), to_vec(Tensor::cat(ks.clone(), 2)));
        assert_eq!(to_vec(v_all), to_vec(Tensor::cat(vs.clone(), 2)));
    }
    assert_eq!(cache.len(), 15);
}

#[test]
fn truncate_rolls_back_and_reset_accepts_a_new_batch_size() {
    let mut rng = ChaCha8Rng::seed_from_u64(13);
    let mut cache = ContiguousKvCache::<B>::new(1);
    let first = random(&mut rng, [1, 2, 5, 8]);
    cache
        .append(0, first.clone(), first.clone())
        .expect("append");
    cache.truncate(3);
    assert_eq!(cache.len(), 3);
    let next = random(&mut rng, [1, 2, 1, 8]);
    let (k_all, _) = cache
        .append(0, next.clone(), next.clone())
        .expect("append after truncate");
    let expected = Tensor::cat(vec![slice_seq(&first, 0..3), next], 2);
    assert_eq!(to_vec(k_all), to_vec(expected));

    cache.reset();
    assert!(cache.is_empty());
    let wider = random(&mut rng, [3, 2, 2, 8]);
    let (k_all, _) = cache
        .append(0, wider.clone(), wider.clone())
        .expect("new batch size after reset");
    assert_eq!(k_all.dims(), [3, 2, 2, 8]);
}

#[test]
fn cache_rejects_unknown_layer_and_mismatched_shapes() {
    let mut rng = ChaCha8Rng::seed_from_u64(14);
    let mut cache = ContiguousKvCache::<B>::new(2);
    let x = random(&mut rng, [1, 2, 3, 8]);
    assert_eq!(
        cache.append(2, x.clone(), x.clone()).unwrap_err(),
        AttentionError::CacheLayer {
            layer: 2,
            num_layers: 2
        }
    );
    cache.append(0, x.clone(), x.clone()).expect("append");
    let other_heads = random(&mut rng, [1, 4, 1, 8]);
    let err = cache
        .append(0, other_heads.clone(), other_heads)
        .unwrap_err();
    assert!(
        matches!(err, AttentionError::Shape { tensor: "key", .. }),
        "{err}"
    );
    let short_values = random(&mut rng, [1, 2, 2, 8]);
    let err = cache.append(1, x, short_values).unwrap_err();
    assert!(
        matches!(
            err,
            AttentionError::Shape {
                tensor: "value",
                ..
            }
        ),
        "{err}"
    );
    // A failed append leaves the cache as it was.
    assert_eq!(cache.len(), 0);
    let (k_all, _) = cache
        .append(
            1,
            random(&mut rng, [1, 2, 3, 8]),
            random(&mut rng, [1, 2, 3, 8]),
        )
        .expect("ok");
    assert_eq!(k_all.dims(), [1, 2, 3, 8]);
    assert_eq!(cache.len(), 3);
}
