//! What an `INFO replication` answer says about a server's history: a
//! primary's replication ids, and whether a server is a replica promoted
//! in place of the primary a client knew. Read by the failover watch and
//! by the Sentinel connection, which follows promotions.

/// `master_replid` and `master_replid2` from an `INFO replication` answer,
/// if the server is a primary.
pub(super) fn parse_replication(info: &str) -> Option<(String, String)> {
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .map(|v| v.trim().to_owned())
    };
    if field("role").as_deref() != Some("master") {
        return None;
    }
    field("master_replid").zip(field("master_replid2"))
}

/// Whether a server whose ids are `now` is a replica promoted in place of
/// the primary whose `master_replid` was `old`.
pub(super) fn is_promotion(old: &str, now: &(String, String)) -> bool {
    now.0 != old && now.1 == old
}
