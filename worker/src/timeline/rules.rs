//! Who may change what (docs/protocol.md section 2.4): the rules of a timeline change,
//! decided on the conversation as the commit read it under its lock, and the events
//! the change makes. No I/O: every rule has a unit test.
//!
//! Roles rank owner > admin > member. A group's creator is its owner. Any member adds
//! members; a member removes itself (leaves); an admin removes members, the owner
//! removes admins and members; the owner and admins change the title; the owner gives
//! and takes the admin role and hands ownership over. A group without an owner and
//! without an admin (created before roles, or whose owner and admins left) is managed
//! by every member, as before roles. A service (the server API) may do all of it. A
//! sender recalls and edits its own messages within the configured windows; the owner
//! and admins of a group recall lower-ranked members' messages at any time.

use std::collections::{BTreeMap, BTreeSet};

use herald_shared::error::ErrorCode;
use herald_shared::ids::MsgId;
use herald_shared::protocol::{ConversationKind, MemberRole, TimelineEvent, TimelineOp};

/// The conversation as the commit read it, locked.
#[derive(Clone, Debug)]
pub struct ConvView {
    pub kind: ConversationKind,
    pub title: Option<String>,
    /// Current members and their roles.
    pub members: BTreeMap<String, MemberRole>,
}

/// The message a recall or edit is about, read in the same transaction.
#[derive(Clone, Debug)]
pub struct Target {
    pub id: MsgId,
    pub seq: u64,
    pub sender: String,
    pub created_at: u64,
    pub is_event: bool,
    pub recalled: bool,
}

/// Who makes the change.
#[derive(Clone, Copy, Debug)]
pub struct Actor<'a> {
    pub user: &'a str,
    /// A service: no member rule applies.
    pub service: bool,
}

/// How long after sending a sender may recall and edit (0: never).
#[derive(Clone, Copy, Debug)]
pub struct Windows {
    pub recall_ms: u64,
    pub edit_ms: u64,
}

/// One event of a change, with the membership it starts or ends: `joins` receive it
/// and what follows; `leaves` receive it and nothing after.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedEvent {
    pub event: TimelineEvent,
    /// The event's body as JSON text: `null`, or an edit's new body.
    pub body: String,
    pub joins: Vec<String>,
    pub leaves: Vec<String>,
}

/// What the change writes to the message it is about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TargetUpdate {
    Recall,
    Edit(String),
}

/// What a change does; no events means it changes nothing (a repeat by nature).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    pub events: Vec<PlannedEvent>,
    /// The new title, when it changes.
    pub title: Option<Option<String>>,
    /// New roles of current members.
    pub roles: Vec<(String, MemberRole)>,
    pub target: Option<TargetUpdate>,
}

/// A refused change: the protocol's code and a message for people.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal(pub ErrorCode, pub String);

fn refuse<T>(code: ErrorCode, message: impl Into<String>) -> Result<T, Refusal> {
    Err(Refusal(code, message.into()))
}

impl ConvView {
    fn role(&self, user: &str) -> Option<MemberRole> {
        self.members.get(user).copied()
    }

    /// Some member is owner or admin: the roles decide. Without one, every member
    /// manages the group (as before roles).
    fn managed(&self) -> bool {
        self.members.values().any(|r| *r >= MemberRole::Admin)
    }

    /// The actor's rank for managing the group: its role, or admin's for anyone in an
    /// unmanaged group (a service outranks everyone).
    fn rank(&self, actor: Actor) -> MemberRole {
        if actor.service {
            return MemberRole::Owner;
        }
        let own = self.role(actor.user).unwrap_or(MemberRole::Member);
        if self.managed() {
            own
        } else {
            MemberRole::Admin
        }
    }

    fn group_only(&self, what: &str) -> Result<(), Refusal> {
        if self.kind == ConversationKind::Direct {
            return refuse(ErrorCode::Conflict, format!("the {what} of a direct conversation are fixed"));
        }
        Ok(())
    }
}

/// Decides `op` by `actor` on `conv` at `now` (ms): what it writes, or why not.
pub fn plan(
    conv: &ConvView,
    actor: Actor,
    op: &TimelineOp,
    target: Option<&Target>,
    now: u64,
    windows: Windows,
) -> Result<Plan, Refusal> {
    if !actor.service && conv.role(actor.user).is_none() {
        return refuse(ErrorCode::Forbidden, "not a member of this conversation");
    }
    match op {
        TimelineOp::Members { add, remove, max_members } => members(conv, actor, add, remove, *max_members),
        TimelineOp::Title { title } => {
            conv.group_only("title and roles")?;
            if conv.rank(actor) < MemberRole::Admin {
                return refuse(ErrorCode::Forbidden, "only the owner and admins change the title");
            }
            if conv.title == *title {
                return Ok(Plan::default());
            }
            let event = TimelineEvent::TitleChanged { title: title.clone() };
            Ok(Plan { events: vec![planned(event, "null")], title: Some(title.clone()), ..Plan::default() })
        }
        TimelineOp::Role { user, role } => give_role(conv, actor, user, *role),
        TimelineOp::Recall { .. } => recall(conv, actor, target, now, windows),
        TimelineOp::Edit { body, .. } => {
            let t = message_target(target, "edited")?;
            if t.sender != actor.user {
                return refuse(ErrorCode::Forbidden, "only the sender may edit a message");
            }
            within(windows.edit_ms, t, now, "edit")?;
            let event = TimelineEvent::Edited { target: t.id, target_seq: t.seq };
            Ok(Plan {
                events: vec![planned(event, body)],
                target: Some(TargetUpdate::Edit(body.clone())),
                ..Plan::default()
            })
        }
    }
}

fn planned(event: TimelineEvent, body: &str) -> PlannedEvent {
    PlannedEvent { event, body: body.to_owned(), joins: Vec::new(), leaves: Vec::new() }
}

fn members(conv: &ConvView, actor: Actor, add: &[String], remove: &[String], max: usize) -> Result<Plan, Refusal> {
    if add.is_empty() && remove.is_empty() {
        return Ok(Plan::default());
    }
    conv.group_only("members")?;
    let joining: BTreeSet<&String> = add.iter().filter(|u| !conv.members.contains_key(*u)).collect();
    let removing: BTreeSet<&String> = remove.iter().filter(|u| conv.members.contains_key(*u)).collect();
    let leaving = removing.iter().any(|u| *u == actor.user);
    let others: Vec<String> = removing.iter().filter(|u| **u != actor.user).map(|u| (*u).clone()).collect();
    let rank = conv.rank(actor);
    if !others.is_empty() && rank < MemberRole::Admin {
        return refuse(ErrorCode::Forbidden, "only the owner and admins remove other members");
    }
    let outranks = |u: &String| actor.service || conv.role(u).unwrap_or(MemberRole::Member) < rank;
    if let Some(user) = others.iter().find(|u| !outranks(u)) {
        return refuse(
            ErrorCode::Forbidden,
            format!("{user:?} ranks as high as you: an admin removes members, the owner admins and members"),
        );
    }
    if conv.members.len() + joining.len() - removing.len() > max {
        return refuse(ErrorCode::BadRequest, format!("a conversation has at most {max} members"));
    }
    let mut plan = Plan::default();
    if !joining.is_empty() {
        let users: Vec<String> = joining.into_iter().cloned().collect();
        let event = TimelineEvent::MemberAdded { users: users.clone() };
        plan.events.push(PlannedEvent { joins: users, ..planned(event, "null") });
    }
    if !others.is_empty() {
        let event = TimelineEvent::MemberRemoved { users: others.clone() };
        plan.events.push(PlannedEvent { leaves: others, ..planned(event, "null") });
    }
    if leaving {
        let left = vec![actor.user.to_owned()];
        plan.events.push(PlannedEvent { leaves: left, ..planned(TimelineEvent::MemberLeft, "null") });
    }
    Ok(plan)
}

fn give_role(conv: &ConvView, actor: Actor, user: &str, role: MemberRole) -> Result<Plan, Refusal> {
    conv.group_only("title and roles")?;
    let Some(current) = conv.role(user) else {
        return refuse(ErrorCode::BadRequest, format!("{user:?} is not a member of this conversation"));
    };
    if !actor.service {
        if conv.role(actor.user) != Some(MemberRole::Owner) {
            return refuse(ErrorCode::Forbidden, "only the owner gives roles");
        }
        if actor.user == user {
            return refuse(ErrorCode::BadRequest, "the owner hands ownership to another member instead");
        }
    }
    if current == role {
        return Ok(Plan::default());
    }
    let mut roles = vec![(user.to_owned(), role)];
    if role == MemberRole::Owner {
        // One owner at a time: the previous one stays on as an admin.
        let previous = conv.members.iter().filter(|(u, r)| **r == MemberRole::Owner && u.as_str() != user);
        roles.extend(previous.map(|(u, _)| (u.clone(), MemberRole::Admin)));
    }
    let event = TimelineEvent::RoleChanged { user: user.to_owned(), role };
    Ok(Plan { events: vec![planned(event, "null")], roles, ..Plan::default() })
}

fn recall(conv: &ConvView, actor: Actor, target: Option<&Target>, now: u64, windows: Windows) -> Result<Plan, Refusal> {
    let t = message_target(target, "recalled")?;
    if t.sender == actor.user {
        within(windows.recall_ms, t, now, "recall")?;
    } else if !actor.service {
        // Moderation: a manager of a group recalls messages of lower-ranked members (a
        // former member ranks as a member).
        let theirs = conv.role(&t.sender).unwrap_or(MemberRole::Member);
        let rank = conv.role(actor.user).unwrap_or(MemberRole::Member);
        let manages = conv.kind == ConversationKind::Group && conv.managed() && rank >= MemberRole::Admin;
        if !manages || theirs >= rank {
            return refuse(
                ErrorCode::Forbidden,
                "only its sender, or the owner or an admin of the group over a lower-ranked sender, recalls a message",
            );
        }
    }
    let event = TimelineEvent::Recalled { target: t.id, target_seq: t.seq };
    Ok(Plan { events: vec![planned(event, "null")], target: Some(TargetUpdate::Recall), ..Plan::default() })
}

/// The target of a recall or edit: a message of this conversation, not recalled.
fn message_target<'a>(target: Option<&'a Target>, what: &str) -> Result<&'a Target, Refusal> {
    let Some(t) = target else {
        return refuse(ErrorCode::NotFound, "no such message in this conversation");
    };
    if t.is_event {
        return refuse(ErrorCode::BadRequest, format!("only messages can be {what}, not events"));
    }
    if t.recalled {
        return refuse(ErrorCode::Conflict, "the message was recalled");
    }
    Ok(t)
}

fn within(window_ms: u64, t: &Target, now: u64, what: &str) -> Result<(), Refusal> {
    if window_ms == 0 || now.saturating_sub(t.created_at) > window_ms {
        return refuse(ErrorCode::Forbidden, format!("the {what} window of this message has passed"));
    }
    Ok(())
}

#[cfg(test)]
#[path = "rules_tests.rs"]
mod tests;
