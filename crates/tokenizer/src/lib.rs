//! ember's tokenizer: byte-level BPE (GPT-2, LLaMA-3, Qwen2, SmolLM, GPT-NeoX) and SentencePiece-style BPE with
//! byte fallback (LLaMA-2, Mistral, Phi-3), loaded from `tokenizer.json`, `vocab.json` + `merges.txt`, tiktoken
//! rank files or GGUF vocabularies, plus a deterministic byte-level BPE trainer that writes `tokenizer.json`.
//!
//! ```no_run
//! # fn main() -> ember_tokenizer::Result<()> {
//! let tok = ember_tokenizer::Tokenizer::from_path("tokenizer.json")?;
//! let ids = tok.encode("Hello world")?;
//! assert_eq!(tok.decode(&ids)?, "Hello world");
//! # Ok(()) }
//! ```

mod added;
mod bpe;
pub mod byte_level;
pub mod error;
mod load;
mod normalize;
pub mod pretokenize;
mod stream;
mod tokenizer;
pub mod train;

pub use added::AddedToken;
pub use error::{Result, TokenizerError};
pub use load::GgufVocab;
pub use load::json::type_name as json_type_name;
pub use stream::StreamDecoder;
pub use tokenizer::Tokenizer;
pub use train::{BpeTrainer, NoProgress, TrainProgress, TrainedBpe, train_tokenizer_files};
