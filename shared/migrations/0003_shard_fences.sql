-- Fencing tokens of the ingress shards: a worker that takes a shard's lease bumps the
-- shard's token, and every commit of that shard checks the token it took, so a worker
-- whose lease lapsed (a Redis that lost the lease keys, a long pause) cannot commit
-- next to the new owner and reorder a conversation's messages.
CREATE TABLE shard_fences (
    shard INT UNSIGNED    NOT NULL,
    token BIGINT UNSIGNED NOT NULL,
    PRIMARY KEY (shard)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
