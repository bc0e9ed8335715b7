-- Timeline events (docs/architecture.md section 2, "Timeline events").

-- A member's role: owner, admin or member. The creator of a group is its owner;
-- members of conversations created before roles are all members (such a conversation,
-- without owner or admin, is managed by every member, as before roles).
ALTER TABLE members ADD COLUMN role VARCHAR(8) NOT NULL DEFAULT 'member';

-- Events share the messages table: the same seq, ids, idempotency key, history, sync,
-- pending sets and fan-out as messages. `event` is the event (JSON) of an event row,
-- NULL for a message. On a message, `edited_seq` is the seq of its latest edit (its
-- body is that edit's) and `recalled_seq` the seq of its recall (its body is null).
ALTER TABLE messages ADD COLUMN event TEXT NULL;
ALTER TABLE messages ADD COLUMN edited_seq BIGINT UNSIGNED NULL;
ALTER TABLE messages ADD COLUMN recalled_seq BIGINT UNSIGNED NULL;
