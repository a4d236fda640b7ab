//! The data path's threads: one single-threaded tokio runtime per worker, as nginx and
//! HAProxy run one event loop per core; every worker accepts from each route's one listening
//! socket. A connection lives on the worker that accepted it, so its wake-ups never cross
//! threads.
//! With a node namespace, each worker thread enters it before it starts, so the sockets it
//! makes for upstream connections are born there, without a round trip to another thread.

use std::io;
use std::thread::JoinHandle;

use tokio::runtime::Handle;
use tokio::sync::oneshot;

/// Period of each worker's idle timer (shorter than any connect timeout worth having).
const TICK: std::time::Duration = std::time::Duration::from_millis(200);

/// Running worker runtimes; stopped (tasks cancelled, threads joined) on drop.
pub(crate) struct Workers {
    handles: Vec<Handle>,
    stops: Vec<oneshot::Sender<()>>,
    threads: Vec<JoinHandle<()>>,
}

impl Workers {
    pub(crate) fn start(count: usize, netns: Option<&str>) -> io::Result<Self> {
        let mut w = Self {
            handles: Vec::new(),
            stops: Vec::new(),
            threads: Vec::new(),
        };
        for i in 0..count.max(1) {
            let (stop_tx, stop_rx) = oneshot::channel::<()>();
            let (handle, thread) = crate::socket::spawn_in(
                format!("svcnet-us-{i}"),
                netns,
                || {
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()?;
                    Ok((rt.handle().clone(), rt))
                },
                move |rt| {
                    rt.block_on(async {
                        // A timer always pending a short way ahead. tokio wakes its own
                        // driver (an eventfd write, then a spurious epoll round) whenever a
                        // timer is set earlier than the driver's next planned wake-up, and
                        // with no timer pending that is every timer: each connection's
                        // connect timeout would cost a write, a read and an epoll_wait.
                        let mut tick = tokio::time::interval(TICK);
                        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                        tokio::pin!(stop_rx);
                        loop {
                            tokio::select! {
                                _ = &mut stop_rx => break,
                                _ = tick.tick() => {}
                            }
                        }
                    });
                },
            )?;
            w.handles.push(handle);
            w.stops.push(stop_tx);
            w.threads.push(thread);
        }
        Ok(w)
    }

    pub(crate) fn handles(&self) -> &[Handle] {
        &self.handles
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        self.stops.clear();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}
