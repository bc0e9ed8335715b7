-- Offline push (docs/architecture.md section 3): a device's push registration, and the
-- notifications waiting for (or being sent to) the push webhook.

-- A device's push token, set by PUT /v1/devices/me/push; it goes with the device's row
-- (logout, forgetting), and the commit's recipient read sees it at no extra cost.
ALTER TABLE devices ADD COLUMN push_platform VARCHAR(16) NULL;
ALTER TABLE devices ADD COLUMN push_token VARCHAR(4096) NULL;
ALTER TABLE devices ADD COLUMN push_updated_at BIGINT NULL;

-- One row per device and conversation: a second message while the notification waits
-- (PENDING, FAILED) or is being sent (SENDING) collapses into it (count, latest
-- message); a delivered (SENT) or given up (DEAD) row starts over. msg_id is the latest
-- message, the one whose ack makes the notification moot.
CREATE TABLE push_notifications (
    id            BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
    tenant_id     VARCHAR(32)     NOT NULL,
    user_id       VARCHAR(64)     NOT NULL,
    device_id     VARCHAR(64)     NOT NULL,
    conv_id       VARCHAR(64)     NOT NULL,
    msg_id        BIGINT UNSIGNED NOT NULL,
    sender_id     VARCHAR(64)     NOT NULL,
    count         INT UNSIGNED    NOT NULL,
    status        VARCHAR(8)      NOT NULL,
    retry_count   INT UNSIGNED    NOT NULL DEFAULT 0,
    next_retry_at BIGINT          NOT NULL,
    claimed_at    BIGINT          NULL,
    last_error    VARCHAR(512)    NULL,
    created_at    BIGINT          NOT NULL,
    updated_at    BIGINT          NOT NULL,
    PRIMARY KEY (id),
    UNIQUE KEY by_target (tenant_id, user_id, device_id, conv_id),
    KEY by_due (status, next_retry_at, id),
    KEY by_claim (status, claimed_at),
    KEY by_finished (status, updated_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
