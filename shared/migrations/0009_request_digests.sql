-- A client key (`cmid`) names one request: a repeat answers its first commit only when
-- it is the same request (docs/protocol.md section 4.2). `op_digest` is the 64-bit
-- digest of what a row's request asked for (a send's conversation and body; a change's
-- conversation and operation with its target and body), so a key reused for another
-- operation, target or body is a conflict. NULL on rows committed before this column:
-- their repeats are answered as before.
ALTER TABLE messages ADD COLUMN op_digest BIGINT UNSIGNED NULL;
