-- The delivered position of a member (docs/architecture.md section 3): the highest seq
-- of the conversation that a device of the user acked once it had caught up with its
-- backlog. Moved by acks (batched by the gateways, applied by the workers through the
-- ingress streams), never backwards; a sender's delivery status counts it, with the
-- read position, which implies it.
ALTER TABLE members ADD COLUMN delivered_seq BIGINT UNSIGNED NOT NULL DEFAULT 0;
