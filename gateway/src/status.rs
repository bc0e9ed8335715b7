//! How far a message got, from the members' positions in MySQL: a member has message
//! `seq` delivered when its delivered position (moved by its devices' acks) or its read
//! position (reading implies delivery) reaches `seq`, and read when its read position
//! does. The recipients of a message are the members other than its sender whose
//! membership covers `seq` (docs/protocol.md section 2.4).
//!
//! One query reads a conversation's members (at most `gateway.max_group_size`); the
//! status of every message of a history page is then counted in memory.

use herald_shared::db::TextColumns;
use herald_shared::protocol::MessageStatus;
use serde::Serialize;
use sqlx::mysql::MySqlPool;
use sqlx::Row;

/// One member's positions in a conversation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberPosition {
    pub user: String,
    pub joined_seq: u64,
    pub left_seq: Option<u64>,
    pub delivered_seq: u64,
    pub read_seq: u64,
}

impl MemberPosition {
    fn receives(&self, seq: u64) -> bool {
        self.joined_seq < seq && self.left_seq.is_none_or(|l| seq <= l)
    }

    fn has(&self, seq: u64) -> bool {
        self.delivered_seq.max(self.read_seq) >= seq
    }
}

/// One recipient's state of one message (`GET /v1/messages/{id}/status`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RecipientStatus {
    pub user: String,
    pub delivered: bool,
    pub read: bool,
}

/// Every member's positions in a conversation.
pub async fn positions(db: &MySqlPool, tenant: &str, conv: &str) -> Result<Vec<MemberPosition>, sqlx::Error> {
    let rows = sqlx::query(
        "SELECT user_id, joined_seq, left_seq, delivered_seq, read_seq FROM members WHERE tenant_id = ? AND conv_id = ? \
         ORDER BY user_id",
    )
    .bind(tenant)
    .bind(conv)
    .fetch_all(db)
    .await?;
    rows.iter()
        .map(|r| {
            Ok(MemberPosition {
                user: r.text(0)?,
                joined_seq: r.try_get(1)?,
                left_seq: r.try_get(2)?,
                delivered_seq: r.try_get(3)?,
                read_seq: r.try_get(4)?,
            })
        })
        .collect()
}

/// Each recipient of `sender`'s message `seq`, in the order of `members`.
pub fn recipients(members: &[MemberPosition], sender: &str, seq: u64) -> Vec<RecipientStatus> {
    members
        .iter()
        .filter(|m| m.user != sender && m.receives(seq))
        .map(|m| RecipientStatus { user: m.user.clone(), delivered: m.has(seq), read: m.read_seq >= seq })
        .collect()
}

/// The counts of [`recipients`].
pub fn status_of(members: &[MemberPosition], sender: &str, seq: u64) -> MessageStatus {
    let mut s = MessageStatus::default();
    for r in recipients(members, sender, seq) {
        s.of += 1;
        s.delivered += u64::from(r.delivered);
        s.read += u64::from(r.read);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(user: &str, joined: u64, left: Option<u64>, delivered: u64, read: u64) -> MemberPosition {
        MemberPosition {
            user: user.into(),
            joined_seq: joined,
            left_seq: left,
            delivered_seq: delivered,
            read_seq: read,
        }
    }

    #[test]
    fn a_message_counts_its_recipients_within_membership_and_reading_implies_delivery() {
        let members = [
            member("alice", 0, None, 0, 0),
            member("bob", 0, None, 5, 2),
            member("carol", 0, None, 0, 4),
            member("dave", 3, None, 9, 9),
            member("erin", 0, Some(2), 9, 9),
        ];
        // Alice's message 3: bob, carol and erin (left after 2) aside, dave joined at 3.
        assert_eq!(status_of(&members, "alice", 3), MessageStatus { of: 2, delivered: 2, read: 1 });
        assert_eq!(status_of(&members, "alice", 4), MessageStatus { of: 3, delivered: 3, read: 2 });
        assert_eq!(status_of(&members, "alice", 6), MessageStatus { of: 3, delivered: 1, read: 1 });
        let r = recipients(&members, "alice", 2);
        let users: Vec<&str> = r.iter().map(|r| r.user.as_str()).collect();
        assert_eq!(users, ["bob", "carol", "erin"], "the sender is never its own recipient");
        assert_eq!(r[0], RecipientStatus { user: "bob".into(), delivered: true, read: true });
    }
}
