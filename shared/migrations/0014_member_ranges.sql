-- A member's earlier ranges in a conversation (docs/architecture.md section 2). A
-- member removed (or gone) and added again keeps one `members` row, whose `joined_seq`
-- and `left_seq` are its current range; each range it had before is kept here when it
-- joins again, so what reads a device's messages by membership from MySQL (the overflow
-- band, device sync) still finds every range the user was a member of.
CREATE TABLE member_ranges (
    tenant_id  VARCHAR(32)     NOT NULL,
    conv_id    VARCHAR(64)     NOT NULL,
    user_id    VARCHAR(64)     NOT NULL,
    joined_seq BIGINT UNSIGNED NOT NULL,
    left_seq   BIGINT UNSIGNED NOT NULL,
    PRIMARY KEY (tenant_id, conv_id, user_id, joined_seq)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
