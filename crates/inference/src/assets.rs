//! Everything generation needs from a model path: a GGUF file or a Hugging Face model directory, with its
//! tokenizer, chat template and end-of-sequence ids.

use std::path::{Path, PathBuf};

use ember_model::gguf::{self, GgufFile};
use ember_model::weights::Progress;
use ember_model::{EmberBackend, ModelDir, ModelSpec, Quantization, Transformer};
use ember_tokenizer::Tokenizer;

use crate::chat::ChatTemplate;
use crate::error::InferenceError;

/// Where the weights come from.
pub enum WeightsFile {
    /// A GGUF file (weights, tokenizer and template in one file).
    Gguf(GgufFile),
    /// A Hugging Face model directory (boxed: it carries its whole spec, several times the size of an open GGUF
    /// file).
    Dir(Box<ModelDir>),
}

/// How a model's weights are held once loaded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightFormat {
    /// Every weight in f32 (GGUF blocks dequantized).
    F32,
    /// Quantized by ember after loading (see [`Quantization`]).
    Quantized(Quantization),
    /// A GGUF file's Q8_0 / Q4_0 / Q4_1 matrices kept as stored, bit for bit; other tensors in f32.
    Stored,
}

impl WeightFormat {
    /// A short label for reports: `f32`, the scheme (`int4-g32`, with `+emb` / `,f32-head` when those
    /// differ from the defaults), or `gguf`.
    pub fn label(&self) -> String {
        match self {
            WeightFormat::F32 => "f32".to_string(),
            WeightFormat::Stored => "gguf".to_string(),
            WeightFormat::Quantized(q) => {
                let mut label = q.scheme.to_string();
                if q.embeddings {
                    label.push_str("+emb");
                }
                if !q.lm_head {
                    label.push_str(",f32-head");
                }
                label
            }
        }
    }
}

/// An opened model path: spec, tokenizer and chat template read, weights not yet loaded.
pub struct ModelAssets {
    /// The path given.
    pub path: PathBuf,
    /// The weights' container.
    pub weights: WeightsFile,
    /// The model's spec.
    pub spec: ModelSpec,
    /// The tokenizer, when the path has one.
    pub tokenizer: Option<Tokenizer>,
    /// The chat template, when the path has one.
    pub chat_template: Option<ChatTemplate>,
    /// Token ids that end a reply: the tokenizer's EOS and the template's end-of-turn token.
    pub eos: Vec<u32>,
}

fn load_error(path: &Path, e: impl std::fmt::Display) -> InferenceError {
    InferenceError::Load {
        path: path.to_path_buf(),
        message: e.to_string(),
    }
}

impl ModelAssets {
    /// Opens `path`: a `.gguf` file (recognised by its magic number) or a model directory.
    pub fn open(path: &Path) -> Result<Self, InferenceError> {
        let err = |e: &dyn std::fmt::Display| load_error(path, e);
        let (weights, spec, tokenizer, chat_template) = if path.is_file() && gguf::is_gguf(path) {
            let file = GgufFile::open(path).map_err(|e| err(&e))?;
            let (_, spec) = gguf::model_spec(&file).map_err(|e| err(&e))?;
            let vocab = gguf::tokenizer_vocab(&file).map_err(|e| err(&e))?;
            let tokenizer = Tokenizer::from_gguf_vocab(vocab).map_err(|e| err(&e))?;
            let token_text = |id: Option<u32>| {
                id.and_then(|id| tokenizer.id_to_token(id))
                    .unwrap_or("")
                    .to_string()
            };
            let template = gguf::chat_template(&file).map(|src| {
                ChatTemplate::new(
                    src,
                    &token_text(tokenizer.bos_id()),
                    &token_text(tokenizer.eos_id()),
                )
            });
            (WeightsFile::Gguf(file), spec, Some(tokenizer), template)
        } else {
            let dir = ModelDir::open(path).map_err(|e| err(&e))?;
            let tokenizer = dir
                .tokenizer_path()
                .map(|p| Tokenizer::from_path(&p))
                .transpose()
                .map_err(|e| err(&e))?;
            let config = dir.dir.join("tokenizer_config.json");
            let template = if config.is_file() {
                ChatTemplate::from_tokenizer_config(&config)?
            } else {
                None
            };
            let spec = dir.spec.clone();
            (WeightsFile::Dir(Box::new(dir)), spec, tokenizer, template)
        };
        let mut eos: Vec<u32> = tokenizer
            .as_ref()
            .and_then(Tokenizer::eos_id)
            .into_iter()
            .collect();
        if let (Some(t), Some(template)) = (&tokenizer, &chat_template)
            && let Some(id) = t.token_to_id(template.eos_token())
            && !eos.contains(&id)
        {
            eos.push(id);
        }
        Ok(Self {
            path: path.to_path_buf(),
            weights,
            spec,
            tokenizer,
            chat_template,
            eos,
        })
    }

    /// Whether the path is a directory written by [`ember_model::save_quantized`], whose matrices load
    /// quantized whatever precision is asked for.
    pub fn stores_quantized(&self) -> bool {
        matches!(&self.weights, WeightsFile::Dir(dir) if dir.is_quantized())
    }

    /// The matrices of a GGUF file that [`WeightFormat::Stored`] cannot keep packed and expands to f32
    /// (`(tensor, type)`, e.g. F16 ones; see [`gguf::unpacked_matrices`]), so a caller can warn about their
    /// memory; empty for a directory.
    pub fn unpacked_matrices(&self) -> Result<Vec<(String, gguf::GgmlType)>, InferenceError> {
        match &self.weights {
            WeightsFile::Gguf(file) => {
                gguf::unpacked_matrices(file).map_err(|e| load_error(&self.path, e))
            }
            WeightsFile::Dir(_) => Ok(Vec::new()),
        }
    }

    /// Loads the weights onto `device` in f32 (dequantizing GGUF tensors).
    pub fn load<B: EmberBackend>(
        &self,
        device: &B::Device,
        progress: Option<Progress<'_>>,
    ) -> Result<Transformer<B>, InferenceError> {
        self.load_as(device, progress, &WeightFormat::F32)
    }

    /// Loads the weights onto `device` held as `precision` says. A directory written by
    /// [`ember_model::save_quantized`] always loads its quantized matrices as stored (there are no f32 weights to
    /// return to); a scheme then quantizes only what is still dense.
    pub fn load_as<B: EmberBackend>(
        &self,
        device: &B::Device,
        progress: Option<Progress<'_>>,
        precision: &WeightFormat,
    ) -> Result<Transformer<B>, InferenceError> {
        let err = |e: ember_model::ModelError| load_error(&self.path, e);
        match (&self.weights, precision) {
            (WeightsFile::Gguf(file), WeightFormat::Stored) => {
                gguf::load_quantized(file, device, progress).map_err(err)
            }
            (WeightsFile::Dir(dir), WeightFormat::Stored) if !dir.is_quantized() => Err(load_error(
                &self.path,
                "keeping the stored quantization needs a GGUF file or a directory written by `ember quantize`; \
                 this directory holds dense weights (quantize them with a scheme such as int8 or int4 instead)",
            )),
            (WeightsFile::Gguf(file), _) => gguf::load(file, device, progress).map_err(err),
            (WeightsFile::Dir(dir), _) => dir
                .load(device, progress)
                .map(|loaded| loaded.model)
                .map_err(err),
        }
        .and_then(|model| match precision {
            WeightFormat::Quantized(q) => model.quantize(q).map_err(err),
            WeightFormat::F32 | WeightFormat::Stored => Ok(model),
        })
    }
}
