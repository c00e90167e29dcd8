#!/usr/bin/env python3
"""Writes the seed corpora fuzz/corpus/<target>/seed-* from the captured test data
(connectors/*/src/log/testdata) and hand-made inputs. Run from anywhere; rewrites the
seed-* files only."""
import base64, hashlib, hmac, json, os, pathlib, struct

ROOT = pathlib.Path(__file__).resolve().parent.parent
CORPUS = ROOT / "fuzz" / "corpus"


def hexlines(path, tagged):
    out = []
    for line in (ROOT / path).read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        out.append(bytes.fromhex(line.split()[-1] if tagged else line))
    return out


def framed(messages):
    return b"".join(struct.pack(">H", len(m)) + m for m in messages)


def write(target, name, data):
    d = CORPUS / target
    d.mkdir(parents=True, exist_ok=True)
    (d / f"seed-{name}").write_bytes(data)


# --- pgoutput_decoder: framed pgoutput messages -------------------------------------------
tx = hexlines("connectors/postgres/src/log/testdata/pgoutput_insert_tx.hex", True)
other = hexlines("connectors/postgres/src/log/testdata/pgoutput_other.hex", True)
write("pgoutput_decoder", "insert-tx", framed(tx))
write("pgoutput_decoder", "other", framed(other))
write("pgoutput_decoder", "both", framed(tx + other))
for i, m in enumerate(tx):
    write("pgoutput_decoder", f"insert-tx-{i}", framed([m]))
kinds = b"I" + struct.pack(">I", 0x4041) + b"N" + struct.pack(">H", 4) + b"n" + b"u" \
    + b"t" + struct.pack(">i", 2) + b"hi" + b"b" + struct.pack(">i", 1) + b"\xff"
write("pgoutput_decoder", "column-kinds", framed([tx[0], tx[1], kinds, tx[-1]]))
for tag in b"OYM":
    write("pgoutput_decoder", f"skipped-{chr(tag)}", framed([bytes([tag, 0, 0])]))

# --- replication_framing: chunk size, then backend messages -------------------------------
def backend(tag, body):
    return tag + struct.pack(">I", len(body) + 4) + body

def xlog(payload, start=0x19C86A0):
    return b"w" + struct.pack(">QQq", start, start + 0x100, 42) + payload

keepalive = b"k" + struct.pack(">Qq", 0x19C86A0, 42) + b"\x01"
stream = backend(b"W", b"\x00\x00\x00") \
    + backend(b"S", b"server_version\x0015.0\x00") \
    + b"".join(backend(b"d", xlog(m)) for m in tx) \
    + backend(b"d", keepalive)
error = backend(b"E", b"SERROR\x00C55000\x00Mreplication slot is active\x00\x00")
for chunk in (1, 7, 64, 255):
    write("replication_framing", f"tx-chunk{chunk}", bytes([chunk]) + stream)
write("replication_framing", "other", bytes([32]) + b"".join(backend(b"d", xlog(m)) for m in other))
write("replication_framing", "keepalive-copydone", bytes([16]) + backend(b"d", keepalive) + backend(b"c", b""))
write("replication_framing", "error", bytes([200]) + error)
write("replication_framing", "notice", bytes([9]) + backend(b"N", b"SNOTICE\x00Mhello\x00\x00") + backend(b"d", keepalive))

# --- binlog_decoder: flags, then framed binlog events -------------------------------------
events = hexlines("connectors/mysql/src/log/testdata/mariadb_outbox.hex", False)
for flags in (0, 1, 2, 3, 5):
    write("binlog_decoder", f"mariadb-flags{flags}", bytes([flags]) + framed(events))
# The header events and the first transaction alone (small seeds mutate faster).
write("binlog_decoder", "mariadb-first", bytes([3]) + framed(events[:8]))

# --- gtid_sets: text forms and MariaDB GTID (list) event bodies ---------------------------
texts = [
    "",
    "3e11fa47-71ca-11e1-9e33-c80aa9429562:1-5",
    "3e11fa47-71ca-11e1-9e33-c80aa9429562:1-5:7:9-12,\n4e11fa47-71ca-11e1-9e33-c80aa9429562:1",
    "3E11FA47-71CA-11E1-9E33-C80AA9429562:1-3:tag_a:1-7:5",
    "0-1-42",
    "0-1-42,1-2-7, 3-4-18446744073709551615",
    "binlog:mysql-bin.000042:1234",
    "binlog:mariadb-bin.000002:32215:0-1-100;server_id=1;domain=0",
    "binlog:mysql-bin.000003:4:3e11fa47-71ca-11e1-9e33-c80aa9429562:1-5;server_uuid=3e11fa47-71ca-11e1-9e33-c80aa9429562",
]
for i, t in enumerate(texts):
    write("gtid_sets", f"text-{i}", t.encode())
write("gtid_sets", "mariadb-gtid", struct.pack("<QIB", 62, 0, 8))
write("gtid_sets", "mariadb-gtid-list", struct.pack("<I", 2) + struct.pack("<IIQ", 0, 1, 61) + struct.pack("<IIQ", 1, 2, 7))

# --- config_loader: the example configs and hand-made ones --------------------------------
for p in sorted((ROOT / "examples").glob("*.toml")):
    write("config_loader", p.stem, p.read_bytes())
write("config_loader", "minimal", b"""[pipeline]
name = "orders"

[source]
engine = "postgres"
host = "127.0.0.1"
user = "outboxd"
password = "secret"
dbname = "app"

[kafka]
bootstrap_servers = "127.0.0.1:9092"
allowed_topics = ["orders.*", "audit"]

[kafka.options]
"compression.type" = "zstd"

[delivery]
shutdown_deadline = "30s"

[inbox.http]
secrets = { billing = ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"] }
""")
write("config_loader", "broken-secret-line", b'[source]\npassword = "hunter2\n')

# --- inbox_http: `source\nheaders\n\nbody`, signed ones verify at NOW --------------------
SECRET = base64.b64decode("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
NOW = 1_700_000_000

def request(source, headers, body):
    return (source + "\n" + "".join(f"{k}: {v}\n" for k, v in headers) + "\n").encode() + body

def signed(msg_id, body, ts=NOW, extra=()):
    mac = hmac.new(SECRET, f"{msg_id}.{ts}.".encode() + body, hashlib.sha256).digest()
    sig = "v1," + base64.b64encode(mac).decode()
    return request("signed", [("webhook-id", msg_id), ("webhook-timestamp", str(ts)),
                              ("webhook-signature", "v1,AAAA " + sig), *extra], body)

body = json.dumps({"type": "invoice.paid", "data": {"id": 7}}).encode()
write("inbox_http", "signed-json", signed("msg_1", body, extra=[("content-type", "application/json")]))
write("inbox_http", "signed-stale", signed("msg_2", body, ts=NOW - 3600))
write("inbox_http", "signed-bad", request("signed", [("webhook-id", "m"), ("webhook-timestamp", str(NOW)), ("webhook-signature", "v1,Zm9v")], body))
write("inbox_http", "unsigned-headers", request("orders", [("message-id", "m-1"), ("message-type", "order.created"), ("biz-key", "order-1"), ("traceparent", "00-abc-def-01")], b"not json"))
write("inbox_http", "unsigned-body-type", request("orders", [("webhook-id", "w-1")], body))
write("inbox_http", "missing-id", request("orders", [("message-type", "x")], b"{}"))

# --- inbox_kafka_record: flags, then `key\nname: value\n…\n\nvalue` -------------------------
# flags: 1 JSON payload column, 2 derive_message_id, 4 source "billing", 8 null key, 16 null value
def record(flags, key, headers, value):
    lines = b"".join(b"\n" + (n if v is None else n + b": " + v) for n, v in headers)
    return bytes([flags]) + key + lines + b"\n\n" + value

ids = [(b"message_id", b"m-1"), (b"message_type", b"order.created")]
trace = (b"traceparent", b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
write("inbox_kafka_record", "json", record(1, b"order-7", ids + [trace], body))
write("inbox_kafka_record", "text-biz-key-header", record(0, b"ignored", ids + [(b"biz_key", b"order-9")], b"plain text"))
write("inbox_kafka_record", "derived-id", record(3, b"order-7", ids[1:], b'{"a": [1, 2.5e3, "\\u00e9", null, true]}'))
write("inbox_kafka_record", "not-json", record(1, b"order-7", ids, b"{not json"))
write("inbox_kafka_record", "bare-null", bytes([1 | 8 | 16]))
write("inbox_kafka_record", "repeats-and-nulls", record(5, b"k\xff", ids + [(b"x", None), (b"x", b"\xfe\xff"), (b"message_id", b""), (b"Message_Id", b"case")], b'"\\ud83d\\ude00"'))
write("inbox_kafka_record", "empty-fields", record(1, b"", [(b"message_id", b""), (b"message_type", None), (b"biz_key", b"")], b"[]"))

# --- headers_from_json: an outbox row's `headers` column as text --------------------------
for i, t in enumerate([
    '{"z": "1", "a": 2, "m": {"x": null}, "n": null}',
    "{}",
    "[1]",
    "not json",
    '{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "tracestate": "vendor=a,other=b"}',
    '{"a": "1", "a": "2", "b": "3", "a": 4}',
    '{"n": 1.5e3, "big": 12345678901234567890, "neg": -0, "f": 0.1, "t": true, "l": [1, "2", [3]]}',
    '{"k\\u00e9\\n": "\\ud83d\\ude00", "tab\\t": "\\"quoted\\""}',
    '{"content-type": "application/json", "ce_tenant": "acme"}  \n',
    '"a string"',
]):
    write("headers_from_json", f"text-{i}", t.encode())

# --- sql_binder: the inbox SQL handler's statement ----------------------------------------
for i, t in enumerate([
    "INSERT INTO t(k, p, s) VALUES (:biz_key, :payload::jsonb, ':id')",
    "CALL f(:id, :id)",
    "SELECT :nope",
    "UPDATE orders SET status = 'paid', meta = :headers::jsonb WHERE id = :biz_key AND \"col:x\" = `:y`",
    "INSERT INTO copy VALUES (:id, :source, :message_id, :message_type, :biz_key, :payload, :headers)",
    "SELECT ':id",
    "SELECT :::id, a:b, ?, $1, 'it''s :id'",
    "SELECT :_x",
    "SELECT :id -- :payload\n, :payload::json->>'a'",
    "SELECT :idé, :é",
]):
    write("sql_binder", f"statement-{i}", t.encode())

# --- cloudevents_structured: flags, then `id\ntype\nbiz_key\ncreated_at\nheaders\npayload` --
# flags: 1 source "urn:example:orders", 2 content_type "application/protobuf"
def event(flags, headers, payload, message_id="m-1", message_type="order.created",
          biz_key="order-42", created_at="2026-05-09T07:30:00.123+00"):
    head = "\n".join([message_id, message_type, biz_key, created_at, headers]) + "\n"
    return bytes([flags]) + head.encode() + payload

tp = '"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"'
write("cloudevents_structured", "json", event(0, "{" + tp + ', "ce_tenant": "acme"}', b'{"total": 12, "items": [1,2]}'))
write("cloudevents_structured", "protobuf", event(3, "{}", b"\x08\x96\x01\x12\x00"))
write("cloudevents_structured", "row-content-type", event(2, '{"Content-Type": "application/vnd.orders+json; charset=utf-8", "seq": 1}', b"[1]"))
write("cloudevents_structured", "text", event(0, '{"content-type": "text/plain"}', b"hello"))
write("cloudevents_structured", "unparsable-json", event(0, "{}", b"{not json"))
write("cloudevents_structured", "no-optional", event(1, "{}", b"", biz_key="", created_at="infinity"))
write("cloudevents_structured", "reserved-names", event(0, '{"ce_type": "forged", "CE_DataContentType": "x", "message_id": "y", "ce_region2": "eu", "ce_Bad": "z", "ce_data_base64": "w"}', b"{}"))
write("cloudevents_structured", "mysql-time", event(0, "not json", b"null", created_at="2026-05-09T07:30:00.123456+00:00"))
write("cloudevents_structured", "refused", event(0, "{}", b"{}", message_id="", message_type=""))
# Found by the target: a JSON string holding a byte that is not UTF-8 was taken as JSON.
write("inbox_kafka_record", "found-not-utf8", record(7, b"i", [(b"message_type", b"c")], b'"\xf6"'))
# Found by the target: a JSON payload with a byte that is not UTF-8 inside a string.
write("cloudevents_structured", "found-not-utf8", event(0, "{}", b'{"\xff":2}'))
# Found by the target: a row repeating an extension attribute.
write("cloudevents_structured", "found-repeated-extension", event(1, '{"ce_region8":"","ce_region8":""}', b""))
# Found by the target: a row with a second content-type header.
write("cloudevents_structured", "found-second-content-type", event(0, '{"Content-Type":"","Content-Type":""}', b""))
