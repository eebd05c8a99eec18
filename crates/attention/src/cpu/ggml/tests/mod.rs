//! The integer products against the float64 product of their dequantized blocks and against each other: the
//! decode path on every instruction set present ([`decode`]) and the prompt path's tiles ([`prompt`]).

mod decode;
#[cfg(target_arch = "x86_64")]
mod prompt;
