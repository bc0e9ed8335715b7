-- Retention (worker.retention_days) deletes messages, not the promises made about them
-- (docs/protocol.md section 4.8).

-- A message's key outlives its row: a resend of a deleted message (an outbox offline
-- past the retention) is answered as a repeat, not committed again. The janitor copies
-- the key before it deletes the row, and deletes keys after worker.message_key_days
-- (0: never). About 100 bytes a message, against its body, indexes and event.
CREATE TABLE message_keys (
    tenant_id     VARCHAR(32)     NOT NULL,
    sender_id     VARCHAR(64)     NOT NULL,
    client_msg_id VARCHAR(64)     NOT NULL,
    conv_id       VARCHAR(64)     NOT NULL,
    id            BIGINT UNSIGNED NOT NULL,
    seq           BIGINT UNSIGNED NOT NULL,
    created_at    BIGINT          NOT NULL,
    -- The request's digest (messages.op_digest), so a reuse for another request is
    -- still a conflict once the message is gone.
    op_digest     BIGINT UNSIGNED NULL,
    PRIMARY KEY (tenant_id, sender_id, client_msg_id),
    KEY by_id (id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- The message a recall or edit is about, read from its event, so that the events about
-- a message deleted by retention lose their text with it (an edit keeps its place in
-- the timeline, without its body). Computed, not written by the committer.
ALTER TABLE messages
    ADD COLUMN target_id BIGINT UNSIGNED AS (CAST(JSON_VALUE(event, '$.target') AS UNSIGNED)) VIRTUAL,
    ADD KEY by_target (target_id);
