//! The HTTP sink's own runtime thread. outboxd's runtime has one thread, which the relay
//! needs for reading the log and writing statuses back; with Kafka, librdkafka's threads
//! do the network work, but an HTTP request's I/O (writing it, reading the answer, TLS)
//! is the sink's. Its requests therefore run on a thread of their own with a
//! single-threaded runtime, so the relay and the sink use two cores
//! (docs/benchmarks.md, "The HTTP sink"). The thread ends when the sink is dropped.

use tokio::sync::oneshot;

/// See the module documentation.
pub(super) struct IoThread {
    handle: tokio::runtime::Handle,
    /// Dropped with the sink: the thread's runtime then stops and drops its tasks.
    _stop: oneshot::Sender<()>,
}

impl IoThread {
    pub(super) fn start() -> Result<Self, String> {
        // The runtime is built on the thread itself and only its handle comes back: a
        // runtime must not be dropped in an async context (it panics), and built here, it
        // would be, with the thread's closure, if the thread failed to spawn.
        let (started, runtime) = std::sync::mpsc::sync_channel(1);
        let (stop, stopped) = oneshot::channel::<()>();
        std::thread::Builder::new()
            .name("outboxd-http-sink".into())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime,
                    Err(e) => {
                        let _ =
                            started.send(Err(format!("cannot start the HTTP sink's runtime: {e}")));
                        return;
                    }
                };
                if started.send(Ok(runtime.handle().clone())).is_err() {
                    return;
                }
                runtime.block_on(async {
                    // Either the sink sends nothing and drops the sender: both end it.
                    let _ = stopped.await;
                });
            })
            .map_err(|e| format!("cannot start the HTTP sink's thread: {e}"))?;
        // Blocks only while the thread builds its runtime (no I/O: a moment).
        let handle = runtime
            .recv()
            .map_err(|_| "the HTTP sink's thread ended before its runtime started".to_owned())??;
        Ok(Self {
            handle,
            _stop: stop,
        })
    }

    /// Where the requests' tasks are spawned.
    pub(super) fn handle(&self) -> &tokio::runtime::Handle {
        &self.handle
    }
}
