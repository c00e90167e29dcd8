//! `outbox.rows = "deleted"`: no row to write a status to, so the position holds at a
//! record that is not delivered.

use super::*;

/// `outbox.rows = "deleted"`: nothing but the checkpoint is written back, and a record
/// that is not delivered (no row to mark FAILED) ends the session with the position held
/// before its transaction; the next session reads it again and sends it, then the rest,
/// in order.
#[tokio::test(start_paused = true)]
async fn deleted_rows_hold_the_position_at_a_failed_record_and_the_next_session_sends_it() {
    let mut h = Harness::new(Duration::from_secs(2));
    h.settings.rows = outboxd_connector::RowLifecycle::Deleted;
    let (mut link, _keys) = link();
    h.sink.fail_id(2, FailureKind::Retryable);

    // Session 1: row 2 fails; row 1's transaction is confirmed, row 2's is not.
    let (_stop, shutdown) = watch::channel(false);
    let (mut stream, log, confirmed) = MemoryStream::new(Arc::clone(&h.store));
    log.commit(10, vec![event(1, "A")]);
    log.commit(20, vec![event(2, "A")]);
    log.commit(30, vec![event(3, "B")]);
    let error = h
        .session(&mut stream, &mut link, shutdown)
        .await
        .expect_err("the session ends on the failed record");
    assert!(matches!(error, PipelineError::NotDelivered(_)), "{error}");
    assert!(error.is_transient(), "a new session follows: {error}");
    assert!(
        h.store.checkpoint() <= Some(lsn(10)),
        "{:?}",
        h.store.checkpoint()
    );
    assert!(last_confirmed(&confirmed) <= Some(lsn(10)));
    assert_eq!(h.store.status(1), "absent", "no row is written");
    assert_no_violations(&confirmed);

    // Session 2: the topic exists now; read again from the held position.
    h.sink.heal();
    let (stop, shutdown) = watch::channel(false);
    let (mut stream, log, confirmed) = MemoryStream::new(Arc::clone(&h.store));
    let driver = async {
        log.commit(20, vec![event(2, "A")]);
        log.commit(30, vec![event(3, "B")]);
        wait_until("30 confirmed", || {
            last_confirmed(&confirmed) == Some(lsn(30))
        })
        .await;
        stop.send_replace(true);
    };
    let (result, ()) = tokio::join!(h.session(&mut stream, &mut link, shutdown), driver);
    result.unwrap();
    let sent = h.sink.sent_ids();
    let resent = &sent[sent.iter().rposition(|id| *id == 2).unwrap()..];
    assert_eq!(
        resent,
        [2, 3],
        "sent again from the held position, in order"
    );
    assert_eq!(h.store.checkpoint(), Some(lsn(30)));
}

/// `outbox.rows = "deleted"`: an event that can never be sent has no row to become
/// MANUAL_REQUIRED, so the relay stops before it (a definite error naming it) instead of
/// skipping it, and sends nothing after it.
#[tokio::test(start_paused = true)]
async fn deleted_rows_stop_before_an_event_that_can_never_be_sent() {
    let mut h = Harness::new(Duration::from_secs(2));
    h.settings.rows = outboxd_connector::RowLifecycle::Deleted;
    let (mut link, _keys) = link();
    let (_stop, shutdown) = watch::channel(false);
    let (mut stream, log, confirmed) = MemoryStream::new(Arc::clone(&h.store));
    let mut bad = event(2, "K");
    bad.rejected = Some("cannot be published: column `type` is NULL".into());
    log.commit(10, vec![event(1, "K")]);
    log.commit(20, vec![bad, event(3, "L")]);
    log.commit(30, vec![event(4, "M")]);
    let error = h
        .session(&mut stream, &mut link, shutdown)
        .await
        .expect_err("the relay stops");
    assert!(!error.is_transient(), "{error}");
    assert!(
        error.to_string().contains("column `type` is NULL"),
        "the reason is named: {error}"
    );
    assert_eq!(h.sink.sent_ids(), [1], "nothing after it is sent");
    assert!(last_confirmed(&confirmed) <= Some(lsn(10)));
    assert_no_violations(&confirmed);
}

/// `outbox.rows = "deleted"`: a record the destination refuses for good (too large,
/// invalid) would fail the same way every session: the relay stops before it.
#[tokio::test(start_paused = true)]
async fn deleted_rows_stop_at_a_record_the_destination_refuses_for_good() {
    let mut h = Harness::new(Duration::from_secs(2));
    h.settings.rows = outboxd_connector::RowLifecycle::Deleted;
    let (mut link, _keys) = link();
    let (_stop, shutdown) = watch::channel(false);
    let (mut stream, log, confirmed) = MemoryStream::new(Arc::clone(&h.store));
    h.sink.fail_id(2, FailureKind::Rejected);
    log.commit(10, vec![event(1, "K")]);
    log.commit(20, vec![event(2, "K")]);
    let error = h
        .session(&mut stream, &mut link, shutdown)
        .await
        .expect_err("the relay stops");
    assert!(
        matches!(error, PipelineError::Unpublishable { .. }),
        "{error}"
    );
    assert!(!error.is_transient(), "{error}");
    assert!(last_confirmed(&confirmed) <= Some(lsn(10)));
    assert_no_violations(&confirmed);
}
