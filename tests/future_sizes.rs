//! The size of the futures a caller keeps while it waits: the state a
//! bulkhead adds to every call in flight, which a server holds once per
//! request. Printed (`--nocapture`), and bounded by the sizes with every
//! feature on (the largest: the `tracing` exporter adds a span, the tokio
//! timer a sleep inline), so that a change that grows them fails here.

use std::mem::size_of_val;
use std::time::Instant;
use watertight::CallOptions;

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
    let by = CallOptions::new().deadline(Instant::now());
    let plain_with = size_of_val(&bh.call_with(by, one_byte()));
    let keyed = size_of_val(&kb.call(&7, one_byte()));
    let keyed_with = size_of_val(&kb.call_with(&7, by, one_byte()));
    println!(
        "around a {call}-byte call: Bulkhead::call {plain} B, call_with {plain_with} B; \
         KeyedBulkhead::call {keyed} B, call_with {keyed_with} B"
    );
    assert!(plain <= 280, "Bulkhead::call is {plain} bytes");
    // A call with options may be classed: the larger of the two ways in.
    assert!(
        plain_with <= 336,
        "Bulkhead::call_with is {plain_with} bytes"
    );
    // Its two stages wait one after the other, in the same bytes: at most
    // twice a plain call's (the tokio timer's sleep, in every wait, is most
    // of a plain call's size), and `call` is `call_with` without options.
    assert!(keyed <= 528, "KeyedBulkhead::call is {keyed} bytes");
    #[cfg(feature = "tokio")]
    assert!(
        keyed <= 2 * plain,
        "KeyedBulkhead::call is {keyed} bytes, Bulkhead::call {plain}"
    );
    assert!(
        keyed_with <= 528,
        "KeyedBulkhead::call_with is {keyed_with} bytes"
    );
}
