//! A model from a GGUF file, through the architecture registry: `general.architecture` selects the
//! [`Family`], whose `gguf_config` turns the metadata into the Hugging Face config its own parser reads, and whose
//! `gguf_tensor` says where each canonical tensor lives and what llama.cpp's converter did to it (stacked rows,
//! the query/key permutation, Gemma's `1 +` norms), so a GGUF model loads into exactly the weights
//! `transformers` builds from the same file.

use std::path::Path;

use ember_optimization::{GgmlWeight, PackedWeight, QuantizedWeight};

use super::{GgmlType, GgufError, GgufFile, GgufHparams, TensorInfo};
use crate::arch::{self, Family, GgufTensor};
use crate::spec::ModelSpec;
use crate::tensors::TensorSpec;

/// Whether `path` looks like a GGUF file (by its magic number), for callers that accept a directory or a file.
pub fn is_gguf(path: &Path) -> bool {
    use std::io::Read;
    let mut magic = [0u8; 4];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok()
        && &magic == b"GGUF"
}

/// The family of a GGUF file, from `general.architecture`; an architecture ember does not read is an error
/// listing the ones it does.
pub fn family(file: &GgufFile) -> Result<&'static dyn Family, GgufError> {
    family_of(file, file.require_str("general.architecture")?)
}

/// The family registered for GGUF architecture `arch` of `file`.
fn family_of(file: &GgufFile, arch: &str) -> Result<&'static dyn Family, GgufError> {
    arch::gguf_family(arch).ok_or_else(|| {
        file.metadata_error(
            "general.architecture",
            &format!("one of {}", arch::gguf_supported().join(", ")),
            format!("{arch:?}"),
        )
    })
}

/// The family and [`ModelSpec`] of a GGUF file, validated like any Hugging Face config. Reads metadata and tensor
/// infos only, never tensor data.
pub fn model_spec(file: &GgufFile) -> crate::Result<(&'static dyn Family, ModelSpec)> {
    let arch = file.require_str("general.architecture")?;
    let family = family_of(file, arch)?;
    let config = family.gguf_config(&GgufHparams::new(file, arch))?;
    let (_, spec) = arch::parse_config_value(&config, file.path())?;
    Ok((family, spec))
}

/// Undoes llama.cpp's query/key row permutation of a row-major `[heads * head_dim, cols]` matrix (a bias is
/// `cols = 1`): GGUF row `h*d + 2i + j` becomes row `h*d + j*(d/2) + i` (`j` in 0..2, `i` in 0..d/2).
///
/// Generic over the element so that quantized rows (packed codes, per-group scales) move the same way.
pub fn unpermute_rows<T: Copy + Default>(data: &[T], heads: usize, cols: usize) -> Vec<T> {
    move_head_rows(data, heads, cols, |half, i, j| (2 * i + j, j * half + i))
}

/// llama.cpp's query/key row permutation (`LlamaModel.permute`), the inverse of [`unpermute_rows`]: canonical row
/// `h*d + j*(d/2) + i` becomes GGUF row `h*d + 2i + j`.
pub fn permute_rows<T: Copy + Default>(data: &[T], heads: usize, cols: usize) -> Vec<T> {
    move_head_rows(data, heads, cols, |half, i, j| (j * half + i, 2 * i + j))
}

/// Moves the rows of every head of a row-major `[heads * head_dim, cols]` matrix: `place(d/2, i, j)` gives the
/// `(from, to)` rows within a head for each `i` in 0..d/2 and `j` in 0..2.
fn move_head_rows<T: Copy + Default>(
    data: &[T],
    heads: usize,
    cols: usize,
    place: impl Fn(usize, usize, usize) -> (usize, usize),
) -> Vec<T> {
    let rows = data.len() / cols.max(1);
    let head_dim = rows / heads.max(1);
    let half = head_dim / 2;
    let mut out = vec![T::default(); data.len()];
    for h in 0..heads {
        for i in 0..half {
            for j in 0..2 {
                let (from, to) = place(half, i, j);
                let (from, to) = (h * head_dim + from, h * head_dim + to);
                out[to * cols..(to + 1) * cols]
                    .copy_from_slice(&data[from * cols..(from + 1) * cols]);
            }
        }
    }
    out
}

/// The canonical rows of a stored row-major matrix with `cols` columns: the stacked slice `place.rows`, then
/// un-permuted.
fn rearrange<T: Copy + Default>(data: &[T], cols: usize, place: &GgufTensor) -> Vec<T> {
    let data = match &place.rows {
        Some(rows) => &data[rows.start * cols..rows.end * cols],
        None => data,
    };
    match place.permuted_heads {
        Some(heads) => unpermute_rows(data, heads, cols),
        None => data.to_vec(),
    }
}

/// Reads the canonical tensors of a GGUF model, dequantized to f32 and mapped back to Hugging Face's layout.
pub struct GgufSource<'a> {
    file: &'a GgufFile,
    family: &'static dyn Family,
    spec: &'a ModelSpec,
    keep_quantized: bool,
}

/// A located tensor: its info and where the canonical tensor sits in it.
struct Located<'a> {
    info: &'a TensorInfo,
    place: GgufTensor,
}

impl<'a> GgufSource<'a> {
    /// A source over `file` for a model of `family` and `spec` (from [`model_spec`]).
    pub fn new(file: &'a GgufFile, family: &'static dyn Family, spec: &'a ModelSpec) -> Self {
        Self {
            file,
            family,
            spec,
            keep_quantized: false,
        }
    }

    /// Hands block-quantized matrices over packed, block for block (see
    /// [`WeightSource::take_quantized`](crate::weights::WeightSource::take_quantized)).
    pub fn keep_quantized(mut self) -> Self {
        self.keep_quantized = true;
        self
    }

    fn missing(&self, name: &str, tensor: &TensorSpec) -> crate::ModelError {
        crate::ModelError::MissingTensor {
            name: name.to_string(),
            canonical: tensor.name.clone(),
            dir: self.file.path().to_path_buf(),
        }
    }

    /// The GGUF tensor behind canonical `tensor`, with its shape checked against the spec: whole tensors have the
    /// canonical shape, stacked ones the canonical width and enough rows.
    fn locate(&self, tensor: &TensorSpec) -> crate::Result<Located<'a>> {
        let place = self
            .family
            .gguf_tensor(self.spec, tensor)
            .ok_or_else(|| self.missing(&tensor.name, tensor))?;
        let info = self
            .file
            .tensor_info(&place.name)
            .map_err(|_| self.missing(&place.name, tensor))?;
        let stored = info.shape();
        let fits = match &place.rows {
            None => stored == tensor.shape,
            Some(rows) => {
                rows.len() == tensor.shape[0]
                    && stored.first().is_some_and(|&n| rows.end <= n)
                    && stored[1..] == tensor.shape[1..]
            }
        };
        if !fits {
            let mut expected = tensor.shape.clone();
            if let Some(rows) = &place.rows {
                expected[0] = stored.first().copied().unwrap_or(0).max(rows.end);
            }
            return Err(crate::ModelError::ShapeMismatch {
                file: self.file.path().to_path_buf(),
                name: place.name,
                expected,
                found: stored,
            });
        }
        Ok(Located { info, place })
    }

    /// Quantized blocks of a tensor that do not make a weight: the file's error, so it names the file.
    fn blocks_error(
        &self,
        info: &TensorInfo,
        e: ember_optimization::QuantError,
    ) -> crate::ModelError {
        GgufError::Corrupt {
            path: self.file.path().to_path_buf(),
            what: format!("tensor `{}`", info.name),
            reason: e.to_string(),
        }
        .into()
    }
}

impl crate::weights::WeightSource for GgufSource<'_> {
    fn take(&mut self, tensor: &TensorSpec) -> crate::Result<Vec<f32>> {
        let Located { info, place } = self.locate(tensor)?;
        let (stored_shape, values) = self.file.tensor_f32(&info.name)?;
        let cols: usize = stored_shape[1..].iter().product();
        let mut values = rearrange(&values, cols, &place);
        if place.offset != 0.0 {
            values.iter_mut().for_each(|v| *v -= place.offset);
        }
        Ok(values)
    }

    fn take_quantized(&mut self, tensor: &TensorSpec) -> crate::Result<Option<PackedWeight>> {
        if !self.keep_quantized || tensor.shape.len() != 2 {
            return Ok(None);
        }
        let Located { info, place } = self.locate(tensor)?;
        if place.offset != 0.0 || !info.ggml_type.is_block_quantized() {
            return Ok(None);
        }
        let stored = info.shape();
        let bytes = self.file.tensor_bytes(&info.name)?;
        let weight = packed(info.ggml_type, bytes, [stored[0], stored[1]])
            .map_err(|e| self.blocks_error(info, e))?;
        if place.rows.is_none() && place.permuted_heads.is_none() {
            return Ok(Some(weight));
        }
        let shape = [tensor.shape[0], tensor.shape[1]];
        match weight {
            // Whole rows of blocks move: a row's blocks cover exactly that output channel.
            PackedWeight::Ggml(weight) => {
                let blocks = rearrange(weight.blocks(), weight.row_bytes(), &place);
                GgmlWeight::new(weight.ty(), shape, blocks).map(PackedWeight::Ggml)
            }
            // Rows of packed codes and of per-group scales move together, each by its own row width.
            PackedWeight::Codes(weight) => {
                let groups = weight.groups_per_row();
                QuantizedWeight::from_parts(
                    weight.scheme(),
                    shape,
                    rearrange(weight.packed_codes(), weight.row_bytes(), &place),
                    rearrange(weight.scales(), groups, &place),
                    weight.mins().map(|m| rearrange(m, groups, &place)),
                )
                .map(PackedWeight::Codes)
            }
        }
        .map(Some)
        .map_err(|e| self.blocks_error(info, e))
    }
}

/// A block-quantized GGUF matrix `[rows, cols]` as ember keeps it: its ggml blocks, every type alike. (Q8_0,
/// Q4_0 and Q4_1 used to become ember's INT8/INT4 codes, whose f32 decode kernel was then the fastest; the
/// integer-dot kernel of the blocks is now as fast for one row and faster for a batch, in the file's bytes.)
fn packed(
    ty: GgmlType,
    bytes: &[u8],
    shape: [usize; 2],
) -> Result<PackedWeight, ember_optimization::QuantError> {
    Ok(PackedWeight::Ggml(GgmlWeight::new(
        ty,
        shape,
        bytes.to_vec(),
    )?))
}

/// The model matrices of `file` that [`load_quantized`] cannot keep packed and dequantizes to f32 (their type
/// is neither F32 nor one of [`GgmlType::BLOCK_QUANTIZED`], e.g. F16): `(GGUF tensor name, type)`, each once,
/// so a caller can warn that they take more memory than in the file.
pub fn unpacked_matrices(file: &GgufFile) -> crate::Result<Vec<(String, GgmlType)>> {
    let (family, spec) = model_spec(file)?;
    let source = GgufSource::new(file, family, &spec);
    let mut unpacked: Vec<(String, GgmlType)> = Vec::new();
    for tensor in spec.tensors().iter().filter(|t| t.shape.len() == 2) {
        let Located { info, .. } = source.locate(tensor)?;
        let ty = info.ggml_type;
        if ty != GgmlType::F32
            && !ty.is_block_quantized()
            && !unpacked.iter().any(|(name, _)| *name == info.name)
        {
            unpacked.push((info.name.clone(), ty));
        }
    }
    Ok(unpacked)
}

/// Loads a GGUF model onto `device`: its spec and every weight dequantized to f32.
pub fn load<B: crate::EmberBackend>(
    file: &GgufFile,
    device: &B::Device,
    progress: Option<crate::weights::Progress<'_>>,
) -> crate::Result<crate::Transformer<B>> {
    let (family, spec) = model_spec(file)?;
    let model = crate::Transformer::from_source(
        &spec,
        &mut GgufSource::new(file, family, &spec),
        device,
        progress,
    );
    file.release_resident_pages();
    model
}

/// Loads a GGUF model onto `device` keeping every block-quantized matrix ([`GgmlType::BLOCK_QUANTIZED`]) packed
/// exactly as stored, as their ggml blocks (the dequantized values are bit-identical to ggml's). Tensors of other types load as f32
/// ([`unpacked_matrices`] lists the matrices among them).
pub fn load_quantized<B: crate::EmberBackend>(
    file: &GgufFile,
    device: &B::Device,
    progress: Option<crate::weights::Progress<'_>>,
) -> crate::Result<crate::Transformer<B>> {
    let (family, spec) = model_spec(file)?;
    let mut source = GgufSource::new(file, family, &spec).keep_quantized();
    let model = crate::Transformer::from_source(&spec, &mut source, device, progress);
    // The blocks were copied out of the map: keep them resident once, not twice.
    file.release_resident_pages();
    model
}
