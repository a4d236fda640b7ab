//! One module per subcommand.

pub mod dns;
pub mod env;
pub mod proxy;
pub mod up;
