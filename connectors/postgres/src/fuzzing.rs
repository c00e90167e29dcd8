//! Entry points for the fuzz targets in `fuzz/` (feature `fuzzing`; not an API). Each
//! feeds arbitrary bytes to the real decoders, ignores their errors and panics only
//! where a decoder broke its contract (it must never panic, nor allocate for bytes the
//! peer did not send).

use bytes::{Bytes, BytesMut};
use outboxd_connector_kit::fuzz_input::split_messages;

use crate::log::decode::Decoder;
use crate::log::replication::{next_backend, Backend, ReplicationMessage};
use crate::outbox_table::OutboxTable;
use crate::pgoutput;
use postgres_protocol::message::backend::Message;

/// The OID of the outbox in `log/testdata/pgoutput_insert_tx.hex` (the seeds).
const FIXTURE_OUTBOX_OID: u32 = 0x4041;

/// `pgoutput_decoder`: a sequence of pgoutput messages (see [`split_messages`]), each through
/// `pgoutput::decode` and the transaction assembly (`log::decode::Decoder::handle`)
/// for the captured outbox.
pub fn pgoutput_decoder(data: &[u8]) {
    let outbox = OutboxTable {
        oid: FIXTURE_OUTBOX_OID,
        schema: "public".into(),
        name: "fixture_outbox".into(),
    };
    let mut decoder = Decoder::new(
        vec![outbox],
        "fixture_pub",
        &outboxd_connector::OutboxLayout::default(),
    );
    for msg in split_messages(data) {
        let msg = Bytes::copy_from_slice(msg);
        let _ = pgoutput::decode(&msg);
        // The decoder stops the stream at its first error; go on anyway, from whatever
        // state it is left in, to reach more states.
        let _ = decoder.handle(&msg);
        let _ = decoder.in_transaction();
    }
}

/// `replication_framing`: the bytes a server sends on a replication connection, in
/// chunks of the size the first byte says, through the backend message framing; each
/// CopyData through `ReplicationMessage::parse`, each XLogData's payload through
/// `pgoutput::decode`. Panics when the receive buffer grows far beyond the bytes
/// received (an allocation driven by a length field).
pub fn replication_framing(data: &[u8]) {
    let Some((&chunk, mut rest)) = data.split_first() else {
        return;
    };
    let chunk = usize::from(chunk).max(1);
    let mut rbuf = BytesMut::new();
    let mut received = 0usize;
    loop {
        let (now, later) = rest.split_at(chunk.min(rest.len()));
        rest = later;
        rbuf.extend_from_slice(now);
        received += now.len();
        loop {
            let next = next_backend(&mut rbuf);
            assert!(
                rbuf.capacity() <= 4096 + 4 * received,
                "receive buffer of {} bytes after receiving {received}",
                rbuf.capacity()
            );
            match next {
                Ok(Some(Backend::Message(Message::CopyData(body)))) => {
                    if let Ok(ReplicationMessage::XLogData { data, .. }) =
                        ReplicationMessage::parse(body.into_bytes())
                    {
                        let _ = pgoutput::decode(&data);
                    }
                }
                Ok(Some(_)) => {}
                Ok(None) => break,
                Err(_) => return, // the connection is dropped on a protocol error
            }
        }
        if rest.is_empty() {
            return;
        }
    }
}
