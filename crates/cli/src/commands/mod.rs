//! One module per subcommand.

pub mod bench;
pub mod chat;
pub mod control_vector;
pub mod convert;
pub mod inspect;
pub mod logits;
pub mod plot;
pub mod run;
pub mod serve;
pub mod synth;
pub mod verify;
