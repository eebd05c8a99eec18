//! [`QuantizedLinear`]: a linear layer whose weight stays quantized on the device.

use burn::module::Module;
use burn::tensor::backend::Backend;
use burn::tensor::{DType, ElementConversion, Int, Tensor, TensorData, TensorPrimitive};
use ember_attention::{CodeLayout, EmberBackend};

use crate::error::QuantError;
use crate::quant::scheme::QuantScheme;
use crate::quant::weight::QuantizedWeight;

/// Default bound on the f32 elements of one dequantized weight tile (4 MiB): large enough that
/// decode matmuls stay efficient, small enough that a 49k-row LM head never materialises whole.
const DEFAULT_TILE_ELEMENTS: usize = 1 << 20;

/// A linear layer `y = x W^T + b` with `W: [out_features, in_features]` stored quantized.
///
/// Codes live on the device packed into integer words (`u8` holding one INT8 or two INT4 codes
/// where the backend supports `u8`, otherwise `i32` words holding four or eight), next to f32
/// per-group scales (and minimums). [`forward`](Self::forward) asks the backend's
/// [`EmberBackend::quantized_dense`] kernel first (burn-flex reads the packed codes directly); elsewhere it
/// dequantizes one tile of output channels at a time and multiplies it, so peak extra memory is one tile,
/// never the f32 weight.
///
/// It is a burn [`Module`] with constant (non-trainable) tensors, so it can sit in a model struct
/// in place of `burn::nn::Linear`; it is meant for inference and carries no gradients.
#[derive(Module, Debug)]
pub struct QuantizedLinear<B: Backend> {
    /// Packed codes, `[out_features, words_per_row]`.
    words: Tensor<B, 2, Int>,
    /// Scales, `[out_features, groups_per_row, 1]` (the trailing 1 broadcasts over a group).
    scales: Tensor<B, 3>,
    /// Minimums of asymmetric schemes, `[out_features, groups_per_row, 1]`.
    mins: Option<Tensor<B, 3>>,
    /// Bias, `[out_features]`.
    bias: Option<Tensor<B, 1>>,
    #[module(skip)]
    layout: Layout,
}

/// Shapes and packing of a [`QuantizedLinear`], fixed at construction.
#[derive(Clone, Debug)]
struct Layout {
    scheme: QuantScheme,
    shape: [usize; 2],
    /// Bits per device word: 8 (`u8`) or 32 (`i32`).
    word_bits: usize,
    /// Output channels dequantized per matmul tile.
    tile_rows: usize,
}

impl Layout {
    fn codes_per_word(&self) -> usize {
        self.word_bits / self.scheme.bits()
    }

    fn groups(&self) -> usize {
        self.scheme.groups_per_row(self.shape[1])
    }

    /// The packing as backend kernels read it (`u8` words: one INT8 or two INT4 codes per byte).
    fn code_layout(&self) -> CodeLayout {
        CodeLayout {
            bits: self.scheme.bits(),
            in_features: self.shape[1],
            group_len: self.scheme.group_len(self.shape[1]),
            zero_code: self.scheme.zero_code().map(f32::from),
        }
    }
}

impl<B: Backend> QuantizedLinear<B> {
    /// Uploads a host [`QuantizedWeight`] and an optional bias `[out_features]` to `device`.
    pub fn new(
        weight: &QuantizedWeight,
        bias: Option<Tensor<B, 1>>,
        device: &B::Device,
    ) -> Result<Self, QuantError> {
        let word_bits = if B::supports_dtype(device, DType::U8) {
            8
        } else {
            32
        };
        Self::with_word_bits(weight, bias, device, word_bits)
    }

    /// [`new`](Self::new) with an explicit device word width (8 for `u8`, 32 for `i32`).
    fn with_word_bits(
        weight: &QuantizedWeight,
        bias: Option<Tensor<B, 1>>,
        device: &B::Device,
        word_bits: usize,
    ) -> Result<Self, QuantError> {
        let [out_features, in_features] = weight.shape();
        if let Some(bias) = &bias
            && bias.dims() != [out_features]
        {
            return Err(QuantError::ShapeMismatch {
                what: "bias".into(),
                expected: vec![out_features],
                actual: bias.dims().to_vec(),
            });
        }
        let groups = weight.groups_per_row();
        let scales = Tensor::<B, 1>::from_data(
            TensorData::new(weight.scales().to_vec(), [out_features * groups]),
            device,
        )
        .reshape([out_features, groups, 1]);
        let mins = weight.mins().map(|mins| {
            Tensor::<B, 1>::from_data(
                TensorData::new(mins.to_vec(), [out_features * groups]),
                device,
            )
            .reshape([out_features, groups, 1])
        });
        Ok(Self {
            words: upload_words(weight, word_bits, device),
            scales,
            mins,
            bias,
            layout: Layout {
                scheme: weight.scheme(),
                shape: weight.shape(),
                word_bits,
                tile_rows: (DEFAULT_TILE_ELEMENTS / in_features).clamp(1, out_features),
            },
        })
    }

    /// Quantizes a dense weight `[out_features, in_features]` (read back to the host once) and
    /// uploads the result to the weight's device.
    ///
    /// `burn::nn::Linear` stores its weight as `[in, out]`: pass `linear.weight.val().transpose()`.
    pub fn quantize(
        weight: Tensor<B, 2>,
        bias: Option<Tensor<B, 1>>,
        scheme: QuantScheme,
    ) -> Result<Self, QuantError> {
        let device = weight.device();
        let shape = weight.dims();
        let values = weight
            .into_data()
            .convert::<f32>()
            .into_vec::<f32>()
            .map_err(|err| device_data("dense weight", err))?;
        let quantized = QuantizedWeight::quantize(&values, shape, scheme)?;
        Self::new(&quantized, bias, &device)
    }

    /// Sets how many output channels each forward tile dequantizes (at least 1). Smaller tiles
    /// lower peak memory; larger ones issue fewer, bigger matmuls.
    pub fn with_tile_rows(mut self, tile_rows: usize) -> Self {
        self.layout.tile_rows = tile_rows.clamp(1, self.layout.shape[0]);
        self
    }

    /// The scheme.
    pub fn scheme(&self) -> QuantScheme {
        self.layout.scheme
    }

    /// The f32 bias `[out_features]`, if any.
    pub fn bias(&self) -> Option<&Tensor<B, 1>> {
        self.bias.as_ref()
    }

    /// The device the weight lives on.
    pub fn device(&self) -> B::Device {
        self.scales.device()
    }

    /// `[out_features, in_features]`.
    pub fn shape(&self) -> [usize; 2] {
        self.layout.shape
    }

    /// Device bytes held by the weight: packed words, scales, minimums and bias.
    pub fn memory_bytes(&self) -> usize {
        let [out_features, _] = self.layout.shape;
        let words = self.words.dims().iter().product::<usize>() * self.layout.word_bits / 8;
        let groups = out_features * self.layout.groups();
        let params = groups * (1 + usize::from(self.mins.is_some()));
        words + 4 * (params + self.bias.as_ref().map_or(0, |_| out_features))
    }

    /// The tensor-op forward: output channels are processed in tiles of `tile_rows`, each tile's codes are
    /// unpacked and dequantized, multiplied, and dropped before the next. Unpacking a word yields one code field
    /// at a time (field `k` of word `w` is input column `w * codes_per_word + k`), so instead of
    /// interleaving the fields back into column order (an element-by-element copy that cost 20x the
    /// matmul on CPU), `x` is split into the matching column sets once and the tile's product is the
    /// sum of one matmul per field.
    fn forward_tiled(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let [out_features, _] = self.layout.shape;
        let x_fields = self.split_columns(x);
        let tiles = (0..out_features)
            .step_by(self.layout.tile_rows)
            .map(|start| {
                let end = (start + self.layout.tile_rows).min(out_features);
                let fields = self.dequantize_fields(
                    self.words.clone().narrow(0, start, end - start),
                    self.scales.clone().narrow(0, start, end - start),
                    self.mins.clone().map(|m| m.narrow(0, start, end - start)),
                );
                fields
                    .into_iter()
                    .zip(&x_fields)
                    .map(|(weight, x)| x.clone().matmul(weight.transpose()))
                    .reduce(|acc, y| acc + y)
                    .expect("a word holds at least one code")
            })
            .collect::<Vec<_>>();
        let mut y = Tensor::cat(tiles, 1);
        if let Some(bias) = &self.bias {
            y = y + bias.clone().unsqueeze_dim(0);
        }
        y
    }

    /// `x: [rows, in_features]` split into the column sets of the code fields: entry `k` is
    /// `[rows, words_per_row]` holding columns `k, k + codes_per_word, ...` (zeros past
    /// `in_features`, where the packed padding codes sit).
    fn split_columns(&self, x: Tensor<B, 2>) -> Vec<Tensor<B, 2>> {
        let per_word = self.layout.codes_per_word();
        let [rows, in_features] = x.dims();
        let words = self.words.dims()[1];
        let slots = words * per_word;
        let x = if slots > in_features {
            let pad = Tensor::zeros([rows, slots - in_features], &x.device());
            Tensor::cat(vec![x, pad], 1)
        } else {
            x
        };
        if per_word == 1 {
            return vec![x];
        }
        let x = x.reshape([rows, words, per_word]);
        (0..per_word)
            .map(|k| x.clone().narrow(2, k, 1).reshape([rows, words]))
            .collect()
    }

    /// Looks up rows of the weight, treating it as an embedding table `[vocab, dim]`:
    /// `ids: [batch, seq]` gives `[batch, seq, dim]`. Only the selected rows are dequantized.
    pub fn embed(&self, ids: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        let [batch, seq] = ids.dims();
        let ids = ids.reshape([batch * seq]);
        let rows = self.dequantize_parts(
            self.words.clone().select(0, ids.clone()),
            self.scales.clone().select(0, ids.clone()),
            self.mins.clone().map(|m| m.select(0, ids)),
        );
        rows.reshape([batch, seq, self.layout.shape[1]])
    }

    /// Dequantizes the whole weight to `[out_features, in_features]` f32 (for inspection and
    /// tests; [`forward`](Self::forward) never does this).
    pub fn dequantize(&self) -> Tensor<B, 2> {
        self.dequantize_parts(self.words.clone(), self.scales.clone(), self.mins.clone())
    }

    /// Reads the weight back to the host (e.g. to save it).
    pub fn to_weight(&self) -> Result<QuantizedWeight, QuantError> {
        let [out_features, _] = self.layout.shape;
        let read = |data: TensorData, what: &str| {
            data.convert::<f32>()
                .into_vec::<f32>()
                .map_err(|err| device_data(what, err))
        };
        let scales = read(self.scales.to_data(), "scales")?;
        let mins = match &self.mins {
            Some(mins) => Some(read(mins.to_data(), "mins")?),
            None => None,
        };
        let words = self
            .words
            .to_data()
            .convert::<i64>()
            .into_vec::<i64>()
            .map_err(|err| device_data("packed codes", err))?;
        let word_bytes = self.layout.word_bits / 8;
        let row_bytes = crate::quant::weight::row_bytes(self.layout.scheme, self.layout.shape[1]);
        let words_per_row = self.words.dims()[1];
        let mut codes = Vec::with_capacity(out_features * row_bytes);
        for row in words.chunks_exact(words_per_row) {
            let bytes = row
                .iter()
                .flat_map(|&word| (word as u32).to_le_bytes().into_iter().take(word_bytes));
            codes.extend(bytes.take(row_bytes));
        }
        QuantizedWeight::from_parts(self.layout.scheme, self.layout.shape, codes, scales, mins)
    }

    /// Dequantizes a slice of rows in column order: `words: [rows, words_per_row]`,
    /// `scales`/`mins: [rows, groups, 1]` → `[rows, in_features]`.
    fn dequantize_parts(
        &self,
        words: Tensor<B, 2, Int>,
        scales: Tensor<B, 3>,
        mins: Option<Tensor<B, 3>>,
    ) -> Tensor<B, 2> {
        let [rows, words_per_row] = words.dims();
        let per_word = self.layout.codes_per_word();
        let fields = self.dequantize_fields(words, scales, mins);
        let values = if per_word == 1 {
            fields.into_iter().next().expect("one field")
        } else {
            Tensor::stack::<3>(fields, 2).reshape([rows, words_per_row * per_word])
        };
        values.narrow(1, 0, self.layout.shape[1])
    }

    /// Unpacks and dequantizes each code field of `words: [rows, words_per_row]`: entry `k` is
    /// `[rows, words_per_row]`, the values of input columns `w * codes_per_word + k`.
    ///
    /// Groups span whole words (a group is a multiple of 8 codes, a word holds 1, 2, 4 or 8), so
    /// word `w`'s codes all share group `w / words_per_group` and each field scales like the words.
    fn dequantize_fields(
        &self,
        words: Tensor<B, 2, Int>,
        scales: Tensor<B, 3>,
        mins: Option<Tensor<B, 3>>,
    ) -> Vec<Tensor<B, 2>> {
        let layout = &self.layout;
        let [rows, words_per_row] = words.dims();
        let per_word = layout.codes_per_word();
        let groups = layout.groups();
        let bits = layout.scheme.bits();
        let mask = ((1i64 << bits) - 1).elem::<B::IntElem>();
        let zero = layout.scheme.zero_code().map(f32::from);
        // One group (per-channel INT8) broadcasts over the whole row, padding words included.
        let grouped = groups > 1;
        let per_group = if grouped {
            words_per_row / groups
        } else {
            words_per_row
        };
        (0..per_word)
            .map(|k| {
                let codes = if per_word == 1 {
                    words.clone()
                } else {
                    words
                        .clone()
                        .bitwise_right_shift_scalar(((k * bits) as i64).elem::<B::IntElem>())
                        .bitwise_and_scalar(mask)
                };
                let codes = codes.float().reshape([rows, groups, per_group]);
                let values = match (&mins, zero) {
                    (Some(mins), _) => codes * scales.clone() + mins.clone(),
                    (None, zero) => codes.sub_scalar(zero.unwrap_or(0.0)) * scales.clone(),
                };
                values.reshape([rows, groups * per_group])
            })
            .collect()
    }
}

impl<B: EmberBackend> QuantizedLinear<B> {
    /// Applies the layer to `x: [..., in_features]`, returning `[..., out_features]`.
    ///
    /// The backend's [`EmberBackend::quantized_dense`] runs it from the packed codes where it can (burn-flex,
    /// with `u8` words); otherwise tiles of `tile_rows` output channels are dequantized with tensor ops and
    /// multiplied one at a time, so the f32 weight never exists whole.
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        let dims = x.dims();
        let [out_features, in_features] = self.layout.shape;
        let rows = dims[..D - 1].iter().product::<usize>();
        let x = x.reshape([rows, in_features]);
        // `CodeLayout` describes bytes; `i32` words (backends without `u8`) take the tensor-op path.
        let native = if self.layout.word_bits == 8 {
            B::quantized_dense(
                x.clone().into_primitive().tensor(),
                self.words.clone().into_primitive(),
                self.scales.clone().into_primitive().tensor(),
                self.mins.clone().map(|m| m.into_primitive().tensor()),
                self.bias.clone().map(|b| b.into_primitive().tensor()),
                self.layout.code_layout(),
            )
        } else {
            None
        };
        let y = match native {
            Some(y) => Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(y)),
            None => self.forward_tiled(x),
        };
        let mut out_dims = dims;
        out_dims[D - 1] = out_features;
        y.reshape(out_dims)
    }
}

/// Re-packs the host bytes into device words of `word_bits`, little-endian within a word so that
/// code `k` of a word sits at bit `k * bits`, and uploads them as `[out_features, words_per_row]`.
fn upload_words<B: Backend>(
    weight: &QuantizedWeight,
    word_bits: usize,
    device: &B::Device,
) -> Tensor<B, 2, Int> {
    let [out_features, _] = weight.shape();
    let row_bytes = weight.row_bytes();
    if word_bits == 8 {
        let data = TensorData::new(weight.packed_codes().to_vec(), [out_features, row_bytes]);
        return Tensor::from_data(data, (device, DType::U8));
    }
    let words_per_row = row_bytes.div_ceil(4);
    let mut words = Vec::with_capacity(out_features * words_per_row);
    for row in weight.packed_codes().chunks_exact(row_bytes) {
        words.extend(row.chunks(4).map(|chunk| {
            let mut bytes = [0u8; 4];
            bytes[..chunk.len()].copy_from_slice(chunk);
            i32::from_le_bytes(bytes)
        }));
    }
    Tensor::from_data(
        TensorData::new(words, [out_features, words_per_row]),
        (device, DType::I32),
    )
}

fn device_data(what: &str, err: burn::tensor::DataError) -> QuantError {
    QuantError::DeviceData {
        what: what.to_string(),
        reason: format!("{err:?}"),
    }
}

#[cfg(test)]
mod tests {
    use burn::backend::Flex;

    use super::*;

    /// Backends without `u8` get `i32` words of four INT8 or eight INT4 codes; unpacking them
    /// (arithmetic shifts of words whose top bit is set included) must give the same bit-exact
    /// values as the `u8` layout and the host. `in_features = 198` leaves a partially used last
    /// word for every scheme.
    #[test]
    fn i32_words_dequantize_like_u8_words() {
        let device = Default::default();
        let [rows, cols] = [6, 198];
        // Alternating signs and magnitudes exercise every code, including the high ones.
        let weights: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0)
            .collect();
        for scheme in ["int8", "int8-g64", "int4-g32", "int4-g64-asym"] {
            let scheme: QuantScheme = scheme.parse().unwrap();
            let weight = QuantizedWeight::quantize(&weights, [rows, cols], scheme).unwrap();
            let host = weight.dequantize();
            for word_bits in [8, 32] {
                let layer =
                    QuantizedLinear::<Flex>::with_word_bits(&weight, None, &device, word_bits)
                        .unwrap();
                let values = layer.dequantize().into_data().into_vec::<f32>().unwrap();
                assert_eq!(values, host, "{scheme} with {word_bits}-bit words");
                assert_eq!(layer.to_weight().unwrap(), weight, "{scheme}, {word_bits}");
            }
        }
    }
}
