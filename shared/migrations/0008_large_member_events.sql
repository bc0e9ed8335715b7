-- A membership change of a group of the largest size must be storable: a
-- `member_added` event of `gateway.max_group_size` users of 64 characters each, every
-- character possibly escaped in JSON, is about 131 bytes a user (131 KB for 1 000),
-- over TEXT's 64 KiB. MEDIUMTEXT holds 16 MiB; the gateway refuses to start with a
-- `gateway.max_group_size` whose largest event would not fit (at most 100 000 members).
ALTER TABLE messages MODIFY event MEDIUMTEXT NULL;
