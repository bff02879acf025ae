//! What the layer reads from a request: its priority class and its
//! deadline.

use std::time::Instant;

use crate::CallOptions;

/// Reads the priority class of a request, for a layer or service with
/// [`priority_from`](super::BulkheadLayer::priority_from).
///
/// Implemented by every `Fn(&Req) -> usize` and by [`NoPriority`].
///
/// # Examples
///
/// ```
/// use watertight::tower::RequestPriority;
///
/// #[derive(Clone)]
/// struct ByTier;
///
/// impl RequestPriority<&'static str> for ByTier {
///     fn priority(&self, tier: &&'static str) -> Option<usize> {
///         Some(if *tier == "paid" { 0 } else { 1 })
///     }
/// }
///
/// assert_eq!(ByTier.priority(&"paid"), Some(0));
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot read a priority class from a `{Req}`",
    label = "not a priority reader for `{Req}`",
    note = "a reader is a `RequestPriority<{Req}>`: a closure `Fn(&{Req}) -> Option<usize>`, or a type that implements it"
)]
pub trait RequestPriority<Req> {
    /// The priority class of `request` (0 the most important), or `None`
    /// for a plain call.
    fn priority(&self, request: &Req) -> Option<usize>;
}

impl<Req, F> RequestPriority<Req> for F
where
    F: Fn(&Req) -> usize,
{
    #[inline]
    fn priority(&self, request: &Req) -> Option<usize> {
        Some(self(request))
    }
}

/// The [`RequestPriority`] of a layer without
/// [`priority_from`](super::BulkheadLayer::priority_from): every request is a
/// plain call, and nothing is read.
///
/// # Examples
///
/// ```
/// use watertight::tower::{NoPriority, RequestPriority};
///
/// assert_eq!(NoPriority.priority(&"any request"), None);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NoPriority;

impl<Req> RequestPriority<Req> for NoPriority {
    #[inline(always)]
    fn priority(&self, _request: &Req) -> Option<usize> {
        None
    }
}

/// Reads the deadline a request carries, for a layer or service with
/// [`deadline_from`](super::BulkheadLayer::deadline_from).
///
/// Implemented by every `Fn(&Req) -> Option<Instant>` and by
/// [`NoDeadline`]; implement it for a type of your own to name the
/// service's type (a closure cannot be named).
///
/// # Examples
///
/// ```
/// use std::time::{Duration, Instant};
/// use watertight::tower::RequestDeadline;
///
/// /// A job that says how long it may take in all.
/// struct Job {
///     budget: Duration,
/// }
///
/// #[derive(Clone)]
/// struct JobBudget;
///
/// impl RequestDeadline<Job> for JobBudget {
///     fn deadline(&self, job: &Job) -> Option<Instant> {
///         Some(Instant::now() + job.budget)
///     }
/// }
///
/// let by = JobBudget.deadline(&Job { budget: Duration::from_secs(1) });
/// assert!(by.is_some());
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot read a deadline from a `{Req}`",
    label = "not a deadline reader for `{Req}`",
    note = "a reader is a `RequestDeadline<{Req}>`: a closure `Fn(&{Req}) -> Option<Instant>`, `OptionsFrom`, or a ready-made one",
    note = "the ready-made readers of `http::Request` (`GrpcTimeout`, `DeadlineExtension`) need the `http` feature of watertight"
)]
pub trait RequestDeadline<Req> {
    /// The time by which `request` must be done, or `None` if it carries
    /// no deadline (it is admitted as without one).
    fn deadline(&self, request: &Req) -> Option<Instant>;

    /// The options `request` is admitted with: its
    /// [`deadline`](Self::deadline), and nothing else unless the reader
    /// says more ([`OptionsFrom`] gives every option).
    #[inline]
    fn options(&self, request: &Req) -> CallOptions {
        match self.deadline(request) {
            Some(by) => CallOptions::new().deadline(by),
            None => CallOptions::new(),
        }
    }
}

/// A reader of every [`CallOptions`] a request carries (a deadline, a
/// `max_wait` of its own, a class), for a layer or service with
/// [`options_from`](super::BulkheadLayer::options_from): the
/// [`RequestDeadline`] of a function `Fn(&Req) -> CallOptions`.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use watertight::CallOptions;
/// use watertight::tower::{OptionsFrom, RequestDeadline};
///
/// let patient = OptionsFrom(|_: &&str| CallOptions::new().max_wait(Duration::from_millis(10)));
/// let options = patient.options(&"GET /");
/// assert_eq!(options, CallOptions::new().max_wait(Duration::from_millis(10)));
/// assert_eq!(patient.deadline(&"GET /"), None);
/// ```
#[derive(Clone, Copy, Debug)]
pub struct OptionsFrom<F>(pub F);

impl<Req, F> RequestDeadline<Req> for OptionsFrom<F>
where
    F: Fn(&Req) -> CallOptions,
{
    #[inline]
    fn deadline(&self, request: &Req) -> Option<Instant> {
        // A budget counts from now here; the service reads `options`, and
        // starts it on the bulkhead's clock.
        (self.0)(request).deadline_by(Instant::now)
    }

    #[inline]
    fn options(&self, request: &Req) -> CallOptions {
        (self.0)(request)
    }
}

impl<Req, F> RequestDeadline<Req> for F
where
    F: Fn(&Req) -> Option<Instant>,
{
    #[inline]
    fn deadline(&self, request: &Req) -> Option<Instant> {
        self(request)
    }
}

/// The [`RequestDeadline`] of a layer without
/// [`deadline_from`](super::BulkheadLayer::deadline_from): no request carries a
/// deadline, and nothing is read.
///
/// # Examples
///
/// ```
/// use watertight::tower::{NoDeadline, RequestDeadline};
///
/// assert_eq!(NoDeadline.deadline(&"any request"), None);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NoDeadline;

impl<Req> RequestDeadline<Req> for NoDeadline {
    #[inline(always)]
    fn deadline(&self, _request: &Req) -> Option<Instant> {
        None
    }
}
