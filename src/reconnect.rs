//! The one reconnect loop: the log relay, the claim worker and the retry-notification
//! listener each run "open a connection, work until it fails, wait, open again" through
//! [`reconnecting`]. Transient errors are retried after a [`ReconnectBackoff`] delay;
//! definite ones end the loop; shutdown ends it at any wait.

use std::fmt::Display;
use std::time::Duration;

use tokio::sync::watch;

/// Waits `delay`, or less if shutdown is requested meanwhile.
pub(crate) async fn wait_or_shutdown(delay: Duration, shutdown: &mut watch::Receiver<bool>) {
    tokio::select! {
        _ = tokio::time::sleep(delay) => {}
        _ = shutdown.wait_for(|stop| *stop) => {}
    }
}

/// Backoff for reconnecting to a database that is unavailable: 250 ms doubling to 10 s,
/// reset once it answers again.
pub(crate) struct ReconnectBackoff {
    first: Duration,
    max: Duration,
    next: Duration,
}

impl ReconnectBackoff {
    const FIRST: Duration = Duration::from_millis(250);
    const MAX: Duration = Duration::from_secs(10);

    pub(crate) fn new() -> Self {
        Self {
            first: Self::FIRST,
            max: Self::MAX,
            next: Self::FIRST,
        }
    }

    /// The same delay every time.
    pub(crate) fn constant(delay: Duration) -> Self {
        Self {
            first: delay,
            max: delay,
            next: delay,
        }
    }

    pub(crate) fn next_delay(&mut self) -> Duration {
        let delay = self.next;
        self.next = (self.next * 2).min(self.max);
        delay
    }

    /// The source answered: the next failure waits the first delay again.
    pub(crate) fn reset(&mut self) {
        self.next = self.first;
    }
}

/// An error that ends one connection: transient ones are retried.
pub(crate) trait SessionError: Display {
    fn is_transient(&self) -> bool;
}

impl SessionError for outboxd_connector::ConnectorError {
    fn is_transient(&self) -> bool {
        outboxd_connector::ConnectorError::is_transient(self)
    }
}

/// Runs `session` until it returns `Ok` (done: shutdown), a definite error, or shutdown is
/// requested while it waits to reconnect. The session gets the backoff, to reset it once
/// its source answers, and a shutdown receiver of its own. `on_retry` logs a transient
/// error with the delay before the next attempt.
pub(crate) async fn reconnecting<E: SessionError>(
    mut backoff: ReconnectBackoff,
    mut shutdown: watch::Receiver<bool>,
    mut session: impl AsyncFnMut(&mut ReconnectBackoff, watch::Receiver<bool>) -> Result<(), E>,
    on_retry: impl Fn(&E, Duration),
) -> Result<(), E> {
    while !*shutdown.borrow() {
        match session(&mut backoff, shutdown.clone()).await {
            Ok(()) => return Ok(()),
            Err(e) if e.is_transient() => {
                let delay = backoff.next_delay();
                on_retry(&e, delay);
                wait_or_shutdown(delay, &mut shutdown).await;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// One call to the store, bounded by `delivery.store_timeout`: a database that stops
/// answering (a network black hole, a frozen server) fails the call as transient, which
/// ends the relay's session or the claim worker's round, and the loop opens new
/// connections. Without this bound they would wait on the silent connection for as long as
/// the silence lasts, working as far as `/readyz` can tell.
pub(crate) async fn answered<T>(
    limit: Duration,
    what: &str,
    call: impl std::future::Future<Output = Result<T, outboxd_connector::ConnectorError>>,
) -> Result<T, outboxd_connector::ConnectorError> {
    match tokio::time::timeout(limit, call).await {
        Ok(result) => result,
        Err(_) => Err(unanswered(what, limit)),
    }
}

/// The error of a store call that got no answer within `limit`.
pub(crate) fn unanswered(what: &str, limit: Duration) -> outboxd_connector::ConnectorError {
    outboxd_connector::ConnectorError::transient(format!(
        "the database did not answer {what} within {limit:?} (delivery.store_timeout): taking \
         the connection for dead and reconnecting"
    ))
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    #[derive(Debug)]
    struct Failure(bool);

    impl Display for Failure {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "transient: {}", self.0)
        }
    }

    impl SessionError for Failure {
        fn is_transient(&self) -> bool {
            self.0
        }
    }

    #[test]
    fn backoff_doubles_to_its_cap_and_resets() {
        let mut b = ReconnectBackoff::new();
        let delays: Vec<_> = (0..8).map(|_| b.next_delay().as_millis()).collect();
        assert_eq!(delays, [250, 500, 1000, 2000, 4000, 8000, 10_000, 10_000]);
        b.reset();
        assert_eq!(b.next_delay(), Duration::from_millis(250));
        let mut c = ReconnectBackoff::constant(Duration::from_secs(1));
        assert_eq!(c.next_delay(), c.next_delay());
    }

    #[tokio::test]
    async fn transient_errors_reconnect_and_definite_ones_end_the_loop() {
        let (_stop, shutdown) = watch::channel(false);
        let attempts = AtomicU32::new(0);
        let retried = AtomicU32::new(0);
        let result = reconnecting(
            ReconnectBackoff::constant(Duration::from_millis(1)),
            shutdown,
            async |_: &mut ReconnectBackoff, _| {
                let n = attempts.fetch_add(1, Ordering::Relaxed);
                Err(Failure(n < 3))
            },
            |_, _| {
                retried.fetch_add(1, Ordering::Relaxed);
            },
        )
        .await;
        assert!(matches!(result, Err(Failure(false))));
        assert_eq!(attempts.load(Ordering::Relaxed), 4);
        assert_eq!(retried.load(Ordering::Relaxed), 3);
    }

    #[tokio::test]
    async fn shutdown_ends_the_wait_before_a_reconnect() {
        let (stop, shutdown) = watch::channel(false);
        let result = reconnecting(
            ReconnectBackoff::constant(Duration::from_secs(3600)),
            shutdown,
            async |_: &mut ReconnectBackoff, _| Err(Failure(true)),
            |_, _| {
                stop.send_replace(true);
            },
        )
        .await;
        assert!(result.is_ok());
    }
}
