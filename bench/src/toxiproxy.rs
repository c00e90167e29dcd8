//! Toxiproxy's HTTP API, for the soak's network black holes: the tests' own client
//! (`tests/common/toxiproxy.rs`, the `toxiproxy` service of `scripts/services`), compiled
//! into the bench as it is. What it takes from its parent module is here.

pub(crate) use crate::env_or;

/// A loopback port nothing listens on, for a proxy.
fn free_port() -> u16 {
    crate::daemon::free_port().unwrap_or_else(|e| panic!("no free loopback port: {e}"))
}

// The tests use more of the client than the bench does, and its items are `pub` for them.
#[allow(dead_code, unreachable_pub)]
#[path = "../../tests/common/toxiproxy.rs"]
mod client;

pub(crate) use client::{Proxy, Toxic, Toxiproxy};
