//! Standard Webhooks, both ways: the signatures the inbox's HTTP ingress verifies and
//! the HTTP sink makes (`signature.rs`), and the outbound HTTP client the inbox's webhook
//! handler and the HTTP sink share (`client.rs`).

pub(crate) mod client;
pub mod signature;
