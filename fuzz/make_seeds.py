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
