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
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start the HTTP sink's runtime: {e}"))?;
        let handle = runtime.handle().clone();
        let (stop, stopped) = oneshot::channel::<()>();
        std::thread::Builder::new()
            .name("outboxd-http-sink".into())
            .spawn(move || {
                runtime.block_on(async {
                    // Either the sink sends nothing and drops the sender: both end it.
                    let _ = stopped.await;
                });
            })
            .map_err(|e| format!("cannot start the HTTP sink's thread: {e}"))?;
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
