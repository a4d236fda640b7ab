//! Signal handling for plain-thread programs (the agent's built-in test server), without a
//! signal handler: SIGTERM is blocked in every thread and one thread waits for it.

use nix::sys::signal::{SigSet, Signal};

/// Blocks SIGTERM in the calling thread (and so in every thread it spawns afterwards) and runs
/// `on_term` on a dedicated thread when SIGTERM arrives. Call it before spawning other threads.
pub fn on_sigterm(on_term: impl FnOnce() + Send + 'static) -> std::io::Result<()> {
    let mut set = SigSet::empty();
    set.add(Signal::SIGTERM);
    set.thread_block().map_err(std::io::Error::from)?;
    std::thread::Builder::new()
        .name("sigterm".into())
        .spawn(move || {
            if set.wait().is_ok() {
                on_term();
            }
        })?;
    Ok(())
}
