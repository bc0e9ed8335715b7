-- A tenant's device epoch (docs/architecture.md section 3, "The commit's recipients
-- cache"). The worker keeps each conversation's members and their devices in memory
-- between commits instead of reading them in every transaction; the devices it keeps
-- are valid while their tenant's epoch is the one it read them under. Every write that
-- changes which devices of a tenant receive messages (a device registered, back from
-- expiry or from past its TTL, logged out, expired by the janitor, given or stripped
-- of a push token) raises the epoch in the same transaction. A tenant without a row
-- has epoch 0.
CREATE TABLE device_epochs (
    tenant_id VARCHAR(32)     NOT NULL,
    epoch     BIGINT UNSIGNED NOT NULL,
    PRIMARY KEY (tenant_id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
