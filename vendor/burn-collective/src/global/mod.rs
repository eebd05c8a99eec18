pub(crate) mod node;
pub(crate) mod shared;
// ember patch: `CollectiveError::Global` carries this type, which was not nameable outside the crate, so a caller
// could not tell a lost peer from any other failure.
pub use shared::GlobalCollectiveError;

#[cfg(feature = "orchestrator")]
pub mod orchestrator;
#[cfg(feature = "orchestrator")]
pub use orchestrator::*;

mod base;
pub use base::*;
