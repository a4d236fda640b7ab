//! One module per subcommand.

pub mod dns;
pub mod down;
pub mod env;
pub mod exec;
pub mod kubeconfig;
pub mod proxy;
pub mod up;
