//! What a device's screen shows of each conversation, when its spec asks to keep it
//! ([`DeviceSpec::keep_screen`](super::DeviceSpec::keep_screen)): messages with their
//! current text (an edit replaces it and marks it edited, a recall blanks it), and a
//! line for each membership, title or role change, built in `seq` order as the
//! timeline shows them (docs/client.md section 9).

use std::collections::HashMap;

use herald_shared::protocol::{Message, TimelineEvent};

/// One line of a conversation's screen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Line {
    pub id: u64,
    pub seq: u64,
    pub from: String,
    /// A message's body as JSON text; `None` once recalled, and on an event's line.
    pub body: Option<String>,
    /// The `seq` of the edit the body comes from.
    pub edited_seq: Option<u64>,
    pub recalled: bool,
    /// A membership, title or role change: what happened.
    pub event: Option<TimelineEvent>,
}

impl Line {
    /// The line as a person reads it.
    pub fn text(&self) -> String {
        if let Some(e) = &self.event {
            let who = &self.from;
            return match e {
                TimelineEvent::MemberAdded { users } => format!("{who} added {}", users.join(", ")),
                TimelineEvent::MemberRemoved { users } => format!("{who} removed {}", users.join(", ")),
                TimelineEvent::MemberLeft => format!("{who} left"),
                TimelineEvent::TitleChanged { title: Some(t) } => format!("{who} renamed the conversation {t:?}"),
                TimelineEvent::TitleChanged { title: None } => format!("{who} removed the title"),
                TimelineEvent::RoleChanged { user, role } => format!("{who} made {user} {}", role.as_str()),
                _ => format!("{who} changed the conversation"),
            };
        }
        let Some(body) = &self.body else { return "message recalled".into() };
        let text = match serde_json::from_str::<serde_json::Value>(body) {
            Ok(serde_json::Value::Object(o)) if o.get("text").is_some_and(|t| t.is_string()) => {
                o["text"].as_str().unwrap_or_default().to_owned()
            }
            _ => body.clone(),
        };
        if self.edited_seq.is_some() {
            format!("{text} (edited)")
        } else {
            text
        }
    }
}

/// Every conversation's screen, and what arrived but is not shown yet.
#[derive(Debug, Default)]
pub(super) struct Screens {
    waiting: HashMap<u64, Message>,
    pub(super) lines: HashMap<String, Vec<Line>>,
}

impl Screens {
    /// A message arrived for the first time; it is shown once the timeline reaches it.
    pub(super) fn arrived(&mut self, m: &Message) {
        self.waiting.insert(m.id.0, m.clone());
    }

    /// A message that arrived will never be shown (it was below what the timeline showed).
    pub(super) fn forget(&mut self, id: u64) {
        self.waiting.remove(&id);
    }

    /// The timeline shows message `id`, in `seq` order.
    pub(super) fn show(&mut self, id: u64) {
        let Some(m) = self.waiting.remove(&id) else { return };
        let lines = self.lines.entry(m.conv.clone()).or_default();
        fn target(lines: &mut [Line], id: u64) -> Option<&mut Line> {
            lines.iter_mut().find(|l| l.id == id && l.event.is_none())
        }
        match &m.event {
            Some(TimelineEvent::Edited { target: t, .. }) => {
                // A history page may have shown a later edit already.
                if let Some(l) = target(lines, t.0).filter(|l| !l.recalled && l.edited_seq < Some(m.seq)) {
                    l.body = Some(m.body.get().to_owned());
                    l.edited_seq = Some(m.seq);
                }
            }
            Some(TimelineEvent::Recalled { target: t, .. }) => {
                if let Some(l) = target(lines, t.0) {
                    l.body = None;
                    l.recalled = true;
                }
            }
            Some(event) => lines.push(Line {
                id,
                seq: m.seq,
                from: m.from.clone(),
                body: None,
                edited_seq: None,
                recalled: false,
                event: Some(event.clone()),
            }),
            None => lines.push(Line {
                id,
                seq: m.seq,
                from: m.from.clone(),
                body: m.recalled_seq.is_none().then(|| m.body.get().to_owned()),
                edited_seq: m.edited_seq,
                recalled: m.recalled_seq.is_some(),
                event: None,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use herald_shared::ids::MsgId;
    use herald_shared::protocol::MemberRole;
    use serde_json::value::RawValue;

    fn msg(id: u64, seq: u64, body: &str, event: Option<TimelineEvent>) -> Message {
        Message {
            id: MsgId(id),
            conv: "c".into(),
            seq,
            from: "alice".into(),
            cmid: format!("m{seq}"),
            ts: 0,
            body: RawValue::from_string(body.into()).unwrap(),
            status: None,
            event,
            edited_seq: None,
            recalled_seq: None,
        }
    }

    fn show(s: &mut Screens, m: Message) {
        let id = m.id.0;
        s.arrived(&m);
        s.show(id);
    }

    fn texts(s: &Screens) -> Vec<String> {
        s.lines["c"].iter().map(Line::text).collect()
    }

    #[test]
    fn edits_replace_the_text_recalls_blank_it_and_changes_get_a_line() {
        let mut s = Screens::default();
        show(&mut s, msg(1, 1, r#"{"text":"helo"}"#, None));
        show(&mut s, msg(2, 2, r#"{"text":"bye"}"#, None));
        show(&mut s, msg(3, 3, "null", Some(TimelineEvent::MemberAdded { users: vec!["bob".into(), "carol".into()] })));
        let edit = TimelineEvent::Edited { target: MsgId(1), target_seq: 1 };
        show(&mut s, msg(4, 4, r#"{"text":"hello"}"#, Some(edit)));
        show(&mut s, msg(5, 5, "null", Some(TimelineEvent::Recalled { target: MsgId(2), target_seq: 2 })));
        show(
            &mut s,
            msg(6, 6, "null", Some(TimelineEvent::RoleChanged { user: "bob".into(), role: MemberRole::Admin })),
        );
        show(&mut s, msg(7, 7, "null", Some(TimelineEvent::MemberLeft)));
        assert_eq!(
            texts(&s),
            ["hello (edited)", "message recalled", "alice added bob, carol", "alice made bob admin", "alice left"]
        );
    }

    #[test]
    fn a_page_that_shows_a_later_edit_is_not_undone_by_an_earlier_one() {
        let mut s = Screens::default();
        let mut from_history = msg(1, 1, r#"{"text":"third"}"#, None);
        from_history.edited_seq = Some(9);
        show(&mut s, from_history);
        let edit = TimelineEvent::Edited { target: MsgId(1), target_seq: 1 };
        show(&mut s, msg(4, 4, r#"{"text":"second"}"#, Some(edit)));
        assert_eq!(texts(&s), ["third (edited)"]);
        let mut gone = msg(2, 2, "null", None);
        gone.recalled_seq = Some(3);
        show(&mut s, gone);
        assert_eq!(texts(&s)[1], "message recalled");
    }
}
