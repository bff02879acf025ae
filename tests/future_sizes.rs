//! The size of the futures a caller keeps while it waits: the state a
//! bulkhead adds to every call in flight, which a server holds once per
//! request. Printed (`--nocapture`), and bounded by the sizes with every
//! feature on (the largest: the `tracing` exporter adds a span, the tokio
//! timer a sleep inline), so that a change that grows them fails here.

use std::mem::size_of_val;
use std::time::Instant;

use watertight::Bulkhead;
use watertight::keyed::KeyedBulkhead;

/// A call whose own future is one byte.
async fn one_byte() -> Result<u8, ()> {
    Ok(1)
}

#[test]
fn a_waiting_call_is_no_bigger_than_its_bound() {
    let bh = Bulkhead::builder().max_concurrent_calls(1).build().unwrap();
    let kb = KeyedBulkhead::<u64>::builder()
        .max_concurrent_calls(1)
        .global_limit(4)
        .build()
        .unwrap();
    let call = size_of_val(&one_byte());
    let plain = size_of_val(&bh.call(one_byte()));
    let plain_by = size_of_val(&bh.call_by(Instant::now(), one_byte()));
    let keyed = size_of_val(&kb.call(&7, one_byte()));
    let keyed_by = size_of_val(&kb.call_by(&7, Instant::now(), one_byte()));
    println!(
        "around a {call}-byte call: Bulkhead::call {plain} B, call_by {plain_by} B; \
         KeyedBulkhead::call {keyed} B, call_by {keyed_by} B"
    );
    assert!(plain <= 312, "Bulkhead::call is {plain} bytes");
    assert!(plain_by <= 328, "Bulkhead::call_by is {plain_by} bytes");
    // Each of its two stages keeps a wait of its own.
    assert!(keyed <= 936, "KeyedBulkhead::call is {keyed} bytes");
    assert!(
        keyed_by <= 1088,
        "KeyedBulkhead::call_by is {keyed_by} bytes"
    );
}
