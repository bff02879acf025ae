//! The `tracing` exporter emits one event per permitted, rejected and
//! finished call.
//!
//! This test has a binary of its own: `tracing` caches each callsite's
//! interest the first time any thread reaches it, so a test on another
//! thread without the scoped subscriber would make these events vanish.
#![cfg(all(not(loom), feature = "tracing"))]

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use watertight::Bulkhead;

/// What a test's subscriber wrote.
#[derive(Clone, Default)]
struct Buf(Arc<Mutex<Vec<u8>>>);

impl Write for Buf {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// With the `tracing` feature, rejections and finished calls are events
/// that name the bulkhead.
#[test]
fn tracing_feature_emits_events() {
    let buf = Buf::default();
    let writer = buf.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    tracing::subscriber::with_default(subscriber, || {
        let bh = Bulkhead::builder()
            .name("gpu")
            .max_concurrent_calls(1)
            .max_wait(Duration::ZERO)
            .build()
            .unwrap();
        let held = bh.try_acquire().unwrap();
        assert!(bh.try_acquire().is_err());
        drop(held);
        // The call runs inside a `bulkhead_call` span naming the bulkhead,
        // so its own events say which bulkhead admitted them.
        futures::executor::block_on(bh.call(async {
            tracing::info!("inside the call");
            Ok::<(), ()>(())
        }))
        .unwrap();
    });
    let out = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 6, "{out}");
    let inside = lines
        .iter()
        .find(|l| l.contains("inside the call"))
        .expect("the call's own event");
    assert!(
        inside.contains("bulkhead_call{bulkhead=\"gpu\"}"),
        "{inside}"
    );
    assert!(
        lines[0].contains("call permitted") && lines[0].contains("bulkhead=\"gpu\""),
        "{out}"
    );
    assert!(
        lines[1].contains("DEBUG") && lines[1].contains("call rejected"),
        "rejections are DEBUG by default: {out}"
    );
    assert!(lines[1].contains("reason=\"full\""), "{out}");
    assert!(
        lines[2].contains("call finished") && lines[2].contains("outcome=\"released\""),
        "{out}"
    );
}

/// Each kind of event is at the level the builder gives it (none for
/// none), and the tracing exporter can be turned off while the metrics one
/// stays on. One test, so that every event runs under the one scoped
/// subscriber (see the note at the top).
#[test]
fn the_levels_are_the_users_and_tracing_turns_off_alone() {
    use tracing::Level;
    use watertight::observer::TraceLevels;

    let buf = Buf::default();
    let writer = buf.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(Level::TRACE)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let take = || {
        let out = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        buf.0.lock().unwrap().clear();
        out
    };
    tracing::subscriber::with_default(subscriber, || {
        let mut levels = TraceLevels::default();
        levels.permitted = None;
        levels.rejected = Some(Level::WARN);
        levels.finished = Some(Level::TRACE);
        let bh = Bulkhead::builder()
            .name("levels")
            .max_concurrent_calls(1)
            .max_wait(Duration::ZERO)
            .trace_levels(levels)
            .build()
            .unwrap();
        let held = bh.try_acquire().unwrap();
        assert!(bh.try_acquire().is_err());
        drop(held);
        let out = take();
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 2, "no permitted event: {out}");
        assert!(
            lines[0].contains("WARN") && lines[0].contains("call rejected"),
            "{out}"
        );
        assert!(
            lines[1].contains("TRACE") && lines[1].contains("call finished"),
            "{out}"
        );

        let quiet = Bulkhead::builder()
            .name("quiet")
            .max_concurrent_calls(1)
            .export_tracing(false)
            .build()
            .unwrap();
        futures::executor::block_on(quiet.call(async {
            tracing::info!("inside the quiet call");
            Ok::<(), ()>(())
        }))
        .unwrap();
        let out = take();
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 1, "only the call's own event: {out}");
        assert!(!lines[0].contains("bulkhead_call"), "no span either: {out}");
    });
}
