-- Herald's source of truth. Every table is keyed by tenant first, so a tenant's rows
-- stay together and a later split by tenant needs no schema change.
-- Times are integer milliseconds since the Unix epoch (the protocol's `ts`).

CREATE TABLE conversations (
    tenant_id      VARCHAR(32)     NOT NULL,
    id             VARCHAR(64)     NOT NULL,
    kind           VARCHAR(8)      NOT NULL,
    title          VARCHAR(256)    NULL,
    last_seq       BIGINT UNSIGNED NOT NULL DEFAULT 0,
    last_msg_id    BIGINT UNSIGNED NULL,
    created_at     BIGINT          NOT NULL,
    last_active_at BIGINT          NOT NULL,
    PRIMARY KEY (tenant_id, id),
    KEY by_activity (tenant_id, last_active_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- A member receives messages with joined_seq < seq and, once removed, seq <= left_seq.
CREATE TABLE members (
    tenant_id  VARCHAR(32)     NOT NULL,
    conv_id    VARCHAR(64)     NOT NULL,
    user_id    VARCHAR(64)     NOT NULL,
    joined_seq BIGINT UNSIGNED NOT NULL DEFAULT 0,
    left_seq   BIGINT UNSIGNED NULL,
    read_seq   BIGINT UNSIGNED NOT NULL DEFAULT 0,
    joined_at  BIGINT          NOT NULL,
    PRIMARY KEY (tenant_id, conv_id, user_id),
    KEY by_user (tenant_id, user_id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE messages (
    id            BIGINT UNSIGNED NOT NULL,
    tenant_id     VARCHAR(32)     NOT NULL,
    conv_id       VARCHAR(64)     NOT NULL,
    seq           BIGINT UNSIGNED NOT NULL,
    sender_id     VARCHAR(64)     NOT NULL,
    sender_device VARCHAR(64)     NOT NULL,
    client_msg_id VARCHAR(64)     NOT NULL,
    body          MEDIUMTEXT      NOT NULL,
    created_at    BIGINT          NOT NULL,
    PRIMARY KEY (id),
    UNIQUE KEY uq_client_msg (tenant_id, sender_id, client_msg_id),
    UNIQUE KEY uq_conv_seq (tenant_id, conv_id, seq)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- One row covers one committed batch: payload is {"ids": ["<msg id>", ...]}.
CREATE TABLE outbox_events (
    id            BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
    kind          VARCHAR(16)     NOT NULL,
    payload       MEDIUMTEXT      NOT NULL,
    status        VARCHAR(8)      NOT NULL,
    retry_count   INT UNSIGNED    NOT NULL DEFAULT 0,
    next_retry_at BIGINT          NOT NULL,
    claimed_at    BIGINT          NULL,
    last_error    VARCHAR(512)    NULL,
    created_at    BIGINT          NOT NULL,
    updated_at    BIGINT          NOT NULL,
    PRIMARY KEY (id),
    KEY by_due (status, next_retry_at, id),
    KEY by_claim (status, claimed_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- watermark: every message for this device with id <= watermark is acked.
CREATE TABLE devices (
    tenant_id     VARCHAR(32)     NOT NULL,
    user_id       VARCHAR(64)     NOT NULL,
    device_id     VARCHAR(64)     NOT NULL,
    platform      VARCHAR(8)      NOT NULL,
    watermark     BIGINT UNSIGNED NOT NULL DEFAULT 0,
    registered_at BIGINT          NOT NULL,
    last_seen_at  BIGINT          NOT NULL,
    PRIMARY KEY (tenant_id, user_id, device_id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
