//! Embedding outboxd with a handler written in Rust.
//!
//! ```sh
//! cargo run --example inbox_handler -- path/to/outboxd.toml
//! ```
//!
//! The config is an ordinary outboxd config with an `[inbox]` section (an ingress, and
//! handlers for the message types this program does not handle itself). This program
//! registers its own handler for `order.created` and runs `outboxd run` with it: the same
//! ingress, claims, retries, reaper, `/metrics` and signals as the binary.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use outboxd::commands::{execute_with_handlers, Command};
use outboxd::config::Config;
use outboxd::inbox::{Handled, Handler, Handlers};
use outboxd_connector::ClaimedMessage;

/// Reserves stock for a new order. Messages of one order (`biz_key`) arrive one at a
/// time and in order; a crash may deliver one again, so the effect is keyed by
/// `message_id`.
struct ReserveStock;

impl Handler for ReserveStock {
    fn handle<'a>(&'a self, message: &'a ClaimedMessage) -> BoxFuture<'a, Handled> {
        Box::pin(async move {
            let Ok(order) = serde_json::from_slice::<serde_json::Value>(&message.payload) else {
                return Handled::Manual {
                    reason: "the payload is not a JSON order".into(),
                };
            };
            match order.get("sku").and_then(|s| s.as_str()) {
                Some(sku) => {
                    println!("reserving {sku} for order {}", message.biz_key);
                    Handled::Done
                }
                None => Handled::Manual {
                    reason: "the order has no sku".into(),
                },
            }
        })
    }

    fn timeout(&self) -> Duration {
        Duration::from_secs(5)
    }
}

fn main() -> anyhow::Result<()> {
    let path = PathBuf::from(
        std::env::args()
            .nth(1)
            .unwrap_or_else(|| "outboxd.toml".into()),
    );
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .init();
    let config = Config::load(&path)?;
    let handlers = Handlers::default().with("order.created", Arc::new(ReserveStock));
    let runtime = tokio::runtime::Runtime::new()?;
    let code = runtime.block_on(execute_with_handlers(
        Command::Run,
        &config,
        &path,
        handlers,
    ))?;
    std::process::exit(code);
}
