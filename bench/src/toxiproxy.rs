//! Toxiproxy's HTTP API, for the soak's network black holes: the tests' own client
//! (`tests/common/toxiproxy.rs`, the `toxiproxy` service of `scripts/services`), compiled
//! into the bench as it is. What it takes from its parent module is here.

pub(crate) use crate::env_or;
pub(crate) use outboxd_conformance::ports::free_loopback_port as free_port;

// The tests use more of the client than the bench does, and its items are `pub` for them.
#[allow(dead_code, unreachable_pub)]
#[path = "../../tests/common/toxiproxy.rs"]
mod client;

pub(crate) use client::{Proxy, Toxic, Toxiproxy};
