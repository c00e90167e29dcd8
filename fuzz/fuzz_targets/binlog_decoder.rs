#![no_main]
//! See `outboxd_mysql::fuzzing::binlog_decoder` for what the bytes are.

use libfuzzer_sys::fuzz_target;

#[global_allocator]
static ALLOC: outboxd_fuzz::BoundedAlloc = outboxd_fuzz::BoundedAlloc;

fuzz_target!(|data: &[u8]| outboxd_mysql::fuzzing::binlog_decoder(data));
