//! Intentionally empty: see Cargo.toml for why this crate exists.
