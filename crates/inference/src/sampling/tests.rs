//! Each processor against distributions computed by hand from logits `ln [0.1, 0.2, 0.3, 0.4]`, whose softmax is
//! exactly those probabilities.

use super::*;

fn logits() -> Vec<f32> {
    [0.1f32, 0.2, 0.3, 0.4].iter().map(|p| p.ln()).collect()
}

/// f32 logits carry ~1e-7 relative error into the f64 softmax, so 1e-6 absolute is tight but safe.
fn assert_probs(got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() < 1e-6,
            "token {i}: got {g}, want {w} (all: {got:?})"
        );
    }
}

fn dist(config: SamplingConfig, history: &[u32]) -> Vec<f64> {
    Sampler::new(&config).distribution(&logits(), history)
}

#[test]
fn plain_sampling_is_the_softmax() {
    assert_probs(&dist(SamplingConfig::default(), &[]), &[0.1, 0.2, 0.3, 0.4]);
}

#[test]
fn temperature_half_squares_probabilities() {
    // p^(1/T) renormalised: [1, 4, 9, 16] / 30.
    let config = SamplingConfig {
        temperature: 0.5,
        ..SamplingConfig::default()
    };
    assert_probs(
        &dist(config, &[]),
        &[1.0 / 30.0, 4.0 / 30.0, 9.0 / 30.0, 16.0 / 30.0],
    );
}

#[test]
fn top_k_keeps_the_k_most_likely() {
    let config = SamplingConfig {
        top_k: Some(2),
        ..SamplingConfig::default()
    };
    assert_probs(&dist(config, &[]), &[0.0, 0.0, 3.0 / 7.0, 4.0 / 7.0]);
}

#[test]
fn top_p_keeps_the_smallest_set_reaching_p() {
    // 0.4 alone does not reach 0.5; 0.4 + 0.3 does.
    let config = SamplingConfig {
        top_p: Some(0.5),
        ..SamplingConfig::default()
    };
    assert_probs(&dist(config, &[]), &[0.0, 0.0, 3.0 / 7.0, 4.0 / 7.0]);
    // 0.4 alone reaches 0.35.
    let config = SamplingConfig {
        top_p: Some(0.35),
        ..SamplingConfig::default()
    };
    assert_probs(&dist(config, &[]), &[0.0, 0.0, 0.0, 1.0]);
}

#[test]
fn min_p_drops_tokens_below_a_fraction_of_the_best() {
    // Threshold 0.45 * 0.4 = 0.18: only 0.1 falls below.
    let config = SamplingConfig {
        min_p: Some(0.45),
        ..SamplingConfig::default()
    };
    assert_probs(&dist(config, &[]), &[0.0, 2.0 / 9.0, 3.0 / 9.0, 4.0 / 9.0]);
}

#[test]
fn processors_compose_in_order() {
    // Temperature 0.5 gives [1, 4, 9, 16] / 30; top-k 2 then keeps [9, 16] / 25.
    let config = SamplingConfig {
        temperature: 0.5,
        top_k: Some(2),
        ..SamplingConfig::default()
    };
    assert_probs(&dist(config, &[]), &[0.0, 0.0, 9.0 / 25.0, 16.0 / 25.0]);
}

#[test]
fn repetition_penalty_divides_positive_and_multiplies_negative_logits_once() {
    let mut l = vec![2.0, -1.0, 0.5];
    RepetitionPenalty(2.0).process(&mut l, &[0, 1, 1]);
    assert_eq!(l, [1.0, -2.0, 0.5]);
}

#[test]
fn frequency_and_presence_penalties_count_occurrences() {
    let mut l = vec![0.0, 0.0, 0.0];
    FrequencyPresencePenalty {
        frequency: 0.5,
        presence: 1.0,
    }
    .process(&mut l, &[0, 0, 2]);
    assert_eq!(l, [-2.0, 0.0, -1.5]);
}

#[test]
fn logit_bias_can_ban_a_token() {
    let config = SamplingConfig {
        logit_bias: vec![(3, f32::NEG_INFINITY)],
        ..SamplingConfig::default()
    };
    assert_probs(&dist(config, &[]), &[1.0 / 6.0, 2.0 / 6.0, 3.0 / 6.0, 0.0]);
}

#[test]
fn greedy_takes_the_argmax_after_penalties_and_bias() {
    let mut sampler = Sampler::new(&SamplingConfig::greedy());
    assert_eq!(sampler.sample(&logits(), &[]), 3);
    let config = SamplingConfig {
        logit_bias: vec![(3, -10.0)],
        ..SamplingConfig::greedy()
    };
    assert_eq!(Sampler::new(&config).sample(&logits(), &[]), 2);
    // Token 3's logit ln 0.4 ≈ -0.92 is negative, so the penalty multiplies it to -2.75, below ln 0.3 ≈ -1.20.
    let config = SamplingConfig {
        repetition_penalty: Some(3.0),
        ..SamplingConfig::greedy()
    };
    assert_eq!(Sampler::new(&config).sample(&logits(), &[3]), 2);
}

#[test]
fn the_same_seed_reproduces_the_same_tokens() {
    let draw = |seed| {
        let mut s = Sampler::new(&SamplingConfig {
            seed,
            ..SamplingConfig::default()
        });
        (0..64)
            .map(|_| s.sample(&logits(), &[]))
            .collect::<Vec<_>>()
    };
    assert_eq!(draw(7), draw(7));
    // 64 draws from a 4-way distribution coincide for two seeds with probability < 0.3^64.
    assert_ne!(draw(7), draw(8));
}

#[test]
fn sampled_frequencies_follow_the_distribution() {
    let mut s = Sampler::new(&SamplingConfig {
        seed: 1,
        ..SamplingConfig::default()
    });
    let n = 20_000;
    let mut counts = [0usize; 4];
    for _ in 0..n {
        counts[s.sample(&logits(), &[]) as usize] += 1;
    }
    for (i, want) in [0.1, 0.2, 0.3, 0.4].iter().enumerate() {
        let freq = counts[i] as f64 / n as f64;
        // Binomial standard deviation is at most sqrt(0.25 / 20000) ≈ 0.0035; 0.015 is over four sigma.
        assert!(
            (freq - want).abs() < 0.015,
            "token {i}: frequency {freq}, probability {want}"
        );
    }
}

#[test]
fn removed_tokens_are_never_sampled() {
    let config = SamplingConfig {
        top_k: Some(1),
        seed: 3,
        ..SamplingConfig::default()
    };
    let mut s = Sampler::new(&config);
    assert!((0..200).all(|_| s.sample(&logits(), &[]) == 3));
}

#[test]
fn every_setting_out_of_range_is_a_typed_error_naming_it() {
    let cases: Vec<(SamplingConfig, &str)> = vec![
        (
            SamplingConfig {
                temperature: f32::NAN,
                ..SamplingConfig::default()
            },
            "temperature",
        ),
        (
            SamplingConfig {
                temperature: f32::INFINITY,
                ..SamplingConfig::default()
            },
            "temperature",
        ),
        (
            SamplingConfig {
                temperature: -0.5,
                ..SamplingConfig::default()
            },
            "temperature",
        ),
        (
            SamplingConfig {
                top_k: Some(0),
                ..SamplingConfig::default()
            },
            "top_k",
        ),
        (
            SamplingConfig {
                top_p: Some(0.0),
                ..SamplingConfig::default()
            },
            "top_p",
        ),
        (
            SamplingConfig {
                top_p: Some(2.0),
                ..SamplingConfig::default()
            },
            "top_p",
        ),
        (
            SamplingConfig {
                top_p: Some(f32::NAN),
                ..SamplingConfig::default()
            },
            "top_p",
        ),
        (
            SamplingConfig {
                min_p: Some(1.0),
                ..SamplingConfig::default()
            },
            "min_p",
        ),
        (
            SamplingConfig {
                min_p: Some(-0.1),
                ..SamplingConfig::default()
            },
            "min_p",
        ),
        (
            SamplingConfig {
                repetition_penalty: Some(0.0),
                ..SamplingConfig::default()
            },
            "repetition_penalty",
        ),
        (
            SamplingConfig {
                repetition_penalty: Some(-1.1),
                ..SamplingConfig::default()
            },
            "repetition_penalty",
        ),
        (
            SamplingConfig {
                repetition_penalty: Some(f32::NAN),
                ..SamplingConfig::default()
            },
            "repetition_penalty",
        ),
        (
            SamplingConfig {
                frequency_penalty: Some(f32::NAN),
                ..SamplingConfig::default()
            },
            "frequency_penalty",
        ),
        (
            SamplingConfig {
                presence_penalty: Some(f32::INFINITY),
                ..SamplingConfig::default()
            },
            "presence_penalty",
        ),
        (
            SamplingConfig {
                logit_bias: vec![(1, 0.5), (2, f32::NAN)],
                ..SamplingConfig::default()
            },
            "logit_bias[1]",
        ),
        (
            SamplingConfig {
                logit_bias: vec![(1, f32::INFINITY)],
                ..SamplingConfig::default()
            },
            "logit_bias[0]",
        ),
    ];
    for (config, setting) in cases {
        let err = config.validate().unwrap_err();
        assert_eq!(err.setting, setting, "{config:?}");
        assert!(
            err.to_string().contains(setting) && err.to_string().contains("expected"),
            "{err}"
        );
        assert!(Sampler::try_new(&config).is_err(), "{config:?}");
    }
}

#[test]
fn the_edges_of_every_range_are_accepted() {
    let config = SamplingConfig {
        temperature: 0.0,
        top_k: Some(1),
        top_p: Some(1.0),
        min_p: Some(0.0),
        repetition_penalty: Some(f32::MIN_POSITIVE),
        frequency_penalty: Some(-2.0),
        presence_penalty: Some(2.0),
        logit_bias: vec![(0, f32::NEG_INFINITY), (1, 100.0)],
        seed: 7,
    };
    assert_eq!(config.validate(), Ok(()));
    assert!(Sampler::try_new(&config).is_ok());
    assert_eq!(SamplingConfig::default().validate(), Ok(()));
    assert_eq!(SamplingConfig::greedy().validate(), Ok(()));
}

#[test]
fn the_lane_argmax_picks_what_the_one_pass_fold_picks() {
    use super::{argmax, argmax_fold};
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let mut cases: Vec<Vec<f32>> = vec![
        vec![],
        vec![f32::NEG_INFINITY; 37],
        vec![1.0; 50],
        vec![f32::NAN, 1.0, 2.0],
        vec![1.0, f32::NAN],
        vec![0.5, f32::INFINITY, 3.0, f32::INFINITY],
    ];
    for len in [1, 15, 16, 17, 100, 49152] {
        // Few distinct values, so the maximum is tied across lanes and in the tail.
        let row: Vec<f32> = (0..len).map(|_| rng.random_range(0..6) as f32).collect();
        cases.push(row);
        let row: Vec<f32> = (0..len)
            .map(|_| rng.random::<f32>() * 20.0 - 10.0)
            .collect();
        cases.push(row);
    }
    let mut late = vec![0.0; 1000];
    late[999] = 1.0;
    cases.push(late);
    for (k, logits) in cases.iter().enumerate() {
        assert_eq!(
            argmax(logits),
            argmax_fold(logits),
            "case {k}: {:?}",
            &logits[..logits.len().min(8)]
        );
    }
}
