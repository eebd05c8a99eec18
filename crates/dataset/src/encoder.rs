//! The one thing the dataset needs from a tokenizer.

/// Turns a document into token ids.
///
/// The dataset crate depends on this trait rather than on a tokenizer type so that preparation can be tested with
/// tiny encoders and driven by any tokenizer. `Sync` because documents are encoded in parallel.
pub trait DocumentEncoder: Sync {
    /// The token ids of `text`, without any special token added; an error message if the text cannot be
    /// encoded (preparation reports it with the document's file and line).
    fn encode(&self, text: &str) -> Result<Vec<u32>, String>;
    /// Number of ids the encoder can produce; every id is `< vocab_size()`. Decides the shard dtype.
    fn vocab_size(&self) -> usize;
    /// The end-of-text id written between documents, if the vocabulary has one.
    fn eos_id(&self) -> Option<u32>;
    /// A string that changes whenever the id of any text would change (a digest of the vocabulary, merges and
    /// normalisation). Stored in the manifest and (digested) in every shard header to catch stale shards.
    fn fingerprint(&self) -> String;
}
