//! The relay under exactly-once: Kafka transactions committed with the log position,
//! take-over and fencing, records refused inside a transaction.

use super::*;

/// Exactly-once: Kafka transactions end on source transaction boundaries, the checkpoint
/// row never passes what Kafka committed, and after a crash everything past the committed
/// position is sent again, a row the table shows SUCCESS included (its write-back may
/// precede a commit that never happened). A consumer of committed records sees each row
/// once.
#[tokio::test(start_paused = true)]
async fn exactly_once_commits_whole_transactions_and_resends_past_the_committed_position() {
    let h = Harness::exactly_once();
    let (mut link, _keys) = link();
    h.store
        .insert(&[(1, "A"), (2, "B"), (3, "C"), (4, "D"), (5, "E"), (6, "F")]);

    let (stop, shutdown) = watch::channel(false);
    let (mut stream, log, confirmed) = MemoryStream::new(Arc::clone(&h.store));
    let driver = async {
        log.commit(10, vec![event(1, "A"), event(2, "B")]);
        log.commit(20, vec![event(3, "C")]);
        wait_until("1-3 committed", || h.sink.committed_ids() == [1, 2, 3]).await;
        assert_eq!(h.sink.last_committed_position(), Some(lsn(20)));
        // A large transaction arrives in parts: nothing of it is committed while it is
        // open.
        log.part(25, vec![event(4, "D"), event(5, "E")]);
        wait_until("4 and 5 sent", || h.sink.sent_ids().len() == 5).await;
        // A negative: nothing is committed for five transaction intervals. No state to
        // wait on says "would have committed by now"; time passing is the condition.
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(h.sink.committed_ids(), [1, 2, 3]);
        stop.send_replace(true);
    };
    let (result, ()) = tokio::join!(h.session(&mut stream, &mut link, shutdown), driver);
    result.unwrap();
    assert!(h.store.checkpoint() <= h.sink.last_committed_position());
    assert_no_violations(&confirmed);

    // As if a write-back of row 4 had committed and its Kafka transaction had not.
    h.store.set_status(4, "SUCCESS");
    let (stop, shutdown) = watch::channel(false);
    let (mut stream, log, confirmed) = MemoryStream::new(Arc::clone(&h.store));
    let driver = async {
        // The log is read again from the checkpoint.
        log.commit(10, vec![event(1, "A"), event(2, "B")]);
        log.commit(20, vec![event(3, "C")]);
        log.part(25, vec![event(4, "D"), event(5, "E")]);
        log.commit(30, vec![event(6, "F")]);
        wait_until("30 committed", || {
            h.sink.last_committed_position() == Some(lsn(30))
        })
        .await;
        stop.send_replace(true);
    };
    let (result, ()) = tokio::join!(h.session(&mut stream, &mut link, shutdown), driver);
    result.unwrap();
    assert_eq!(
        h.sink.committed_ids(),
        [1, 2, 3, 4, 5, 6],
        "each row committed once"
    );
    for id in 1..=6 {
        assert_eq!(h.store.status(id), "SUCCESS", "row {id}");
    }
    assert!(h.store.checkpoint() <= Some(lsn(30)));
    assert_no_violations(&confirmed);
}

/// Exactly-once: a Kafka transaction holds whole source transactions, so one larger than
/// the in-flight bounds cannot be committed; the relay stops with a definite error that
/// names the way out instead of waiting forever.
#[tokio::test(start_paused = true)]
async fn exactly_once_stops_on_a_transaction_larger_than_the_in_flight_bounds() {
    let mut h = Harness::exactly_once();
    h.settings.delivery.max_in_flight = 3;
    let (mut link, _keys) = link();
    let (_stop, shutdown) = watch::channel(false);
    h.store.insert(&[(1, "A"), (2, "B"), (3, "C"), (4, "D")]);
    let (mut stream, log, _) = MemoryStream::new(Arc::clone(&h.store));
    log.part(10, vec![event(1, "A"), event(2, "B")]);
    log.part(10, vec![event(3, "C"), event(4, "D")]);
    let result = tokio::time::timeout(
        Duration::from_secs(5),
        h.session(&mut stream, &mut link, shutdown),
    )
    .await
    .expect("the session ends instead of waiting forever");
    let error = result.expect_err("a definite error").to_string();
    assert!(error.contains("delivery.max_in_flight"), "{error}");
    assert!(h.sink.committed_ids().is_empty());
}

/// Exactly-once: transactions read again below the committed position (a crash between a
/// commit and the next checkpoint write) send nothing and never move the committed
/// position back; a checkpoint row reset since the last commit (`recover`, another
/// server with lower positions) wins over the committed position, so nothing is skipped.
#[tokio::test(start_paused = true)]
async fn exactly_once_never_moves_the_committed_position_back_nor_skips_after_a_reset() {
    let h = Harness::exactly_once();
    let (mut link, _keys) = link();
    h.store
        .insert(&[(1, "A"), (2, "B"), (3, "C"), (4, "D"), (7, "E")]);

    let (stop, shutdown) = watch::channel(false);
    let (mut stream, log, _) = MemoryStream::new(Arc::clone(&h.store));
    let driver = async {
        log.commit(10, vec![event(1, "A")]);
        log.commit(20, vec![event(2, "B")]);
        log.commit(30, vec![event(3, "C")]);
        wait_until("30 committed", || {
            h.sink.last_committed_position() == Some(lsn(30))
        })
        .await;
        stop.send_replace(true);
    };
    let (result, ()) = tokio::join!(h.session(&mut stream, &mut link, shutdown), driver);
    result.unwrap();
    // The checkpoint row lags the committed position by one transaction at most.
    assert!(h.store.checkpoint() < Some(lsn(30)));
    assert_eq!(
        h.store.checkpoint(),
        h.sink.last_committed_checkpoint(),
        "each commit records what the checkpoint row shows"
    );

    // Read again from the checkpoint: 20 and 30 are below the committed position.
    let (stop, shutdown) = watch::channel(false);
    let (mut stream, log, _) = MemoryStream::new(Arc::clone(&h.store));
    let driver = async {
        log.commit(20, vec![event(2, "B")]);
        log.commit(30, vec![event(3, "C")]);
        log.commit(40, vec![event(4, "D")]);
        wait_until("40 committed", || {
            h.sink.last_committed_position() == Some(lsn(40))
        })
        .await;
        stop.send_replace(true);
    };
    let (result, ()) = tokio::join!(h.session(&mut stream, &mut link, shutdown), driver);
    result.unwrap();
    let positions = h.sink.commit_positions();
    assert!(
        positions.windows(2).all(|w| w[0] < w[1]),
        "the committed position never moves back: {positions:?}"
    );
    assert_eq!(h.sink.committed_ids(), [1, 2, 3, 4], "nothing sent twice");

    // `recover` on a new server: its positions start low again.
    h.store.reset_checkpoint(Some(lsn(5)));
    let (stop, shutdown) = watch::channel(false);
    let (mut stream, log, _) = MemoryStream::new(Arc::clone(&h.store));
    let driver = async {
        log.commit(7, vec![event(7, "E")]);
        wait_until("7 committed", || h.sink.committed_ids().contains(&7)).await;
        stop.send_replace(true);
    };
    let (result, ()) = tokio::join!(h.session(&mut stream, &mut link, shutdown), driver);
    result.unwrap();
    assert_eq!(h.store.status(7), "SUCCESS");
}

/// Exactly-once: a source transaction in parts that arrives when the window is almost
/// full is read to its end (it alone fits the bounds) and committed whole; no error.
#[tokio::test(start_paused = true)]
async fn exactly_once_reads_a_transaction_to_its_end_past_a_full_window() {
    let mut h = Harness::exactly_once();
    h.settings.delivery.max_in_flight = 4;
    h.settings.delivery.transaction_interval = Duration::from_secs(1);
    let (mut link, _keys) = link();
    let (stop, shutdown) = watch::channel(false);
    h.store.insert(&[
        (1, "A"),
        (2, "B"),
        (3, "C"),
        (4, "D"),
        (5, "E"),
        (6, "F"),
        (7, "G"),
    ]);
    let (mut stream, log, confirmed) = MemoryStream::new(Arc::clone(&h.store));
    log.commit(10, vec![event(1, "A"), event(2, "B"), event(3, "C")]);
    log.part(15, vec![event(4, "D"), event(5, "E")]);
    log.part(15, vec![event(6, "F")]);
    log.commit(20, vec![event(7, "G")]);
    let driver = async {
        wait_until("20 committed", || {
            h.sink.last_committed_position() == Some(lsn(20))
        })
        .await;
        stop.send_replace(true);
    };
    let (result, ()) = tokio::join!(h.session(&mut stream, &mut link, shutdown), driver);
    result.unwrap();
    assert_eq!(h.sink.committed_ids(), [1, 2, 3, 4, 5, 6, 7]);
    assert_no_violations(&confirmed);
}

/// Exactly-once: records count as published once their Kafka transaction commits, not
/// when their statuses are written (a commit that fails publishes nothing).
#[tokio::test(start_paused = true)]
async fn exactly_once_counts_published_records_only_once_committed() {
    let h = Harness::exactly_once();
    let (mut stream, log, _confirmed) = MemoryStream::new(Arc::clone(&h.store));
    let (mut link, _keys) = link();
    let (_stop, shutdown) = watch::channel(false);
    h.store.insert(&[(1, "A"), (2, "B")]);
    h.sink.fail_commits(true);
    log.commit(10, vec![event(1, "A"), event(2, "B")]);
    let error = h
        .session(&mut stream, &mut link, shutdown)
        .await
        .expect_err("the commit fails");
    assert!(matches!(error, PipelineError::SinkFailed(_)), "{error}");
    assert_eq!(h.sink.committed_ids(), Vec::<i64>::new());
    assert_eq!(
        h.stats.published.load(std::sync::atomic::Ordering::Relaxed),
        0,
        "nothing committed, nothing published"
    );
    assert_eq!(
        h.stats.metrics.published_of("memory.test.event"),
        0,
        "nor counted in the topic's outboxd_events_published_total"
    );

    h.sink.fail_commits(false);
    let (stop, shutdown) = watch::channel(false);
    let (mut stream, log, _confirmed) = MemoryStream::new(Arc::clone(&h.store));
    let driver = async {
        log.commit(10, vec![event(1, "A"), event(2, "B")]);
        wait_until("1-2 committed", || h.sink.committed_ids() == [1, 2]).await;
        stop.send_replace(true);
    };
    let (result, ()) = tokio::join!(h.session(&mut stream, &mut link, shutdown), driver);
    result.unwrap();
    assert_eq!(
        h.stats.published.load(std::sync::atomic::Ordering::Relaxed),
        2
    );
    assert_eq!(h.stats.metrics.published_of("memory.test.event"), 2);
}

/// Exactly-once: a row the table shows SUCCESS is sent again when its transaction is past
/// the committed position (its write-back preceded a commit that never happened), and then
/// takes the new record's offset: the old one is in the aborted Kafka transaction.
#[tokio::test(start_paused = true)]
async fn exactly_once_gives_a_row_sent_again_its_new_position() {
    let h = Harness::exactly_once();
    let (mut stream, log, _confirmed) = MemoryStream::new(Arc::clone(&h.store));
    let (mut link, _keys) = link();
    let (stop, shutdown) = watch::channel(false);
    h.store.insert(&[(1, "A")]);
    h.store.set_delivered(1, 1_000);
    let driver = async {
        log.commit(10, vec![event(1, "A")]);
        wait_until("1 committed", || h.sink.committed_ids() == [1]).await;
        stop.send_replace(true);
    };
    let (result, ()) = tokio::join!(h.session(&mut stream, &mut link, shutdown), driver);
    result.unwrap();
    assert_eq!(h.store.status(1), "SUCCESS");
    let offset = h.store.offset(1);
    assert!(
        offset.is_some_and(|o| o != 1_000),
        "the resent record's offset, not the aborted one: {offset:?}"
    );
}

/// Exactly-once take-over: the old instance, not fenced yet, commits its last window and
/// writes the checkpoint row after this session opened the log. The new session fences
/// before it reads the checkpoint, so it sees that window and sends nothing of it again
/// (read first, the stale checkpoint would not match the record, and every transaction
/// after it would be sent again: duplicates for a `read_committed` consumer).
#[tokio::test(start_paused = true)]
async fn exactly_once_fences_the_old_instance_before_reading_the_checkpoint() {
    let h = Harness::exactly_once();
    let (mut link, _keys) = link();
    h.store.insert(&[(1, "A"), (2, "B"), (3, "C"), (4, "D")]);
    // Both instances saw transactions through 10 committed and checkpointed. Then the
    // old one, not fenced yet, committed two more windows (20, then 30) in Kafka and
    // moved the checkpoint row to 30: the row moves at the fencing, the record was last
    // written by the old instance's commit of 30.
    h.store.reset_checkpoint(Some(lsn(10)));
    h.sink.set_committed_position(CommittedPosition {
        position: lsn(30),
        checkpoint: Some(lsn(20)),
    });
    let store = Arc::clone(&h.store);
    h.sink.before_fencing(move || {
        store.set_status(2, "SUCCESS");
        store.set_status(3, "SUCCESS");
        store.reset_checkpoint(Some(lsn(30)));
    });
    let (stop, shutdown) = watch::channel(false);
    let (mut stream, log, confirmed) = MemoryStream::new(Arc::clone(&h.store));
    let driver = async {
        // The log from the slot's confirmed position (10): the old instance's windows
        // come again, then a new transaction.
        log.commit(20, vec![event(2, "B")]);
        log.commit(30, vec![event(3, "C")]);
        log.commit(40, vec![event(4, "D")]);
        wait_until("40 committed", || {
            h.sink.last_committed_position() == Some(lsn(40))
        })
        .await;
        stop.send_replace(true);
    };
    let (result, ()) = tokio::join!(h.session(&mut stream, &mut link, shutdown), driver);
    result.unwrap();
    assert_eq!(
        h.sink.committed_ids(),
        [4],
        "the old instance's committed windows are not sent again"
    );
    assert_no_violations(&confirmed);
}

/// Issue 26, finding 1. Exactly-once under strict ordering: a window holds row 1 (key K,
/// acknowledged) and row 2 (K, refused before it was sent: MANUAL_REQUIRED); its
/// write-back shows 1 SUCCESS and 2 MANUAL_REQUIRED, then the Kafka commit fails, so row
/// 1's record is in an aborted transaction. The next session holds K back (row 2) and
/// parks row 1 when it reads it again: the park must take the SUCCESS row (its record was
/// never committed), or row 1 stays SUCCESS with the offset of an aborted record while
/// the committed position moves past it, and a `read_committed` consumer never sees it.
/// Parked, row 1 is the earliest row of K in trouble, so the claim worker sends it first.
#[tokio::test(start_paused = true)]
async fn exactly_once_parks_a_row_whose_success_was_in_an_aborted_transaction() {
    let h = Harness::exactly_once();
    let (mut link, _keys) = link();
    h.store.insert(&[(1, "K"), (2, "K"), (3, "L")]);
    let refused = || {
        let mut bad = event(2, "K");
        bad.rejected = Some("cannot be published: column `message_type` is NULL".into());
        bad
    };

    // Session 1: the write-back happens, the commit fails.
    h.sink.fail_commits(true);
    let (_stop, shutdown) = watch::channel(false);
    let (mut stream, log, _) = MemoryStream::new(Arc::clone(&h.store));
    log.commit(10, vec![event(1, "K"), refused()]);
    let error = h
        .session(&mut stream, &mut link, shutdown)
        .await
        .expect_err("the commit fails");
    assert!(matches!(error, PipelineError::SinkFailed(_)), "{error}");
    assert_eq!(
        [1, 2].map(|id| h.store.status(id)),
        ["SUCCESS", "MANUAL_REQUIRED"],
        "written back before the commit that failed"
    );
    assert!(h.sink.committed_ids().is_empty());

    // Session 2: the log is read again from the committed position (none).
    h.sink.fail_commits(false);
    let (stop, shutdown) = watch::channel(false);
    let (mut stream, log, confirmed) = MemoryStream::new(Arc::clone(&h.store));
    let driver = async {
        log.commit(10, vec![event(1, "K"), refused()]);
        log.commit(20, vec![event(3, "L")]);
        wait_until("20 committed", || {
            h.sink.last_committed_position() == Some(lsn(20))
        })
        .await;
        stop.send_replace(true);
    };
    let (result, ()) = tokio::join!(h.session(&mut stream, &mut link, shutdown), driver);
    result.unwrap();
    assert_no_violations(&confirmed);
    let committed = h.sink.committed_ids();
    for id in 1..=3 {
        assert!(
            h.store.status(id) != "SUCCESS" || committed.contains(&id),
            "row {id} is SUCCESS but its record is in no committed transaction \
             (committed: {committed:?}); the position moved past it, so it is lost"
        );
    }
    let row = h.store.row(1).expect("row 1");
    assert_eq!(row.status, "FAILED", "parked behind row 2");
    assert!(
        row.last_error
            .as_deref()
            .is_some_and(|e| e.starts_with("parked: an earlier event of biz_key `K`")),
        "{:?}",
        row.last_error
    );
    assert_eq!(row.offset, None, "no offset of an aborted record");
    assert_eq!(h.store.status(2), "MANUAL_REQUIRED");
    assert_eq!(committed, [3]);
}

/// Runs sessions carrying what each leaves to the next (as `relay::run` does), each
/// reading the log again with `feed`, until one commits through `lsn(end)` (and is
/// stopped) or `max` sessions have failed; returns the failures, in order.
async fn sessions_until_committed(
    h: &Harness,
    link: &mut RetryLink,
    carried: &mut Unwritten,
    feed: impl Fn(&crate::testing::LogWriter),
    end: u64,
    max: usize,
) -> Vec<PipelineError> {
    let mut errors = Vec::new();
    while errors.len() < max {
        let (stop, shutdown) = watch::channel(false);
        let (mut stream, log, confirmed) = MemoryStream::new(Arc::clone(&h.store));
        feed(&log);
        let ended = std::sync::atomic::AtomicBool::new(false);
        let session = async {
            let result = h
                .session_carrying(&mut stream, link, shutdown, carried)
                .await;
            ended.store(true, std::sync::atomic::Ordering::SeqCst);
            result
        };
        let driver = async {
            wait_until("committed through the end, or the session ended", || {
                h.sink.last_committed_position() == Some(lsn(end))
                    || ended.load(std::sync::atomic::Ordering::SeqCst)
            })
            .await;
            stop.send_replace(true);
        };
        let (result, ()) = tokio::join!(session, driver);
        assert_no_violations(&confirmed);
        match result {
            Ok(()) => return errors,
            Err(e) => errors.push(e),
        }
    }
    errors
}

/// Issue 26, finding 2. Exactly-once: inside a Kafka transaction a record the broker
/// refuses for good (larger than the topic's `max.message.bytes`) dooms the transaction,
/// and a session that sent it again every time would abort every time, forever. The
/// record's row becomes FAILED (with the broker's reason, an attempt counted) outside
/// the aborted transaction instead: the next session writes it before it reads and does
/// not send it in a transaction again; the rest of the window is sent again and
/// committed; under strict ordering its key's later rows are parked behind it. Nothing
/// of the aborted window is written SUCCESS. The claim worker then retries the row like
/// any FAILED row (at least once), up to MANUAL_REQUIRED.
#[tokio::test(start_paused = true)]
async fn exactly_once_a_record_the_broker_refuses_becomes_failed_outside_the_transaction() {
    for ordering in [KeyOrdering::Strict, KeyOrdering::Relaxed] {
        let mut h = Harness::exactly_once();
        h.settings.ordering = ordering;
        let (mut link, _keys) = link();
        h.store.insert(&[(1, "K"), (2, "L"), (3, "M"), (4, "L")]);
        h.sink.fail_id(2, FailureKind::Rejected);
        let feed = |log: &crate::testing::LogWriter| {
            log.commit(10, vec![event(1, "K"), event(2, "L")]);
            log.commit(20, vec![event(3, "M")]);
            log.commit(30, vec![event(4, "L")]);
        };
        let mut carried = Unwritten::default();

        let errors = sessions_until_committed(&h, &mut link, &mut carried, feed, 30, 1).await;
        assert_eq!(errors.len(), 1, "{ordering:?}: the first session ends");
        for id in [1, 3, 4] {
            assert_ne!(
                h.store.status(id),
                "SUCCESS",
                "{ordering:?}: row {id} written SUCCESS by a window that cannot commit"
            );
        }
        assert!(h.sink.committed_ids().is_empty());

        let more = sessions_until_committed(&h, &mut link, &mut carried, feed, 30, 2).await;
        assert!(
            more.is_empty(),
            "{ordering:?}: the refused record stops the relay: {}",
            more.iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(" / ")
        );
        let error = &errors[0];
        assert!(error.is_transient(), "{ordering:?}: {error}");
        let text = error.to_string();
        assert!(
            text.contains("m-2") && text.contains("Rejected failure of row 2"),
            "{ordering:?}: names the row and the broker's reason: {text}"
        );
        let sent_2 = h.sink.sent_ids().iter().filter(|id| **id == 2).count();
        assert_eq!(
            sent_2, 1,
            "{ordering:?}: row 2 sent in one transaction only"
        );
        let refused = h.store.row(2).expect("row 2");
        assert_eq!(
            (refused.status, refused.retry_count),
            ("FAILED", 1),
            "{ordering:?}"
        );
        assert!(
            refused
                .last_error
                .as_deref()
                .is_some_and(|e| e.contains("Rejected failure of row 2")),
            "{ordering:?}: {:?}",
            refused.last_error
        );
        match ordering {
            KeyOrdering::Strict => {
                assert_eq!(h.sink.committed_ids(), [1, 3]);
                assert_eq!(h.store.status(4), "FAILED", "parked behind row 2");
            }
            KeyOrdering::Relaxed => {
                assert_eq!(h.sink.committed_ids(), [1, 3, 4]);
                assert_eq!(h.store.status(4), "SUCCESS");
            }
        }
        for id in [1, 3] {
            assert_eq!(h.store.status(id), "SUCCESS", "{ordering:?}: row {id}");
        }
    }
}
