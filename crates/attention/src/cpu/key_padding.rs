//! The key-padding mask of one native flash call, read once from its bool tensor.
//!
//! A batch of sequences of different lengths (the server's running batch, a left-padded prompt batch) pads each
//! row's leading keys. The kernels skip that leading run by narrowing every query row's key range, which costs
//! nothing per key; padding anywhere else (any bool mask is allowed) is listed, and the kernels leave those keys
//! out of the softmax's maximum and set their probabilities (and score gradients) to exactly zero.

use burn::backend::flex::FlexTensor;
use burn::tensor::{BoolStore, DType};

/// `[batch, kv_len]`, `true` = the key is padding.
pub(crate) struct KeyPadding {
    kv_len: usize,
    mask: Vec<bool>,
    /// Per batch row: the padded keys before its first real one.
    lead: Vec<usize>,
    /// Per batch row: whether a padded key follows its first real one.
    holes: Vec<bool>,
}

impl KeyPadding {
    /// The mask `t`, or `None` when it is not a `[batch, kv_len]` bool tensor this kernel reads.
    pub(crate) fn of(t: &FlexTensor, batch: usize, kv_len: usize) -> Option<Self> {
        let shape = t.layout().shape();
        if !matches!(t.dtype(), DType::Bool(BoolStore::Native | BoolStore::U8))
            || shape.num_dims() != 2
            || [shape[0], shape[1]] != [batch, kv_len]
        {
            return None;
        }
        let t = t.to_contiguous();
        let mask = t.storage::<u8>().get(..batch * kv_len)?;
        Some(Self::from_mask(
            mask.iter().map(|&m| m != 0).collect(),
            kv_len,
        ))
    }

    fn from_mask(mask: Vec<bool>, kv_len: usize) -> Self {
        let rows = || mask.chunks_exact(kv_len);
        let lead: Vec<usize> = rows()
            .map(|row| row.iter().take_while(|&&p| p).count())
            .collect();
        let holes = rows()
            .zip(&lead)
            .map(|(row, &lead)| row[lead..].contains(&true))
            .collect();
        KeyPadding {
            kv_len,
            mask,
            lead,
            holes,
        }
    }

    /// Padded keys before batch row `b`'s first real key.
    pub(crate) fn lead(&self, b: usize) -> usize {
        self.lead[b]
    }

    /// The offsets `j < len` at which key `first + j` of batch row `b` is padding after the row's leading run
    /// (the run itself is never inside a narrowed range, so it is not listed).
    pub(crate) fn padded(
        &self,
        b: usize,
        first: usize,
        len: usize,
    ) -> impl Iterator<Item = usize> + '_ {
        let row = if self.holes[b] {
            &self.mask[b * self.kv_len + first..b * self.kv_len + first + len]
        } else {
            &[]
        };
        row.iter()
            .enumerate()
            .filter(|(_, pad)| **pad)
            .map(|(j, _)| j)
    }
}

#[cfg(test)]
mod tests {
    use super::KeyPadding;

    #[test]
    fn leading_runs_are_skipped_and_later_padding_is_listed() {
        let (t, f) = (true, false);
        let padding = KeyPadding::from_mask(vec![t, t, f, f, f, t, f, t, t, t, t, t], 4);
        assert_eq!(
            [padding.lead(0), padding.lead(1), padding.lead(2)],
            [2, 0, 4]
        );
        // Row 0 has no padding after its leading run: nothing is listed, not even its (skipped) padded key 1.
        assert_eq!(padding.padded(0, 1, 3).count(), 0);
        assert_eq!(padding.padded(1, 1, 3).collect::<Vec<_>>(), [0, 2]);
        assert_eq!(padding.padded(1, 0, 2).collect::<Vec<_>>(), [1]);
    }
}
