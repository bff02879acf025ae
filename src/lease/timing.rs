//! The timing of a lease that both backends' builders check alike: the
//! drift margin, how long a holder counts on a lease, how often it is
//! renewed; and the label a lease carries when none is set.

use std::time::Duration;

/// How a holder times its leases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Timing {
    /// The time to live less the drift margin: how long after a grant or
    /// renewal was sent the holder counts on the lease.
    pub(crate) life: Duration,
    pub(crate) renew_every: Duration,
}

/// Which setting cannot work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BadTiming {
    DriftMargin,
    RenewInterval,
}

impl Timing {
    /// The drift margin defaults to 1% of the time to live, at least 10 ms
    /// and at most a quarter of it, and must be shorter than it; renewals
    /// default to a third of what is left, and must come sooner than that.
    pub(crate) fn new(
        ttl: Duration,
        drift_margin: Option<Duration>,
        renew_every: Option<Duration>,
    ) -> Result<Self, BadTiming> {
        let drift_margin =
            drift_margin.unwrap_or_else(|| (ttl / 100).max(Duration::from_millis(10)).min(ttl / 4));
        if drift_margin >= ttl {
            return Err(BadTiming::DriftMargin);
        }
        let life = ttl - drift_margin;
        let renew_every = renew_every.unwrap_or(life / 3);
        if renew_every.is_zero() || renew_every >= life {
            return Err(BadTiming::RenewInterval);
        }
        Ok(Self { life, renew_every })
    }
}

/// The label of a lease when none is set: host name and process id.
pub(crate) fn default_label() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "host".into());
    format!("{host}/{}", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn defaults_and_bounds() {
        let t = Timing::new(30_000 * MS, None, None).unwrap();
        assert_eq!(t.life, 29_700 * MS);
        assert_eq!(t.renew_every, 9_900 * MS);
        // At least 10 ms, at most a quarter.
        assert_eq!(Timing::new(100 * MS, None, None).unwrap().life, 90 * MS);
        assert_eq!(Timing::new(20 * MS, None, None).unwrap().life, 15 * MS);
        assert_eq!(
            Timing::new(100 * MS, Some(100 * MS), None),
            Err(BadTiming::DriftMargin)
        );
        assert_eq!(
            Timing::new(100 * MS, Some(10 * MS), Some(90 * MS)),
            Err(BadTiming::RenewInterval)
        );
        assert_eq!(
            Timing::new(100 * MS, None, Some(Duration::ZERO)),
            Err(BadTiming::RenewInterval)
        );
    }
}
