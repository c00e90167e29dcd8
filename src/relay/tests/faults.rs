//! The sink or the store failing under the relay: fatal producers, stuck producers,
//! write-backs that fail, shutdown deadlines.

use super::*;

#[tokio::test(start_paused = true)]
async fn shutdown_writes_back_in_flight_deliveries_before_it_returns() {
    let h = Harness::new(Duration::from_secs(5));
    let (mut stream, log, confirmed) = MemoryStream::new(Arc::clone(&h.store));
    let (mut link, _keys) = link();
    let (stop, shutdown) = watch::channel(false);
    h.store.insert(&[(1, "A"), (2, "B"), (3, "A")]);
    h.sink.hold();

    let driver = async {
        log.commit(10, vec![event(1, "A"), event(2, "B")]);
        log.commit(20, vec![event(3, "A")]);
        wait_until("three in flight", || h.sink.held() == [1, 2, 3]).await;
        stop.send_replace(true);
        tokio::time::sleep(Duration::from_millis(20)).await;
        // Out of log order: the checkpoint still waits for the whole prefix.
        for id in [3, 2, 1] {
            assert!(h.sink.complete(id));
        }
    };
    let (result, ()) = tokio::join!(h.session(&mut stream, &mut link, shutdown), driver);
    result.unwrap();
    for id in [1, 2, 3] {
        assert_eq!(h.store.status(id), "SUCCESS", "row {id}");
    }
    assert_eq!(h.store.checkpoint(), Some(lsn(20)));
    assert_eq!(last_confirmed(&confirmed), Some(lsn(20)));
    assert_no_violations(&confirmed);
}

#[tokio::test(start_paused = true)]
async fn past_the_shutdown_deadline_unacknowledged_rows_stay_unconfirmed() {
    let h = Harness::new(Duration::from_millis(100));
    let (mut stream, log, confirmed) = MemoryStream::new(Arc::clone(&h.store));
    let (mut link, _keys) = link();
    let (stop, shutdown) = watch::channel(false);
    h.store.insert(&[(1, "A"), (2, "B")]);
    h.sink.hold();

    let driver = async {
        log.commit(10, vec![event(1, "A")]);
        log.commit(20, vec![event(2, "B")]);
        wait_until("two in flight", || h.sink.held() == [1, 2]).await;
        assert!(h.sink.complete(1));
        wait_until("10 confirmed", || {
            last_confirmed(&confirmed) == Some(lsn(10))
        })
        .await;
        stop.send_replace(true);
    };
    let started = Instant::now();
    let (result, ()) = tokio::join!(h.session(&mut stream, &mut link, shutdown), driver);
    result.unwrap();
    assert!(started.elapsed() < Duration::from_secs(3));
    assert_eq!(h.store.status(1), "SUCCESS");
    assert_eq!(
        h.store.status(2),
        "INIT",
        "read again from the log on restart"
    );
    assert_eq!(h.store.checkpoint(), Some(lsn(10)));
    assert_eq!(last_confirmed(&confirmed), Some(lsn(10)));
    assert_no_violations(&confirmed);
}

#[tokio::test(start_paused = true)]
async fn a_fatal_sink_error_leaves_its_row_unwritten_and_ends_the_session_for_a_rebuild() {
    let h = Harness::new(Duration::from_secs(5));
    let (mut stream, log, confirmed) = MemoryStream::new(Arc::clone(&h.store));
    let (mut link, _keys) = link();
    let (_stop, shutdown) = watch::channel(false);
    h.store.insert(&[(1, "A"), (2, "B"), (3, "C"), (4, "D")]);
    h.sink.fail_id(2, FailureKind::Fatal);
    h.sink.hold();

    let driver = async {
        log.commit(10, vec![event(1, "A")]);
        log.commit(20, vec![event(2, "B")]);
        log.commit(30, vec![event(3, "C")]);
        wait_until("three in flight", || h.sink.held() == [1, 2, 3]).await;
        assert!(h.sink.complete(2));
        wait_until("row 2's fatal outcome taken", || {
            h.stats.in_flight.load(std::sync::atomic::Ordering::Relaxed) == 2
        })
        .await;
        // The session reads no more once the sink is unusable.
        log.commit(40, vec![event(4, "D")]);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(h.sink.complete(1));
        assert!(h.sink.complete(3));
    };
    let (result, ()) = tokio::join!(h.session(&mut stream, &mut link, shutdown), driver);
    match result {
        Err(e @ PipelineError::SinkFailed(_)) => {
            assert!(e.to_string().contains("row 2"), "{e}");
            assert!(e.is_transient(), "a new session follows: {e}");
        }
        other => panic!("expected SinkFailed, got {other:?}"),
    }
    assert_eq!(h.sink.sent_ids(), [1, 2, 3]);
    // Row 2 is not to blame: no attempt is counted, it stays INIT and holds the
    // checkpoint, so the next session reads it from the log and sends it again.
    assert_eq!(
        [1, 2, 3, 4].map(|id| h.store.status(id)),
        ["SUCCESS", "INIT", "SUCCESS", "INIT"]
    );
    assert_eq!(h.store.row(2).unwrap().retry_count, 0);
    assert_eq!(h.store.checkpoint(), Some(lsn(10)));
    assert_no_violations(&confirmed);
}

/// The database restarts while Kafka acknowledges: the write-back fails, the session
/// drains what is in flight and ends, and the next session writes those outcomes before it
/// reads. The transaction read again sends only what was never acknowledged.
#[tokio::test(start_paused = true)]
async fn outcomes_a_failed_write_back_held_are_written_by_the_next_session_not_resent() {
    let h = Harness::new(Duration::from_secs(5));
    let (mut link, _keys) = link();
    let (_stop, shutdown) = watch::channel(false);
    h.store.insert(&[(1, "A"), (2, "B"), (3, "C"), (4, "D")]);
    h.sink.hold();
    let mut carried = Unwritten::default();

    // Session 1: rows 1 and 2 are acknowledged while the database is down.
    let (mut stream, log, _) = MemoryStream::new(Arc::clone(&h.store));
    let driver = async {
        log.commit(10, vec![event(1, "A"), event(2, "B"), event(3, "C")]);
        wait_until("three in flight", || h.sink.held() == [1, 2, 3]).await;
        h.store.set_unavailable(true);
        assert!(h.sink.complete(1));
        assert!(h.sink.complete(2));
        // Row 3 is still in flight when the write-back fails; the session drains it.
        wait_until("a write-back refused", || h.store.refused_write_backs() > 0).await;
        assert!(h.sink.complete(3));
    };
    let (result, ()) = tokio::join!(
        h.session_carrying(&mut stream, &mut link, shutdown.clone(), &mut carried),
        driver
    );
    let error = result.expect_err("the write-back failed");
    assert!(error.is_transient(), "{error}");
    assert_eq!(
        [1, 2, 3].map(|id| h.store.status(id)),
        ["INIT", "INIT", "INIT"]
    );

    // Session 2: the database is back; the transaction is read again from the log.
    h.store.set_unavailable(false);
    let (stop, shutdown) = watch::channel(false);
    let (mut stream, log, confirmed) = MemoryStream::new(Arc::clone(&h.store));
    let driver = async {
        log.commit(10, vec![event(1, "A"), event(2, "B"), event(3, "C")]);
        log.commit(20, vec![event(4, "D")]);
        wait_until("row 4 in flight", || h.sink.held() == [4]).await;
        assert!(h.sink.complete(4));
        wait_until("20 confirmed", || {
            last_confirmed(&confirmed) == Some(lsn(20))
        })
        .await;
        stop.send_replace(true);
    };
    let (result, ()) = tokio::join!(
        h.session_carrying(&mut stream, &mut link, shutdown, &mut carried),
        driver
    );
    result.unwrap();
    assert_eq!(
        h.sink.sent_ids(),
        [1, 2, 3, 4],
        "rows acknowledged while the database was down are not sent again"
    );
    for id in 1..=4 {
        assert_eq!(h.store.status(id), "SUCCESS", "row {id}");
    }
    assert_no_violations(&confirmed);
}

/// Once a fresh client reaches the brokers again, a stuck producer is rebuilt at the
/// second healthy look, `stuck_after` after the first: within two `stuck_after`s and one
/// stall interval (the timer's) of the return, with the settings `run` derives from
/// `kafka.message_timeout` (30 s, the default). Before, `stuck_after` was three times as
/// long, and a look that took a moment missed every other tick. Tokio's paused clock; the
/// memory sink's look takes 50 ms of it.
#[tokio::test(start_paused = true)]
async fn a_stuck_producer_is_rebuilt_soon_after_the_brokers_answer() {
    let mut h = Harness::new(Duration::from_secs(5));
    h.settings.stall_warning = Duration::from_secs(30);
    h.settings.stuck_after = crate::relay::stuck_after(h.settings.stall_warning);
    let (mut link, _keys) = link();
    h.store.insert(&[(1, "K")]);
    h.sink.hold();
    h.sink.set_unreachable(true);
    let (stop, shutdown) = watch::channel(false);
    let (mut stream, log, _confirmed) = MemoryStream::new(Arc::clone(&h.store));
    let driver = async {
        log.commit(10, vec![event(1, "K")]);
        wait_until("one in flight", || h.sink.held() == [1]).await;
        tokio::time::sleep(h.settings.stuck_after * 3).await;
        h.sink.set_unreachable(false);
        let back = tokio::time::Instant::now();
        while h.sink.rebuilds() == 0 && back.elapsed() < Duration::from_secs(600) {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        // Ends the session however the test went (it ends by itself after a rebuild).
        stop.send_replace(true);
        back.elapsed()
    };
    let (result, took) = tokio::join!(h.session(&mut stream, &mut link, shutdown), driver);
    assert_eq!(h.sink.rebuilds(), 1, "{result:?}");
    let bound = h.settings.stuck_after * 2 + h.settings.stall_warning;
    assert!(
        took <= bound,
        "rebuilt {took:?} after the brokers answered, more than {bound:?}"
    );
}

/// Records wait with no acknowledgement (a producer stuck after a broker came back
/// fenced): while a fresh client cannot reach the destination either, the session keeps
/// waiting (strict ordering); once it can, the producer is rebuilt after `stuck_after`,
/// its records fail Fatal (rows INIT, no attempt counted, the position held), the session
/// ends, and the next one sends them again in order. Tokio's paused clock: no real waits.
#[tokio::test(start_paused = true)]
async fn a_stuck_producer_is_rebuilt_once_a_fresh_client_reaches_the_brokers() {
    let h = Harness::new(Duration::from_secs(5));
    let (mut link, _keys) = link();
    h.store.insert(&[(1, "K"), (2, "K"), (3, "L")]);
    h.sink.hold();
    h.sink.set_unreachable(true);

    let (_stop, shutdown) = watch::channel(false);
    let (mut stream, log, confirmed) = MemoryStream::new(Arc::clone(&h.store));
    let driver = async {
        log.commit(10, vec![event(1, "K")]);
        log.commit(20, vec![event(2, "K"), event(3, "L")]);
        wait_until("three in flight", || h.sink.held() == [1, 2, 3]).await;
        // Twice `stuck_after` with the brokers away too: nothing is rebuilt.
        tokio::time::sleep(h.settings.stuck_after * 2).await;
        assert_eq!(
            h.sink.rebuilds(),
            0,
            "the destination is away: keep waiting"
        );
        assert_eq!(h.sink.held(), [1, 2, 3], "still waiting, in order");
        // The brokers answer a fresh client; the producer still acknowledges nothing: a
        // first healthy look gives it time, the second rebuilds it.
        h.sink.set_unreachable(false);
        tokio::time::sleep(h.settings.stuck_after * 3).await;
    };
    let (result, ()) = tokio::join!(h.session(&mut stream, &mut link, shutdown), driver);
    match result {
        Err(e @ PipelineError::SinkFailed(_)) => assert!(e.is_transient(), "{e}"),
        other => panic!("expected SinkFailed after the rebuild, got {other:?}"),
    }
    assert_eq!(h.sink.rebuilds(), 1);
    assert_eq!(
        h.stats
            .producer_rebuilds
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    assert_eq!([1, 2, 3].map(|id| h.store.status(id)), ["INIT"; 3]);
    assert_eq!(h.store.row(1).unwrap().retry_count, 0, "no attempt counted");
    assert_eq!(h.store.checkpoint(), None, "the position is held");
    assert_no_violations(&confirmed);

    // The next session reads them again and sends them, in order.
    let (stop, shutdown) = watch::channel(false);
    let (mut stream, log, confirmed) = MemoryStream::new(Arc::clone(&h.store));
    let driver = async {
        log.commit(10, vec![event(1, "K")]);
        log.commit(20, vec![event(2, "K"), event(3, "L")]);
        wait_until("20 confirmed", || {
            last_confirmed(&confirmed) == Some(lsn(20))
        })
        .await;
        stop.send_replace(true);
    };
    let (result, ()) = tokio::join!(h.session(&mut stream, &mut link, shutdown), driver);
    result.unwrap();
    let sent = h.sink.sent_ids();
    assert_eq!(&sent[3..], [1, 2, 3], "sent again in order");
    assert_eq!([1, 2, 3].map(|id| h.store.status(id)), ["SUCCESS"; 3]);
}

/// Issue 26, finding 3. Strict ordering: row 1 (key K) fails, row 2 (K) is parked behind
/// it, and the write-back holding both fails (the database went away). The next session
/// writes what the first could not before it reads: were row 2's park carried without
/// row 1's failure, row 2 would be FAILED and due while row 1 is still INIT, and the
/// claim worker (which takes a key's earliest row in trouble) would send 2 before the
/// relay reads 1 again and parks it. Carried together, row 1 is FAILED first, holds K
/// back when it is read again (so the relay does not send it a second time), and the
/// claim worker sends 1, then 2.
#[tokio::test(start_paused = true)]
async fn a_carried_park_never_comes_due_before_the_failure_behind_it() {
    let h = Harness::new(Duration::from_secs(5));
    let (mut link, _keys) = link();
    h.store.insert(&[(1, "K"), (2, "K")]);
    h.sink.fail_id(1, FailureKind::Retryable);
    let mut carried = Unwritten::default();

    // Session 1: row 1 fails, row 2 is parked, and the database is down.
    h.store.set_unavailable(true);
    let (_stop, shutdown) = watch::channel(false);
    let (mut stream, log, _) = MemoryStream::new(Arc::clone(&h.store));
    log.commit(10, vec![event(1, "K")]);
    log.commit(20, vec![event(2, "K")]);
    let error = h
        .session_carrying(&mut stream, &mut link, shutdown, &mut carried)
        .await
        .expect_err("the write-back fails");
    assert!(error.is_transient(), "{error}");
    assert_eq!(h.stats.parked.load(std::sync::atomic::Ordering::Relaxed), 1);
    assert_eq!([1, 2].map(|id| h.store.status(id)), ["INIT", "INIT"]);

    // Session 2: the database is back; the carried outcomes are written before it reads.
    h.store.set_unavailable(false);
    h.sink.heal();
    let (stop, shutdown) = watch::channel(false);
    let (mut stream, log, confirmed) = MemoryStream::new(Arc::clone(&h.store));
    let driver = async {
        wait_until("the carried outcomes written", || {
            h.store.status(2) != "INIT"
        })
        .await;
        assert_ne!(
            h.store.status(1),
            "INIT",
            "row 2 is FAILED and due while row 1, before it, is INIT: the claim worker \
             would send 2 before the relay reads 1 again"
        );
        log.commit(10, vec![event(1, "K")]);
        log.commit(20, vec![event(2, "K")]);
        wait_until("20 confirmed", || {
            last_confirmed(&confirmed) == Some(lsn(20))
        })
        .await;
        stop.send_replace(true);
    };
    let (result, ()) = tokio::join!(
        h.session_carrying(&mut stream, &mut link, shutdown, &mut carried),
        driver
    );
    result.unwrap();
    assert_no_violations(&confirmed);
    assert_eq!(
        h.sink.sent_ids(),
        [1],
        "read again, row 1 waits for the claim worker instead of being sent twice"
    );
    let first = h.store.row(1).expect("row 1");
    assert_eq!((first.status, first.retry_count), ("FAILED", 1));
    assert!(
        first
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("Retryable failure of row 1")),
        "{:?}",
        first.last_error
    );
    assert_eq!(h.store.status(2), "FAILED");
}

/// A database that stops answering (a network black hole: no error, no close) during a
/// write-back: after `delivery.store_timeout` the session ends with a transient error
/// instead of waiting on the silent connection for as long as the silence lasts, and the
/// next session writes the outcomes it held without sending their rows again. Tokio's
/// paused clock: the minute passes at once.
#[tokio::test(start_paused = true)]
async fn a_write_back_the_database_never_answers_ends_the_session_after_store_timeout() {
    let h = Harness::new(Duration::from_secs(5));
    let (mut link, _keys) = link();
    let (_stop, shutdown) = watch::channel(false);
    h.store.insert(&[(1, "A"), (2, "B")]);
    let mut carried = Unwritten::default();

    let (mut stream, log, _) = MemoryStream::new(Arc::clone(&h.store));
    h.store.hold_write_backs(true);
    let started = tokio::time::Instant::now();
    let driver = async {
        log.commit(10, vec![event(1, "A"), event(2, "B")]);
    };
    let (result, ()) = tokio::join!(
        h.session_carrying(&mut stream, &mut link, shutdown.clone(), &mut carried),
        driver
    );
    let error = result.expect_err("the silent write-back ends the session");
    assert!(error.is_transient(), "{error}");
    assert!(error.to_string().contains("store_timeout"), "{error}");
    let waited = started.elapsed();
    let limit = h.settings.delivery.store_timeout;
    assert!(
        waited >= limit && waited < limit + Duration::from_secs(10),
        "ended {waited:?} after the start, store_timeout {limit:?}"
    );
    assert_eq!([1, 2].map(|id| h.store.status(id)), ["INIT", "INIT"]);

    // The database answers again: the next session writes what the first one held.
    h.store.hold_write_backs(false);
    let (stop, shutdown) = watch::channel(false);
    let (mut stream, log, confirmed) = MemoryStream::new(Arc::clone(&h.store));
    let driver = async {
        log.commit(10, vec![event(1, "A"), event(2, "B")]);
        wait_until("10 confirmed", || {
            last_confirmed(&confirmed) == Some(lsn(10))
        })
        .await;
        stop.send_replace(true);
    };
    let (result, ()) = tokio::join!(
        h.session_carrying(&mut stream, &mut link, shutdown, &mut carried),
        driver
    );
    result.unwrap();
    assert_eq!(
        h.sink.sent_ids(),
        [1, 2],
        "acknowledged rows are not sent again"
    );
    assert_eq!([1, 2].map(|id| h.store.status(id)), ["SUCCESS", "SUCCESS"]);
    assert_no_violations(&confirmed);
}
