use super::*;

const MINUTE: u64 = 60_000;
const WINDOWS: Windows = Windows { recall_ms: 10 * MINUTE, edit_ms: MINUTE };

fn group(members: &[(&str, MemberRole)]) -> ConvView {
    ConvView {
        kind: ConversationKind::Group,
        title: Some("room".into()),
        members: members.iter().map(|(u, r)| (u.to_string(), *r)).collect(),
    }
}

/// owner alice, admin bob, members carol and dave.
fn team() -> ConvView {
    group(&[
        ("alice", MemberRole::Owner),
        ("bob", MemberRole::Admin),
        ("carol", MemberRole::Member),
        ("dave", MemberRole::Member),
    ])
}

fn user(name: &str) -> Actor<'_> {
    Actor { user: name, service: false }
}

const SERVICE: Actor<'static> = Actor { user: "service:crm", service: true };

fn change(add: &[&str], remove: &[&str]) -> TimelineOp {
    TimelineOp::Members {
        add: add.iter().map(|s| s.to_string()).collect(),
        remove: remove.iter().map(|s| s.to_string()).collect(),
        max_members: 5,
    }
}

fn run(conv: &ConvView, actor: Actor, op: &TimelineOp) -> Result<Plan, Refusal> {
    plan(conv, actor, op, None, 0, WINDOWS)
}

fn code(r: Result<Plan, Refusal>) -> ErrorCode {
    r.expect_err("refused").0
}

fn events(r: Result<Plan, Refusal>) -> Vec<TimelineEvent> {
    r.expect("allowed").events.into_iter().map(|e| e.event).collect()
}

fn names(users: &[&str]) -> Vec<String> {
    users.iter().map(|s| s.to_string()).collect()
}

#[test]
fn only_members_change_anything_and_a_service_changes_everything() {
    let c = team();
    assert_eq!(code(run(&c, user("mallory"), &change(&["x"], &[]))), ErrorCode::Forbidden);
    assert_eq!(code(run(&c, user("mallory"), &TimelineOp::Title { title: None })), ErrorCode::Forbidden);
    let e = events(run(&c, SERVICE, &change(&[], &["alice"])));
    assert_eq!(e, [TimelineEvent::MemberRemoved { users: names(&["alice"]) }], "a service removes the owner");
}

#[test]
fn any_member_adds_and_each_change_is_one_event_in_a_fixed_order() {
    let c = team();
    let p = run(&c, user("carol"), &change(&["erin", "bob"], &[])).unwrap();
    assert_eq!(p.events.len(), 1, "bob is already a member");
    assert_eq!(p.events[0].event, TimelineEvent::MemberAdded { users: names(&["erin"]) });
    assert_eq!(p.events[0].joins, names(&["erin"]));
    let p = run(&c, user("bob"), &change(&["erin"], &["bob", "carol", "zed"])).unwrap();
    let kinds: Vec<&TimelineEvent> = p.events.iter().map(|e| &e.event).collect();
    assert_eq!(
        kinds,
        [
            &TimelineEvent::MemberAdded { users: names(&["erin"]) },
            &TimelineEvent::MemberRemoved { users: names(&["carol"]) },
            &TimelineEvent::MemberLeft,
        ],
        "zed is no member: nothing to remove"
    );
    assert_eq!((p.events[1].leaves.clone(), p.events[2].leaves.clone()), (names(&["carol"]), names(&["bob"])));
    assert_eq!(run(&c, user("carol"), &change(&["bob"], &["zed"])).unwrap(), Plan::default(), "nothing changes");
}

#[test]
fn who_may_remove_whom_follows_the_ranks() {
    let c = team();
    // A member removes nobody but itself.
    assert_eq!(code(run(&c, user("carol"), &change(&[], &["dave"]))), ErrorCode::Forbidden);
    assert_eq!(events(run(&c, user("carol"), &change(&[], &["carol"]))), [TimelineEvent::MemberLeft]);
    // An admin removes members, not admins or the owner.
    assert_eq!(events(run(&c, user("bob"), &change(&[], &["dave"]))).len(), 1);
    assert_eq!(code(run(&c, user("bob"), &change(&[], &["alice"]))), ErrorCode::Forbidden);
    let two_admins = group(&[("alice", MemberRole::Owner), ("bob", MemberRole::Admin), ("eve", MemberRole::Admin)]);
    assert_eq!(code(run(&two_admins, user("bob"), &change(&[], &["eve"]))), ErrorCode::Forbidden);
    // The owner removes anyone; the owner may leave too.
    assert_eq!(events(run(&c, user("alice"), &change(&[], &["bob", "dave"]))).len(), 1);
    assert_eq!(events(run(&c, user("alice"), &change(&[], &["alice"]))), [TimelineEvent::MemberLeft]);
}

#[test]
fn a_group_without_owner_or_admin_is_managed_by_every_member() {
    let old = group(&[("alice", MemberRole::Member), ("bob", MemberRole::Member)]);
    assert_eq!(events(run(&old, user("bob"), &change(&[], &["alice"]))).len(), 1);
    assert_eq!(events(run(&old, user("bob"), &TimelineOp::Title { title: Some("new".into()) })).len(), 1);
    let role = TimelineOp::Role { user: "alice".into(), role: MemberRole::Admin };
    assert_eq!(code(run(&old, user("bob"), &role)), ErrorCode::Forbidden, "only an owner or a service gives roles");
    assert_eq!(events(run(&old, SERVICE, &role)).len(), 1);
    // Once someone manages it, the ranks apply again.
    let admins = group(&[("alice", MemberRole::Admin), ("bob", MemberRole::Member)]);
    assert_eq!(code(run(&admins, user("bob"), &change(&[], &["alice"]))), ErrorCode::Forbidden);
}

#[test]
fn a_direct_conversation_keeps_its_members_title_and_roles() {
    let direct =
        ConvView { kind: ConversationKind::Direct, ..group(&[("a", MemberRole::Member), ("b", MemberRole::Member)]) };
    assert_eq!(code(run(&direct, user("a"), &change(&["c"], &[]))), ErrorCode::Conflict);
    assert_eq!(code(run(&direct, user("a"), &TimelineOp::Title { title: None })), ErrorCode::Conflict);
    let role = TimelineOp::Role { user: "b".into(), role: MemberRole::Admin };
    assert_eq!(code(run(&direct, SERVICE, &role)), ErrorCode::Conflict);
}

#[test]
fn the_group_size_is_checked_after_the_change() {
    let c = team();
    assert_eq!(code(run(&c, user("carol"), &change(&["e", "f"], &[]))), ErrorCode::BadRequest, "6 > 5");
    assert_eq!(events(run(&c, user("alice"), &change(&["e", "f"], &["dave"]))).len(), 2, "5 members after it");
}

#[test]
fn titles_are_changed_by_managers_and_the_same_title_is_no_change() {
    let c = team();
    let title = |t: &str| TimelineOp::Title { title: Some(t.into()) };
    assert_eq!(code(run(&c, user("carol"), &title("x"))), ErrorCode::Forbidden);
    let p = run(&c, user("bob"), &title("x")).unwrap();
    assert_eq!((p.title.clone(), p.events[0].body.as_str()), (Some(Some("x".into())), "null"));
    assert_eq!(run(&c, user("bob"), &title("room")).unwrap(), Plan::default());
    assert_eq!(
        events(run(&c, user("alice"), &TimelineOp::Title { title: None })),
        [TimelineEvent::TitleChanged { title: None }]
    );
}

#[test]
fn the_owner_gives_roles_and_hands_ownership_over() {
    let c = team();
    let role = |u: &str, r| TimelineOp::Role { user: u.into(), role: r };
    assert_eq!(code(run(&c, user("bob"), &role("carol", MemberRole::Admin))), ErrorCode::Forbidden, "admins do not");
    let p = run(&c, user("alice"), &role("carol", MemberRole::Admin)).unwrap();
    assert_eq!(p.roles, [("carol".to_owned(), MemberRole::Admin)]);
    assert_eq!(run(&c, user("alice"), &role("bob", MemberRole::Admin)).unwrap(), Plan::default(), "no change");
    assert_eq!(code(run(&c, user("alice"), &role("zed", MemberRole::Admin))), ErrorCode::BadRequest);
    assert_eq!(code(run(&c, user("alice"), &role("alice", MemberRole::Member))), ErrorCode::BadRequest);
    let p = run(&c, user("alice"), &role("dave", MemberRole::Owner)).unwrap();
    assert_eq!(p.roles, [("dave".to_owned(), MemberRole::Owner), ("alice".to_owned(), MemberRole::Admin)]);
    assert_eq!(p.events[0].event, TimelineEvent::RoleChanged { user: "dave".into(), role: MemberRole::Owner });
}

fn message(sender: &str, created_at: u64) -> Target {
    Target { id: MsgId(1 << 60), seq: 3, sender: sender.into(), created_at, is_event: false, recalled: false }
}

fn at(conv: &ConvView, actor: Actor, op: &TimelineOp, target: Option<&Target>, now: u64) -> Result<Plan, Refusal> {
    plan(conv, actor, op, target, now, WINDOWS)
}

#[test]
fn a_sender_recalls_within_its_window_and_managers_moderate_lower_ranks() {
    let c = team();
    let recall = TimelineOp::Recall { target: MsgId(1 << 60) };
    let carols = message("carol", 0);
    let p = at(&c, user("carol"), &recall, Some(&carols), 10 * MINUTE).unwrap();
    assert_eq!(p.target, Some(TargetUpdate::Recall));
    assert_eq!(p.events[0].event, TimelineEvent::Recalled { target: MsgId(1 << 60), target_seq: 3 });
    assert_eq!(code(at(&c, user("carol"), &recall, Some(&carols), 10 * MINUTE + 1)), ErrorCode::Forbidden);
    // Others: dave never; bob (admin) and alice (owner) at any time, over lower ranks only.
    assert_eq!(code(at(&c, user("dave"), &recall, Some(&carols), 0)), ErrorCode::Forbidden);
    assert!(at(&c, user("bob"), &recall, Some(&carols), 99 * MINUTE).is_ok());
    assert_eq!(code(at(&c, user("bob"), &recall, Some(&message("alice", 0)), 0)), ErrorCode::Forbidden);
    assert!(at(&c, user("alice"), &recall, Some(&message("bob", 0)), 0).is_ok());
    assert!(at(&c, user("bob"), &recall, Some(&message("gone", 0)), 0).is_ok(), "a former member ranks as a member");
    let off = Windows { recall_ms: 0, ..WINDOWS };
    assert_eq!(code(plan(&c, user("carol"), &recall, Some(&carols), 0, off)), ErrorCode::Forbidden, "0: never");
}

#[test]
fn only_the_sender_edits_within_its_window() {
    let c = team();
    let edit = TimelineOp::Edit { target: MsgId(1 << 60), body: r#"{"text":"fixed"}"#.into() };
    let carols = message("carol", 0);
    let p = at(&c, user("carol"), &edit, Some(&carols), MINUTE).unwrap();
    assert_eq!(p.events[0].body, r#"{"text":"fixed"}"#, "the event carries the new body");
    assert_eq!(p.target, Some(TargetUpdate::Edit(r#"{"text":"fixed"}"#.into())));
    assert_eq!(code(at(&c, user("carol"), &edit, Some(&carols), MINUTE + 1)), ErrorCode::Forbidden);
    assert_eq!(code(at(&c, user("alice"), &edit, Some(&carols), 0)), ErrorCode::Forbidden, "not even the owner");
}

#[test]
fn recalls_and_edits_need_a_message_of_the_conversation_that_is_still_there() {
    let c = team();
    let (recall, edit) =
        (TimelineOp::Recall { target: MsgId(1) }, TimelineOp::Edit { target: MsgId(1), body: "null".into() });
    for op in [&recall, &edit] {
        assert_eq!(code(at(&c, user("carol"), op, None, 0)), ErrorCode::NotFound);
        let event = Target { is_event: true, ..message("carol", 0) };
        assert_eq!(code(at(&c, user("carol"), op, Some(&event), 0)), ErrorCode::BadRequest);
        let gone = Target { recalled: true, ..message("carol", 0) };
        assert_eq!(code(at(&c, user("carol"), op, Some(&gone), 0)), ErrorCode::Conflict);
    }
}
