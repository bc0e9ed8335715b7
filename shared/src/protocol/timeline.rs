//! Timeline events (docs/protocol.md section 4.11): membership, title and role
//! changes, recalls and edits, each committed into its conversation's timeline with a
//! `seq` of its own and delivered as a `msg` frame carrying an `event`; and the
//! requests that make them, on their way to a worker through the conversation's
//! ingress stream.

use std::collections::HashMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::node::Echo;
use crate::ids::MsgId;

/// A member's role in a conversation, lowest first: the order is the rank that says
/// who may remove whom (docs/protocol.md section 2.4).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum MemberRole {
    Member,
    Admin,
    Owner,
}

impl MemberRole {
    pub fn as_str(self) -> &'static str {
        match self {
            MemberRole::Member => "member",
            MemberRole::Admin => "admin",
            MemberRole::Owner => "owner",
        }
    }

    pub fn parse(s: &str) -> Option<MemberRole> {
        match s {
            "member" => Some(MemberRole::Member),
            "admin" => Some(MemberRole::Admin),
            "owner" => Some(MemberRole::Owner),
            _ => None,
        }
    }
}

/// What a timeline event says happened, tagged by `type`. An event's `from` is who did
/// it (a member, or `service:<name>` for the server API).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum TimelineEvent {
    /// `users` joined (they receive this event and what follows).
    MemberAdded { users: Vec<String> },
    /// `users` were removed (they receive this event, and nothing after it).
    MemberRemoved { users: Vec<String> },
    /// `from` left (its devices receive this event, and nothing after it).
    MemberLeft,
    /// The title is now `title` (null: none).
    TitleChanged { title: Option<String> },
    /// `user`'s role is now `role`; when it is `owner`, `from` (the previous owner, or
    /// every previous owner for a service's change) is an admin from now on.
    RoleChanged { user: String, role: MemberRole },
    /// Message `target` (at `target_seq`) was recalled: its body is gone for everyone.
    Recalled { target: MsgId, target_seq: u64 },
    /// Message `target` (at `target_seq`) now reads as this event's `body`.
    Edited { target: MsgId, target_seq: u64 },
    /// An event type of a newer server: it still counts in the timeline (ack it, show
    /// nothing or a generic line).
    #[serde(other)]
    #[schemars(skip)]
    Unknown,
}

impl TimelineEvent {
    /// The message a recall or edit is about.
    pub fn target(&self) -> Option<MsgId> {
        match self {
            TimelineEvent::Recalled { target, .. } | TimelineEvent::Edited { target, .. } => Some(*target),
            _ => None,
        }
    }

    /// The event as stored (`messages.event`).
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("events serialize")
    }
}

/// A change to a conversation's timeline, as the gateway asks a worker for it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum TimelineOp {
    /// Members to add and remove (a member removing itself leaves); `max_members` is
    /// the gateway's `gateway.max_group_size`.
    Members {
        add: Vec<String>,
        remove: Vec<String>,
        max_members: usize,
    },
    Title {
        title: Option<String>,
    },
    Role {
        user: String,
        role: MemberRole,
    },
    Recall {
        target: MsgId,
    },
    /// `body`: the new body's JSON text, validated and size-checked by the gateway.
    Edit {
        target: MsgId,
        body: String,
    },
}

/// A timeline change on its way to a worker (`k=tl`, in the conversation's stream, in
/// order with its sends).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TimelineEntry {
    pub tenant: String,
    /// Who makes the change: a user, or `service:<name>` when `by_service`.
    pub user: String,
    pub device: String,
    /// The idempotency key of the change: the client's for recalls and edits, the
    /// gateway's own otherwise. Events of one change are `cmid`, `cmid#2`, `cmid#3`.
    pub cmid: String,
    pub conv: String,
    /// A service (the server API) acts: no member rule applies to it.
    pub by_service: bool,
    pub op: TimelineOp,
    pub node: String,
    pub rid: u64,
}

/// A change makes at most this many events (members added, removed, the actor left).
pub const MAX_EVENTS_PER_CHANGE: usize = 3;

impl TimelineEntry {
    pub fn to_fields(&self) -> Vec<(&'static str, String)> {
        let mut fields = vec![
            ("k", "tl".into()),
            ("tid", self.tenant.clone()),
            ("uid", self.user.clone()),
            ("dev", self.device.clone()),
            ("cmid", self.cmid.clone()),
            ("conv", self.conv.clone()),
            ("op", serde_json::to_string(&self.op).expect("ops serialize")),
            ("node", self.node.clone()),
            ("rid", self.rid.to_string()),
        ];
        if self.by_service {
            fields.push(("svc", "1".into()));
        }
        fields
    }

    pub fn from_fields(f: &HashMap<String, String>) -> Option<TimelineEntry> {
        let get = |k: &str| f.get(k).cloned();
        Some(TimelineEntry {
            tenant: get("tid")?,
            user: get("uid")?,
            device: get("dev")?,
            cmid: get("cmid")?,
            conv: get("conv")?,
            by_service: f.get("svc").is_some_and(|v| v == "1"),
            op: serde_json::from_str(f.get("op")?).ok()?,
            node: get("node")?,
            rid: get("rid")?.parse().ok()?,
        })
    }

    pub fn echo(&self) -> Echo {
        Echo {
            tenant: self.tenant.clone(),
            user: self.user.clone(),
            conv: self.conv.clone(),
            cmid: Some(self.cmid.clone()),
        }
    }

    /// The cmid of this change's `n`th event (from 1).
    pub fn event_cmid(&self, n: usize) -> String {
        event_cmid(&self.cmid, n)
    }
}

/// The cmid of the `n`th event (from 1) of the change with idempotency key `cmid`.
pub fn event_cmid(cmid: &str, n: usize) -> String {
    if n <= 1 {
        cmid.to_owned()
    } else {
        format!("{cmid}#{n}")
    }
}

/// An edit's new body as the JSON value it is.
pub fn raw_body(text: &str) -> Option<Box<RawValue>> {
    RawValue::from_string(text.to_owned()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_tagged_by_type_and_unknown_types_still_read() {
        let e = TimelineEvent::Recalled { target: MsgId(u64::MAX), target_seq: 4 };
        assert_eq!(e.to_json(), r#"{"type":"recalled","target":"18446744073709551615","target_seq":4}"#);
        assert_eq!(TimelineEvent::MemberLeft.to_json(), r#"{"type":"member_left"}"#);
        let r = TimelineEvent::RoleChanged { user: "bob".into(), role: MemberRole::Admin };
        assert_eq!(r.to_json(), r#"{"type":"role_changed","user":"bob","role":"admin"}"#);
        for e in [e, r, TimelineEvent::TitleChanged { title: None }, TimelineEvent::MemberAdded { users: vec![] }] {
            assert_eq!(serde_json::from_str::<TimelineEvent>(&e.to_json()).unwrap(), e);
        }
        let later: TimelineEvent = serde_json::from_str(r#"{"type":"pinned","target":"1"}"#).unwrap();
        assert_eq!(later, TimelineEvent::Unknown, "a newer server's event type still reads");
        assert_eq!(later.target(), None);
    }

    #[test]
    fn roles_rank_member_below_admin_below_owner() {
        assert!(MemberRole::Member < MemberRole::Admin && MemberRole::Admin < MemberRole::Owner);
        for r in [MemberRole::Member, MemberRole::Admin, MemberRole::Owner] {
            assert_eq!(MemberRole::parse(r.as_str()), Some(r));
        }
        assert_eq!(MemberRole::parse("Owner"), None);
    }

    #[test]
    fn entries_round_trip_through_stream_fields() {
        let e = TimelineEntry {
            tenant: "t".into(),
            user: "service:crm".into(),
            device: "service:crm".into(),
            cmid: "k1".into(),
            conv: "c".into(),
            by_service: true,
            op: TimelineOp::Edit { target: MsgId(1 << 60), body: r#"{"text":"x"}"#.into() },
            node: "gw-1".into(),
            rid: 7,
        };
        let fields: HashMap<String, String> = e.to_fields().into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
        assert_eq!(TimelineEntry::from_fields(&fields), Some(e.clone()));
        let mut broken = fields.clone();
        broken.insert("op".into(), r#"{"op":"dance"}"#.into());
        assert_eq!(TimelineEntry::from_fields(&broken), None);
        assert_eq!((e.event_cmid(1), e.event_cmid(3)), ("k1".to_owned(), "k1#3".to_owned()));
    }
}
