//! Next-token cross-entropy and the batch layout the trainer feeds the model.

use burn::tensor::activation::log_softmax;
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};
use ember_attention::IGNORE_TARGET;
use ember_dataset::NO_LOSS;

/// Mean cross-entropy (nats per token) of `logits` `[batch, seq, vocab]` against `targets` `[batch, seq]`, over
/// the positions whose target is not [`IGNORE_TARGET`]. Returns a one-element tensor `[1]`.
pub fn cross_entropy<B: Backend>(logits: Tensor<B, 3>, targets: Tensor<B, 2, Int>) -> Tensor<B, 1> {
    let [batch, seq, vocab] = logits.dims();
    let targets = targets.reshape([batch * seq, 1]);
    let ignored = targets.clone().equal_elem(IGNORE_TARGET);
    let counted = ignored.clone().bool_not().float();
    let count = counted.clone().sum().clamp_min(1.0);
    let log_probs = log_softmax(logits.reshape([batch * seq, vocab]), 1);
    (log_probs.gather(1, targets.mask_fill(ignored, 0)) * counted)
        .sum()
        .div(count)
        .neg()
}

/// How many target positions of token rows `[batch, block + 1]` take a loss (those not flagged [`NO_LOSS`]):
/// the weight of these rows' mean loss in a mean over several sets of rows.
pub fn counted_targets(rows: &[u32], block: usize) -> usize {
    rows.chunks_exact(block + 1)
        .flat_map(|row| &row[1..])
        .filter(|&&t| t & NO_LOSS == 0)
        .count()
}

/// Each of `parts`' share of their counted targets (see [`counted_targets`]): the weights that make a sum of
/// their mean losses the mean over all their targets. Equal shares for text data; for chat data, a part with
/// more reply tokens weighs more. Shares of nothing are 0.
pub(crate) fn target_weights(parts: &[Vec<u32>], block_size: usize) -> Vec<f64> {
    let counts: Vec<usize> = parts
        .iter()
        .map(|p| counted_targets(p, block_size))
        .collect();
    let total = counts.iter().sum::<usize>().max(1) as f64;
    counts.into_iter().map(|c| c as f64 / total).collect()
}

/// Splits token rows `[batch, block + 1]` (row-major; `batch = rows.len() / (block + 1)`) into inputs
/// `[batch, block]` (all but the last token of each row) and targets `[batch, block]` (all but the first). A
/// token carrying [`NO_LOSS`] (chat data: prompt and padding) is fed as input without the flag and, as a target,
/// becomes [`IGNORE_TARGET`].
pub fn inputs_and_targets<B: Backend>(
    rows: &[u32],
    block: usize,
    device: &B::Device,
) -> (Tensor<B, 2, Int>, Tensor<B, 2, Int>) {
    let width = block + 1;
    let batch = rows.len() / width;
    let mut inputs = Vec::with_capacity(batch * block);
    let mut targets = Vec::with_capacity(batch * block);
    for row in rows.chunks_exact(width) {
        inputs.extend(row[..block].iter().map(|&t| (t & !NO_LOSS) as i64));
        targets.extend(row[1..].iter().map(|&t| {
            if t & NO_LOSS != 0 {
                IGNORE_TARGET
            } else {
                t as i64
            }
        }));
    }
    (
        Tensor::from_data(TensorData::new(inputs, [batch, block]), device),
        Tensor::from_data(TensorData::new(targets, [batch, block]), device),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;

    #[test]
    fn cross_entropy_matches_a_float64_reference() {
        let device = Default::default();
        let logits_values: Vec<f32> = (0..2 * 3 * 5)
            .map(|i| ((i * 7 % 11) as f32 - 5.0) * 0.3)
            .collect();
        let targets_values: Vec<i64> = vec![0, 4, 2, 1, 3, 3];
        let logits = Tensor::<Flex, 3>::from_data(
            TensorData::new(logits_values.clone(), [2, 3, 5]),
            &device,
        );
        let targets = Tensor::<Flex, 2, Int>::from_data(
            TensorData::new(targets_values.clone(), [2, 3]),
            &device,
        );
        let loss: f32 = cross_entropy(logits, targets).into_scalar();
        let mut expected = 0.0f64;
        for (row, &target) in logits_values.chunks(5).zip(&targets_values) {
            let log_z = row.iter().map(|&x| (x as f64).exp()).sum::<f64>().ln();
            expected += log_z - row[target as usize] as f64;
        }
        expected /= 6.0;
        // f32 log-softmax over 5 values of magnitude < 2: error ~1e-7 relative.
        assert!(
            (loss as f64 - expected).abs() < 1e-5,
            "{loss} vs {expected}"
        );
    }

    /// The fallback loss (models without the one-pass kernel) leaves ignored positions out of the mean, as the
    /// one-pass kernel does: the loss over a batch with ignored positions equals the loss over the counted ones.
    #[test]
    fn ignored_targets_leave_the_mean() {
        let device = Default::default();
        let logits: Vec<f32> = (0..4 * 5)
            .map(|i| ((i * 7 % 11) as f32 - 5.0) * 0.3)
            .collect();
        let all = Tensor::<Flex, 3>::from_data(TensorData::new(logits.clone(), [1, 4, 5]), &device);
        let some = Tensor::<Flex, 3>::from_data(
            TensorData::new(logits[5..15].to_vec(), [1, 2, 5]),
            &device,
        );
        let masked = Tensor::<Flex, 2, Int>::from_data(
            TensorData::new(vec![IGNORE_TARGET, 4, 2, IGNORE_TARGET], [1, 4]),
            &device,
        );
        let kept =
            Tensor::<Flex, 2, Int>::from_data(TensorData::new(vec![4i64, 2], [1, 2]), &device);
        let a: f32 = cross_entropy(all, masked).into_scalar();
        let b: f32 = cross_entropy(some, kept).into_scalar();
        // The same two f32 terms summed and divided by 2: equal to rounding.
        assert!((a - b).abs() < 1e-6, "{a} vs {b}");
    }

    /// Micro-batches weigh by their reply tokens, so that their weighted mean losses are the mean over every
    /// counted target; text rows (nothing flagged) weigh equally.
    #[test]
    fn parts_weigh_by_their_counted_targets() {
        let text = vec![vec![1, 2, 3, 4, 5, 6], vec![7, 8, 9, 1, 2, 3]];
        assert_eq!(target_weights(&text, 2), [0.5, 0.5]);
        // Block 2: row [a, b, c] has targets b and c. Part 0 counts 1 target, part 1 counts 3.
        let chat = vec![vec![1, 2 | NO_LOSS, 3], vec![4, 5, 6 | NO_LOSS, 7, 8, 9]];
        assert_eq!(counted_targets(&chat[0], 2), 1);
        assert_eq!(counted_targets(&chat[1], 2), 3);
        assert_eq!(target_weights(&chat, 2), [0.25, 0.75]);
        let nothing = vec![vec![1, 2 | NO_LOSS, 3 | NO_LOSS]];
        assert_eq!(target_weights(&nothing, 2), [0.0]);
    }

    #[test]
    fn no_loss_tokens_are_inputs_but_not_targets() {
        let device = Default::default();
        let (inputs, targets) =
            inputs_and_targets::<Flex>(&[1 | NO_LOSS, 2 | NO_LOSS, 3, 4 | NO_LOSS], 3, &device);
        let ints =
            |t: Tensor<Flex, 2, Int>| t.into_data().convert::<i64>().into_vec::<i64>().unwrap();
        assert_eq!(ints(inputs), [1, 2, 3]);
        assert_eq!(ints(targets), [IGNORE_TARGET, 3, IGNORE_TARGET]);
    }

    #[test]
    fn rows_split_into_shifted_inputs_and_targets() {
        let device = Default::default();
        let (inputs, targets) = inputs_and_targets::<Flex>(&[1, 2, 3, 4, 5, 6, 7, 8], 3, &device);
        assert_eq!(
            inputs
                .into_data()
                .convert::<i64>()
                .into_vec::<i64>()
                .unwrap(),
            [1, 2, 3, 5, 6, 7]
        );
        assert_eq!(
            targets
                .into_data()
                .convert::<i64>()
                .into_vec::<i64>()
                .unwrap(),
            [2, 3, 4, 6, 7, 8]
        );
    }
}
