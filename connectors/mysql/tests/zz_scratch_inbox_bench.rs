mod support;
use std::time::Instant;
use mysql_async::prelude::Queryable;
use outboxd_connector::{Connector, InboxMessage, InboxOutcome, InboxStore, OutboxLayout, ReadMode};
use outboxd_mysql::MysqlConnector;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scratch_bench() {
    let name = format!("ib_bench_{}", support::rand_u32() % 1_000_000);
    let layout = OutboxLayout { outbox_table: format!("outbox_{name}"), inbox_table: format!("inbox_{name}"), ..OutboxLayout::default() };
    let c = MysqlConnector::new(support::config(), &name, layout).unwrap();
    Connector::init(&c, ReadMode::Poll).await.unwrap();
    let s = c.open_inbox().await.unwrap();
    let msg = |n: usize| InboxMessage { source: "orders".into(), message_id: format!("m{n}"), message_type: format!("t{n}"), biz_key: format!("k{}", n % 5000), payload: format!(r#"{{"order": {n}, "amount": 12.5, "note": "some text of a typical size here"}}"#).into_bytes(), headers: vec![("trace".into(), format!("t{n}"))], rejected: None };
    for batch in [1usize, 100, 500] {
        let total = if batch == 1 { 2000 } else { 40_000 };
        let base = batch * 1_000_000;
        let t = Instant::now();
        for chunk in (0..total).collect::<Vec<_>>().chunks(batch) {
            let ms: Vec<InboxMessage> = chunk.iter().map(|n| msg(base + n)).collect();
            s.insert(&ms).await.unwrap();
        }
        let e = t.elapsed();
        println!("insert batch {batch:>4}: {total} msgs in {e:?} = {:.0}/s", total as f64 / e.as_secs_f64());
    }
    // Redelivery of the same (all duplicates).
    let t = Instant::now();
    for chunk in (0..40_000).collect::<Vec<_>>().chunks(500) {
        let ms: Vec<InboxMessage> = chunk.iter().map(|n| msg(500_000_000 + n)).collect();
        s.insert(&ms).await.unwrap();
    }
    println!("dup batch 500: {:?}", t.elapsed());
    {
        let mut conn = mysql_async::Conn::new(mysql_async::OptsBuilder::default().ip_or_hostname("127.0.0.1").tcp_port(33306).user(Some("outboxd")).pass(Some("outboxd")).db_name(Some("outboxd"))).await.unwrap();
        let hex = |b: &[u8]| { let mut o = String::from("CONVERT(X'"); for x in b { o.push_str(&format!("{x:02X}")); } o.push_str("' USING utf8mb4)"); o };
        let t = Instant::now();
        for chunk in (0..40_000usize).collect::<Vec<_>>().chunks(500) {
            let rows: Vec<String> = chunk.iter().map(|n| { let m = msg(900_000_000 + n); format!("({}, {}, {}, {}, {}, {}, 'PENDING', NULL, NULL)", hex(m.source.as_bytes()), hex(m.message_id.as_bytes()), hex(m.message_type.as_bytes()), hex(m.biz_key.as_bytes()), hex(&m.payload), hex(br#"{"trace":"x"}"#)) }).collect();
            let sql = format!("START TRANSACTION; INSERT INTO `inbox_{name}` (source, message_id, message_type, biz_key, payload, headers, status, last_error, next_retry_time) VALUES {} ON DUPLICATE KEY UPDATE id = id; SELECT id, source, message_id FROM `inbox_{name}` WHERE id >= LAST_INSERT_ID(); COMMIT", rows.join(", "));
            let mut r = conn.query_iter(sql).await.unwrap();
            while r.columns().is_some() || !r.is_empty() { let _ = r.collect::<mysql_async::Row>().await.unwrap(); }
        }
        let e = t.elapsed();
        println!("multi-row batch 500 + mapping select: 40000 in {e:?} = {:.0}/s", 40000.0 / e.as_secs_f64());
    }
    // Mark most DONE (history), then claim/complete loop.
    let mut sql = mysql_async::Conn::new(mysql_async::OptsBuilder::default().ip_or_hostname("127.0.0.1").tcp_port(33306).user(Some("outboxd")).pass(Some("outboxd")).db_name(Some("outboxd"))).await.unwrap();
    sql.query_drop(format!("UPDATE `inbox_{name}` SET status='DONE', processed_at=NOW(6) WHERE id % 20 <> 0")).await.unwrap();
    let t = Instant::now();
    let mut n = 0;
    loop {
        let claimed = s.claim(64).await.unwrap();
        if claimed.is_empty() { break; }
        for m in &claimed { s.complete(m, InboxOutcome::Done { statement: None }).await.unwrap(); n += 1; }
        if n >= 4000 { break; }
    }
    let e = t.elapsed();
    println!("claim(64)+complete: {n} msgs in {e:?} = {:.0}/s", n as f64 / e.as_secs_f64());
    let t = Instant::now();
    for _ in 0..20 { s.claim(64).await.unwrap(); }
    println!("claim latency ~{:?}", t.elapsed() / 20);
    let t = Instant::now();
    for _ in 0..20 { s.schedule().await.unwrap(); }
    println!("schedule latency ~{:?}", t.elapsed() / 20);
    sql.query_drop(format!("DROP TABLE `inbox_{name}`, `outbox_{name}`")).await.unwrap();
}
