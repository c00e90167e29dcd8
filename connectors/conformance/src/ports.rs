//! Loopback ports for the servers a test starts (outboxd's HTTP endpoint, a throwaway
//! PostgreSQL cluster).
//!
//! Asking the kernel for a free port (`bind 127.0.0.1:0`, then closing it) races: the
//! kernel may hand the same port out again before the test's server binds it, to another
//! test's `bind(0)` or as the local port of any outgoing connection. Two daemons given the
//! same port make one test talk to the other's daemon, and both fail waiting for rows
//! that went elsewhere (the likeliest cause of a CI failure in `tests/inbox.rs`, where
//! two tests timed out together after both had reached a daemon). So ports come from below Linux's ephemeral
//! range (32768–60999 by default), where the kernel never picks one on its own and above
//! `scripts/services`' fixed ports; from a counter, so one test process never hands out a
//! port twice; starting at an offset of the process id, so test processes running at the
//! same time rarely meet; and each is checked free before it is returned.

use std::net::TcpListener;
use std::sync::atomic::{AtomicU32, Ordering};

/// The ports handed out: below the ephemeral range, above the services' (23306–29094).
const FIRST: u32 = 30_000;
const COUNT: u32 = 2_700;

/// A loopback port no other caller in this process has been given and nothing listens on.
///
/// # Panics
/// When every port of the range is taken (a test process would need thousands of servers).
#[must_use]
pub fn free_loopback_port() -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    // The first call picks the process's starting offset.
    let _ = NEXT.compare_exchange(
        u32::MAX,
        std::process::id().wrapping_mul(631) % COUNT,
        Ordering::Relaxed,
        Ordering::Relaxed,
    );
    for _ in 0..COUNT {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = u16::try_from(FIRST + n % COUNT).expect("the range is below 65536");
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port in {FIRST}..{}", FIRST + COUNT);
}

#[cfg(test)]
mod tests {
    use super::*;

    // One test: the counter is shared by the whole process.
    #[test]
    fn ports_are_distinct_below_the_ephemeral_range_and_taken_ones_are_skipped() {
        let ports: Vec<u16> = (0..200).map(|_| free_loopback_port()).collect();
        let distinct: std::collections::HashSet<_> = ports.iter().collect();
        assert_eq!(distinct.len(), ports.len(), "{ports:?}");
        let range = FIRST..FIRST + COUNT;
        assert!(
            ports.iter().all(|p| range.contains(&u32::from(*p))),
            "{ports:?}"
        );

        let taken = free_loopback_port();
        let _listener = TcpListener::bind(("127.0.0.1", taken)).expect("bind");
        // A whole turn of the counter comes back to the taken port: it is skipped.
        let turn: Vec<u16> = (0..COUNT).map(|_| free_loopback_port()).collect();
        assert!(!turn.contains(&taken));
    }
}
