#![no_main]
//! See `outboxd::fuzzing::cloudevents_structured` for what the bytes are.

use libfuzzer_sys::fuzz_target;

#[global_allocator]
static ALLOC: outboxd_fuzz::BoundedAlloc = outboxd_fuzz::BoundedAlloc;

fuzz_target!(|data: &[u8]| outboxd::fuzzing::cloudevents_structured(data));
