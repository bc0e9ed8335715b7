//! What a MySQL error that ended a commit says about the batch, by its error number and
//! SQLSTATE: the batch's own data (poison, found by splitting), a conflict with another
//! transaction (run again), a statement larger than the server's packet (split), or the
//! server or the way to it failing (wait and retry the whole batch).
//!
//! Only errors that name a message's own value are poison: a refusal for any other
//! reason (a read-only server, a full disk, a missing privilege, a statement this server
//! does not understand) would refuse every message alike, so splitting would answer
//! each sender `bad_request` for a fault of the database. Those wait, with backoff and
//! an alert, until the server takes the batch; the senders meanwhile get `unavailable`
//! when their send deadline passes and resend with the same `cmid`. An error number
//! this list does not know is treated the same way: never refused for a fault that may
//! not be the message's.

/// What to do about a failed commit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// A deadlock, or a unique-key race with another worker during a takeover: run the
    /// batch again (dedup finds the winner).
    Conflict,
    /// MySQL unreachable, overloaded or restarting, a lock or statement timeout, or no
    /// snowflake ids: wait, retry.
    Transient,
    /// The server answers but refuses the batch for a reason that is not its data
    /// (read-only, disk full, a privilege, a statement it does not know): wait, retry,
    /// alert (`herald_mysql_refusals_total`).
    Refused,
    /// The statement was larger than the server's `max_allowed_packet`: split the batch;
    /// one message alone that is still too large is refused as `too_large`.
    TooLarge,
    /// MySQL refused the data itself: the same batch will fail again, so find the
    /// entry that does it.
    Poison,
    /// The shard belongs to another worker now.
    Fenced,
}

/// Errors about one value of a row: too long, out of range, not a valid value of its
/// type or character set, a NULL where none may be, a CHECK constraint, a trigger's
/// SIGNAL refusing the row.
const POISON: &[u16] = &[
    1048, // ER_BAD_NULL_ERROR: column cannot be null
    1264, // ER_WARN_DATA_OUT_OF_RANGE
    1265, // WARN_DATA_TRUNCATED
    1292, // ER_TRUNCATED_WRONG_VALUE: incorrect value
    1300, // ER_INVALID_CHARACTER_STRING
    1366, // ER_TRUNCATED_WRONG_VALUE_FOR_FIELD: incorrect string value
    1367, // ER_ILLEGAL_VALUE_FOR_TYPE
    1406, // ER_DATA_TOO_LONG
    1644, // ER_SIGNAL_EXCEPTION: a trigger refused the row
    1690, // ER_DATA_OUT_OF_RANGE
    3140, // MySQL ER_INVALID_JSON_TEXT
    3819, // MySQL ER_CHECK_CONSTRAINT_VIOLATED
    4025, // MariaDB ER_CONSTRAINT_FAILED (CHECK)
];

/// Conflicts with another transaction: running the batch again settles them.
const CONFLICT: &[u16] = &[
    1020, // ER_CHECKREAD: record changed since last read (MariaDB)
    1062, // ER_DUP_ENTRY
    1213, // ER_LOCK_DEADLOCK
];

/// The statement was larger than `max_allowed_packet`.
const TOO_LARGE: &[u16] = &[
    1153, // ER_NET_PACKET_TOO_LARGE
];

/// The server (or the way to it) is away, busy, stopping, or cut the statement short.
const TRANSIENT: &[u16] = &[
    1040, // ER_CON_COUNT_ERROR: too many connections
    1053, // ER_SERVER_SHUTDOWN
    1158, // ER_NET_READ_ERROR
    1159, // ER_NET_READ_INTERRUPTED
    1160, // ER_NET_ERROR_ON_WRITE
    1161, // ER_NET_WRITE_INTERRUPTED
    1205, // ER_LOCK_WAIT_TIMEOUT
    1317, // ER_QUERY_INTERRUPTED
    1927, // MariaDB ER_CONNECTION_KILLED
    1969, // MariaDB ER_STATEMENT_TIMEOUT
    2006, // CR_SERVER_GONE_ERROR
    2013, // CR_SERVER_LOST
    3024, // MySQL ER_QUERY_TIMEOUT
];

/// What MySQL error `number` with SQLSTATE `state` says about the batch.
pub fn classify(number: u16, state: &str) -> Failure {
    if CONFLICT.contains(&number) || state == "40001" {
        Failure::Conflict
    } else if TOO_LARGE.contains(&number) {
        Failure::TooLarge
    } else if POISON.contains(&number) || state.starts_with("22") {
        // SQLSTATE class 22: a data exception, about a value of the statement.
        Failure::Poison
    } else if TRANSIENT.contains(&number) || state.starts_with("08") || state.starts_with("HYT") {
        Failure::Transient
    } else {
        Failure::Refused
    }
}

/// The MySQL error number and SQLSTATE of `e`, when the server answered with an error.
pub fn mysql_code(e: &sqlx::Error) -> Option<(u16, String)> {
    match e {
        sqlx::Error::Database(d) => d
            .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
            .map(|m| (m.number(), m.code().unwrap_or_default().to_owned())),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_errors_about_a_value_of_the_message_are_poison() {
        for (number, state, what) in [
            (1406, "22001", "data too long"),
            (1264, "22003", "out of range"),
            (1366, "HY000", "incorrect string value (MariaDB)"),
            (1366, "22007", "incorrect string value (MySQL 8)"),
            (1292, "22007", "incorrect value"),
            (1048, "23000", "column cannot be null"),
            (1644, "45000", "a trigger's SIGNAL"),
            (4025, "23000", "MariaDB CHECK constraint"),
            (3819, "HY000", "MySQL CHECK constraint"),
            (3140, "22032", "MySQL invalid JSON"),
            (9999, "22012", "any data exception (class 22)"),
        ] {
            assert_eq!(classify(number, state), Failure::Poison, "{what} ({number})");
        }
    }

    #[test]
    fn infrastructure_refusals_wait_instead_of_refusing_the_message() {
        for (number, state, what) in [
            (1290, "HY000", "read-only server (--read-only)"),
            (1836, "HY000", "running in read-only mode"),
            (1792, "25006", "read-only transaction"),
            (1142, "42000", "INSERT command denied (a revoked privilege)"),
            (1044, "42000", "access denied to the database"),
            (1227, "42000", "a privilege the statement needs"),
            (1021, "HY000", "disk full"),
            (1114, "HY000", "table is full"),
            (1030, "HY000", "storage engine error"),
            (3, "HY000", "error writing a file"),
            (1180, "HY000", "error during COMMIT"),
            (1064, "42000", "syntax error (a server of another flavour)"),
            (1146, "42S02", "table missing (schema not migrated)"),
            (1054, "42S22", "unknown column"),
            (65_000, "HY000", "an error number nobody listed"),
        ] {
            assert_eq!(classify(number, state), Failure::Refused, "{what} ({number})");
        }
    }

    #[test]
    fn the_server_going_away_or_timing_out_is_transient() {
        for (number, state) in [
            (1205, "HY000"),
            (1040, "08004"),
            (1053, "08S01"),
            (1969, "70100"),
            (3024, "HY000"),
            (2013, "HY000"),
            (1927, "70100"),
            (9998, "08S01"),
            (9997, "HYT00"),
        ] {
            assert_eq!(classify(number, state), Failure::Transient, "{number} {state}");
        }
    }

    #[test]
    fn conflicts_and_oversized_statements_have_their_own_answers() {
        assert_eq!(classify(1213, "40001"), Failure::Conflict);
        assert_eq!(classify(1062, "23000"), Failure::Conflict, "a duplicate key is a race, not poison");
        assert_eq!(classify(1020, "HY000"), Failure::Conflict);
        assert_eq!(classify(1153, "08S01"), Failure::TooLarge, "not retried whole forever");
    }
}
