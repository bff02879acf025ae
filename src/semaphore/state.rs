//! The semaphore's state word: the permit balance and two flags, packed into
//! one `usize` so that the uncontended paths are a single atomic operation.
//!
//! | bits            | name      | meaning                                                   |
//! |-----------------|-----------|-----------------------------------------------------------|
//! | 0               | `CLOSED`  | `close` was called; set once, never cleared               |
//! | 1               | `WAITERS` | the wait queue may be non-empty: a release must take the lock and hand permits to waiters |
//! | 2..usize::BITS  | balance   | available permits, two's complement, so it can be negative |
//!
//! Adding `n` permits is `fetch_add(n << SHIFT)`, which is a signed addition
//! on the balance field and leaves the flag bits alone. The balance stays in
//! `-MAX_PERMITS..=MAX_PERMITS` (checked on every change), far inside the
//! field's range, so a transient excess during an overflow check cannot wrap.

/// `close` was called.
pub(super) const CLOSED: usize = 0b01;
/// The wait queue is non-empty (outside the lock's critical sections).
pub(super) const WAITERS: usize = 0b10;
/// How far the balance is shifted left of the flags.
const SHIFT: u32 = 2;

/// The most permits a semaphore can hold available at once, and the most one
/// acquire can ask for.
pub(super) const MAX_PERMITS: usize = usize::MAX >> 5;

/// The balance field of a state word.
#[inline]
pub(super) const fn balance(state: usize) -> isize {
    (state as isize) >> SHIFT
}

/// `n` permits as an increment of the state word.
#[inline]
pub(super) const fn units(n: usize) -> usize {
    n << SHIFT
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn balance_is_signed_and_ignores_flags() {
        let zero = CLOSED | WAITERS;
        assert_eq!(balance(zero), 0);
        assert_eq!(balance(zero.wrapping_add(units(5))), 5);
        assert_eq!(balance(zero.wrapping_sub(units(7))), -7);
        assert_eq!(
            zero.wrapping_sub(units(7)) & (CLOSED | WAITERS),
            CLOSED | WAITERS
        );
        let max = units(MAX_PERMITS);
        assert_eq!(balance(max), MAX_PERMITS as isize);
        assert_eq!(balance(0usize.wrapping_sub(max)), -(MAX_PERMITS as isize));
    }

    #[test]
    fn field_has_room_for_an_unchecked_excess() {
        // `add_balance` (a release that passes waiters) adds before it
        // checks; twice the maximum must not wrap.
        let state = units(MAX_PERMITS).wrapping_add(units(MAX_PERMITS));
        assert_eq!(balance(state), 2 * MAX_PERMITS as isize);
    }
}
