//! Paged KV cache: K/V of many sequences in fixed-size blocks of one pre-allocated pool, with
//! per-sequence block tables, on-demand allocation, prefix sharing with copy-on-write, a hard
//! memory budget and statistics.

pub mod blocks;
pub mod cache;
pub mod pool;
