//! The `--suite` benches: attention kernels, tokenizer throughput, training steps.

pub mod kernels;
pub mod tokenizer;
pub mod train;
