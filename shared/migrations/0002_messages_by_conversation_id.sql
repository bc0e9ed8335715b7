-- A device's overflow band (messages of its conversations with ids in a range, read
-- from MySQL instead of its pending set) is a range scan per conversation.
ALTER TABLE messages ADD KEY by_conv_id (tenant_id, conv_id, id);
