//! The command line's library side: `run`, `init`, `check`, `recover` ([`commands`]) and
//! the operator commands `status`, `retry`, `park`, `resolve`, `janitor` ([`admin`]).
//! `main.rs` parses arguments and calls [`commands::execute`].

pub mod admin;
pub mod commands;
mod recover;
