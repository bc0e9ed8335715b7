#!/usr/bin/env python3
"""What a commit costs MariaDB by itself: its CPU per transaction for the statements a
Herald commit sends, from one client with nothing else running, against smaller
transactions of the same rows (for docs/benchmarks.md).

    python3 scripts/commit-floor.py [--db herald_capacity] [--commits 1000] [--rounds 6] [--shapes herald,block]

--db is a Herald database to copy the tables' definitions from (scripts/capacity.sh
leaves herald_capacity); the rows go to a scratch database, herald_commit_floor, dropped
at the end. Each shape runs --commits transactions per round, the shapes interleaved
round by round (the machine drifts); the medians of the rounds are printed. MariaDB's
CPU is read from /proc of the local mariadbd, so run it on the database's machine, with
nothing else using MariaDB. Needs PyMySQL (pip install pymysql).

Shapes, one message per transaction unless said:
  herald        two round trips, as the worker's commit: BEGIN, the shard's fence (a
                shared lock), the conversation's row (FOR UPDATE) and the tenant's device
                epoch; then the message, the conversation's last_seq and the fan-out's
                outbox row, each with the commit's deadline (SET STATEMENT), and COMMIT
  herald x3     the same with three messages of three conversations
  one trip      the same statements in one round trip
  checked       one round trip that checks on the server what the worker expects (an
                anonymous block, MariaDB only): the fence's token and each
                conversation's last_seq read under the same locks, the transaction
                rolled back with an error if either differs, the epoch returned, the
                writes and COMMIT
  block         the commit in one round trip as the worker sent it while it was tried
                (change 34 in docs/benchmarks.md, reverted): an anonymous block with an error handler that rolls back, the lock wait
                switched off for the locking reads and back on, the fence, the
                conversations and the epochs each counted against what is expected
                (a SIGNAL if not), the writes without a deadline, the time the block ran
                checked against the ids' freshness (2.45 s: the default 5 s settle window
                halved, less the 50 ms margin), COMMIT and the outbox row's id
  block waits   the same without the handler and the lock wait switch
  block bare    the same without the time check and the id's SELECT too
  writes only   BEGIN, the three writes and COMMIT in one round trip
  bare insert   BEGIN, the message alone and COMMIT
"""
import argparse
import os
import random
import time

import pymysql
from pymysql.constants import CLIENT

SCRATCH = "herald_commit_floor"
TABLES = ["messages", "conversations", "outbox_events", "shard_fences", "device_epochs"]
CONVERSATIONS = 1000
SHAPES = ["herald", "herald x3", "one trip", "checked", "block", "block waits", "block bare", "writes only", "bare insert"]


def mariadb_cpu_s(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def hexed(s: str) -> str:
    """A text literal as the worker writes it (`_utf8mb4 X'...'`)."""
    return "_utf8mb4 X'" + s.encode().hex() + "'"


def connect(db=None):
    return pymysql.connect(host=os.environ.get("MARIADB_HOST", "127.0.0.1"), user=os.environ.get("MARIADB_USER", "root"),
                           password=os.environ.get("MARIADB_PASSWORD", ""), database=db,
                           client_flag=CLIENT.MULTI_STATEMENTS, autocommit=True)


def run(cur, sql: str):
    cur.execute(sql)
    while cur.nextset():
        pass


class Shapes:
    def __init__(self):
        self.seqs = {}
        self.last_ids = {}
        self.next_id = 388_409_877_844_000_768 + random.randrange(10**12)

    def reads(self, convs):
        ids = ", ".join(hexed(c) for c in convs)
        return [
            "BEGIN",
            "SELECT shard, token FROM shard_fences WHERE shard IN (1) LOCK IN SHARE MODE",
            "SELECT tenant_id, id, kind, created_at, last_seq, last_msg_id, last_active_at FROM conversations "
            f"WHERE ((tenant_id = {hexed('bench')} AND id IN ({ids}))) ORDER BY tenant_id, id FOR UPDATE",
            f"SELECT tenant_id, epoch FROM device_epochs WHERE tenant_id IN ({hexed('bench')})",
        ]

    def writes(self, convs, only_message=False, deadline="SET STATEMENT max_statement_time = 0.816 FOR "):
        body = hexed('{"text":"' + "x" * 90 + '"}')
        out = []
        for c in convs:
            self.next_id += 1
            seq = self.seqs[c] = self.seqs.get(c, 0) + 1
            if not only_message:
                self.last_ids[c] = self.next_id
            out.append(f"{deadline}INSERT INTO messages (id, tenant_id, conv_id, seq, sender_id, sender_device, "
                       f"client_msg_id, body, created_at, op_digest) VALUES ({self.next_id}, {hexed('bench')}, "
                       f"{hexed(c)}, {seq}, {hexed('u-' + c)}, {hexed('d1')}, {hexed('m' + str(self.next_id))}, "
                       f"{body}, 1796671331183, {self.next_id % 10**18})")
            if only_message:
                continue
            out.append(f"{deadline}INSERT INTO conversations (tenant_id, id, kind, created_at, last_seq, last_msg_id, "
                       f"last_active_at) VALUES ({hexed('bench')}, {hexed(c)}, {hexed('direct')}, 1, {seq}, "
                       f"{self.next_id}, 1796671331183) ON DUPLICATE KEY UPDATE last_seq = VALUES(last_seq), "
                       "last_msg_id = VALUES(last_msg_id), last_active_at = VALUES(last_active_at)")
        if not only_message:
            payload = hexed('{"ids":[1]}')
            out.append(f"{deadline}INSERT INTO outbox_events (kind, payload, status, retry_count, next_retry_at, "
                       f"created_at, updated_at) VALUES ('fanout', {payload}, 'PENDING', 0, 1, 1, 1)")
        return out

    def checked(self, convs):
        expected = {c: self.seqs.get(c, 0) for c in convs}
        body = ["BEGIN NOT ATOMIC", "DECLARE t BIGINT UNSIGNED;", "DECLARE s BIGINT UNSIGNED;", "START TRANSACTION;",
                "SELECT token INTO t FROM shard_fences WHERE shard = 1 LOCK IN SHARE MODE;",
                "IF t IS NULL OR t <> 7 THEN ROLLBACK; SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'fenced'; END IF;"]
        for c in sorted(set(convs)):
            body.append(f"SELECT last_seq INTO s FROM conversations WHERE tenant_id = {hexed('bench')} "
                        f"AND id = {hexed(c)} FOR UPDATE;")
            body.append(f"IF s IS NULL OR s <> {expected[c]} THEN ROLLBACK; "
                        "SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'moved'; END IF;")
        body.append(f"SELECT tenant_id, epoch FROM device_epochs WHERE tenant_id IN ({hexed('bench')});")
        body += [w + ";" for w in self.writes(convs)]
        body += ["COMMIT;", "END"]
        return " ".join(body)

    def block(self, convs, switch=True, clock=True):
        convs = sorted(set(convs))
        expected = [(c, self.seqs.get(c, 0), self.last_ids.get(c, 0)) for c in convs]
        b = ["BEGIN NOT ATOMIC DECLARE started DATETIME(6) DEFAULT SYSDATE(6); DECLARE n BIGINT DEFAULT 0;"]
        if switch:
            b.append("DECLARE wait BIGINT DEFAULT @@SESSION.innodb_lock_wait_timeout; DECLARE EXIT HANDLER FOR "
                     "SQLEXCEPTION BEGIN SET SESSION innodb_lock_wait_timeout = wait; ROLLBACK; RESIGNAL; END;")
        b.append("START TRANSACTION;" + (" SET SESSION innodb_lock_wait_timeout = 0;" if switch else ""))
        refuse = " THEN SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'herald: commit refused: x'; END IF;"
        b.append("SELECT COUNT(*) INTO n FROM shard_fences WHERE shard IN (1) AND (shard, token) IN ((1, 7)) "
                 "LOCK IN SHARE MODE; IF n <> 1" + refuse)
        ids = ", ".join(hexed(c) for c in convs)
        rows = ", ".join(f"({hexed('bench')}, {hexed(c)}, 1, {seq}, {last})" for c, seq, last in expected)
        b.append(f"SELECT COUNT(*) INTO n FROM conversations WHERE ((tenant_id = {hexed('bench')} AND id IN ({ids}))) "
                 f"AND (tenant_id, id, created_at, last_seq, COALESCE(last_msg_id, 0)) IN ({rows}) FOR UPDATE;"
                 + (" SET SESSION innodb_lock_wait_timeout = wait;" if switch else "") + f" IF n <> {len(convs)}" + refuse)
        b.append(f"SELECT COUNT(*) INTO n FROM device_epochs WHERE (tenant_id = {hexed('bench')} AND epoch = 3); "
                 "IF n <> 1" + refuse)
        b += [w + ";" for w in self.writes(convs, deadline="")]
        if clock:
            b.append("IF TIMESTAMPDIFF(MICROSECOND, started, SYSDATE(6)) > 2450000" + refuse)
        b.append("COMMIT;" + (" SELECT LAST_INSERT_ID();" if clock else "") + " END")
        return " ".join(b)

    def transaction(self, shape):
        convs = [f"c{random.randrange(CONVERSATIONS):05d}" for _ in range(3 if shape == "herald x3" else 1)]
        if shape in ("herald", "herald x3"):
            return ["; ".join(self.reads(convs)), "; ".join(self.writes(convs) + ["COMMIT"])]
        if shape == "one trip":
            return ["; ".join(self.reads(convs) + self.writes(convs) + ["COMMIT"])]
        if shape == "checked":
            return [self.checked(convs)]
        if shape == "block":
            return [self.block(convs)]
        if shape == "block waits":
            return [self.block(convs, switch=False)]
        if shape == "block bare":
            return [self.block(convs, switch=False, clock=False)]
        if shape == "writes only":
            return ["; ".join(["BEGIN"] + self.writes(convs) + ["COMMIT"])]
        assert shape == "bare insert", shape
        # Conversations of their own: these messages leave last_seq where it is.
        return ["; ".join(["BEGIN"] + self.writes(["x" + c for c in convs], only_message=True) + ["COMMIT"])]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--db", default="herald_capacity")
    ap.add_argument("--commits", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--shapes", default=",".join(SHAPES), help="the shapes to run, comma-separated (the names above)")
    args = ap.parse_args()
    names = [n.strip() for n in args.shapes.split(",") if n.strip()]
    unknown = [n for n in names if n not in SHAPES]
    if unknown or not names:
        ap.error(f"unknown shape(s) {', '.join(map(repr, unknown))}: choose from {', '.join(SHAPES)}")
    pids = os.popen("pgrep -x mariadbd || pgrep -x mysqld").read().split()
    if not pids:
        raise SystemExit("commit-floor.py: no local mariadbd to read the CPU of")
    pid = int(pids[0])

    admin = connect()
    cur = admin.cursor()
    run(cur, f"DROP DATABASE IF EXISTS {SCRATCH}; CREATE DATABASE {SCRATCH}")
    for t in TABLES:
        run(cur, f"CREATE TABLE {SCRATCH}.{t} LIKE {args.db}.{t}")
    rows = ", ".join(f"('bench', 'c{i:05d}', 'direct', NULL, 0, NULL, 1, 1)" for i in range(CONVERSATIONS))
    run(cur, f"INSERT INTO {SCRATCH}.shard_fences VALUES (1, 7); INSERT INTO {SCRATCH}.device_epochs VALUES ('bench', 3); "
             f"INSERT INTO {SCRATCH}.conversations VALUES {rows}")

    conn = connect(SCRATCH)
    c = conn.cursor()
    shapes = Shapes()
    results = {n: [] for n in names}
    try:
        for r in range(args.rounds):
            for name in names:
                cpu0, wall0 = mariadb_cpu_s(pid), time.monotonic()
                for _ in range(args.commits):
                    for trip in shapes.transaction(name):
                        run(c, trip)
                cpu, wall = mariadb_cpu_s(pid) - cpu0, time.monotonic() - wall0
                results[name].append((cpu / args.commits * 1e6, wall / args.commits * 1e6))
            print(f"round {r + 1} of {args.rounds} done", flush=True)
    finally:
        conn.close()
        run(cur, f"DROP DATABASE IF EXISTS {SCRATCH}")
        admin.close()

    print("| shape | MariaDB CPU us per transaction, median (min - max) | wall us per transaction, median |")
    print("|---|---|---|")
    for name in names:
        cpu = sorted(x[0] for x in results[name])
        wall = sorted(x[1] for x in results[name])
        print(f"| {name} | {cpu[len(cpu) // 2]:.0f} ({cpu[0]:.0f} - {cpu[-1]:.0f}) | {wall[len(wall) // 2]:.0f} |")


if __name__ == "__main__":
    main()
