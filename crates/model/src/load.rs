//! Opening a Hugging Face model directory: `config.json` gives the family and spec, the checkpoint the weights.

use std::path::{Path, PathBuf};

use ember_attention::EmberBackend;

use crate::arch::{self, Family};
use crate::error::{ModelError, Result};
use crate::quantized_io::QUANTIZED_FILE;
use crate::spec::ModelSpec;
use crate::transformer::Transformer;
use crate::weights::{Checkpoint, CheckpointSource, Progress};

/// A model directory whose config has been parsed (no weights read yet).
pub struct ModelDir {
    /// The directory.
    pub dir: PathBuf,
    /// The family named by `architectures[0]`.
    pub family: &'static dyn Family,
    /// The spec read from `config.json`.
    pub spec: ModelSpec,
}

/// A loaded model and what the checkpoint held beyond it.
pub struct Loaded<B: EmberBackend> {
    /// The model.
    pub model: Transformer<B>,
    /// Checkpoint tensors that no parameter was read from (e.g. GPT-2's stored causal masks).
    pub unused: Vec<String>,
}

impl ModelDir {
    /// Reads `config.json` of `path`, which may be the model directory or the config file itself.
    pub fn open(path: &Path) -> Result<Self> {
        let (dir, config) = if path.is_dir() {
            (path.to_path_buf(), path.join("config.json"))
        } else {
            (
                path.parent().map(Path::to_path_buf).unwrap_or_default(),
                path.to_path_buf(),
            )
        };
        if !config.is_file() {
            return Err(ModelError::Io {
                path: config,
                source: std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "no config.json (expected a Hugging Face model directory)",
                ),
            });
        }
        let (family, spec) = arch::read_config(&config)?;
        Ok(ModelDir { dir, family, spec })
    }

    /// Whether the directory holds a quantized checkpoint ([`QUANTIZED_FILE`]) rather than dense weights.
    pub fn is_quantized(&self) -> bool {
        self.dir.join(QUANTIZED_FILE).is_file()
    }

    /// `tokenizer.json` of the directory, if it has one.
    pub fn tokenizer_path(&self) -> Option<PathBuf> {
        Some(self.dir.join("tokenizer.json")).filter(|p| p.is_file())
    }

    /// Loads the weights onto `device`, checking every tensor's presence and shape; `progress` is called after
    /// each parameter tensor with `(done, total, name)`.
    ///
    /// A directory written by [`crate::save_quantized`] (it holds [`QUANTIZED_FILE`]) loads with its matrices
    /// quantized as stored.
    pub fn load<B: EmberBackend>(
        &self,
        device: &B::Device,
        progress: Option<Progress<'_>>,
    ) -> Result<Loaded<B>> {
        if self.is_quantized() {
            return crate::quantized_io::load_quantized(&self.dir, &self.spec, device, progress);
        }
        let checkpoint = Checkpoint::open(&self.dir)?;
        let mut source = CheckpointSource::new(&checkpoint, self.family, &self.spec);
        let model = Transformer::from_source(&self.spec, &mut source, device, progress)?;
        Ok(Loaded {
            model,
            unused: source.unused(),
        })
    }
}

/// Opens and loads the model directory `path` onto `device` (see [`ModelDir::load`]).
pub fn load<B: EmberBackend>(
    path: &Path,
    device: &B::Device,
    progress: Option<Progress<'_>>,
) -> Result<Loaded<B>> {
    ModelDir::open(path)?.load(device, progress)
}
