//! The forms of a key that a keyed bulkhead's methods take.

use core::borrow::Borrow;
use core::hash::Hash;

/// A form of the key type `K` that [`KeyedBulkhead`](super::KeyedBulkhead)'s
/// methods take: `K` itself, or any type `K` borrows as that hashes and
/// compares as `K` does and can make an owned `K` (for a key seen for the
/// first time). So a bulkhead keyed by `String` takes `&str` as well as
/// `&String`, and one keyed by `Vec<u8>` takes `&[u8]`.
///
/// Implemented for every such type, and for no other; there is nothing to
/// implement.
///
/// # Examples
///
/// ```
/// use watertight::keyed::{BorrowedKey, KeyedBulkhead};
///
/// fn admit<Q: BorrowedKey<String> + ?Sized>(tenants: &KeyedBulkhead<String>, tenant: &Q) -> bool {
///     tenants.try_acquire(tenant).is_ok()
/// }
///
/// let tenants = KeyedBulkhead::<String>::builder().max_concurrent_calls(1).build().unwrap();
/// assert!(admit(&tenants, "acme"));
/// assert!(admit(&tenants, &String::from("globex")));
/// ```
pub trait BorrowedKey<K>: Hash + Eq + ToOwned<Owned = K> {
    /// `key` in this form.
    fn of(key: &K) -> &Self;
}

impl<K, Q> BorrowedKey<K> for Q
where
    K: Borrow<Q>,
    Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
{
    #[inline]
    fn of(key: &K) -> &Q {
        key.borrow()
    }
}
