-- broker.db as the schema version 2 gateway wrote it (main at 90c6ef4), dumped with sqlite3 iterdump, for
-- the migration tests (tests/broker/old_databases.py). Written by the real broker core (tests/broker/pair.py):
-- "away" (MQTT 5, durable, q/# QoS 1 with subscription identifier 5, x/# QoS 2) disconnected; "busy" (3.1.1,
-- clean session 0, the same filters, a will) connected and not acknowledging; a durable publisher sent
-- three QoS 1 messages with properties (shared: one messages row, an outbound row each), one with an
-- expiry, a QoS 2 one (its PUBREL not sent yet) and a retained one; "busy" acknowledged the first and
-- answered the QoS 2 one with PUBREC. Do not regenerate: this is what old gateways left on disk.
BEGIN TRANSACTION;
CREATE TABLE inbound_qos2 (
    client_id TEXT NOT NULL,
    packet_id INTEGER NOT NULL,
    PRIMARY KEY (client_id, packet_id)
) WITHOUT ROWID;
INSERT INTO "inbound_qos2" VALUES('publisher',11);
CREATE TABLE messages (
    id INTEGER PRIMARY KEY,
    topic TEXT NOT NULL,
    payload BLOB NOT NULL,
    properties BLOB,
    expires_at REAL
);
INSERT INTO "messages" VALUES(1,'q/shared',X'7368617265642030',X'7B22636F6E74656E745F74797065223A22746578742F706C61696E222C22757365725F70726F70657274696573223A5B5B226B222C227630225D5D7D',NULL);
INSERT INTO "messages" VALUES(2,'q/shared',X'7368617265642031',X'7B22636F6E74656E745F74797065223A22746578742F706C61696E222C22757365725F70726F70657274696573223A5B5B226B222C227631225D5D7D',NULL);
INSERT INTO "messages" VALUES(3,'q/shared',X'7368617265642032',X'7B22636F6E74656E745F74797065223A22746578742F706C61696E222C22757365725F70726F70657274696573223A5B5B226B222C227632225D5D7D',NULL);
INSERT INTO "messages" VALUES(4,'q/expiring',X'6578706972657320696E206120646179',NULL,1700086400.0);
INSERT INTO "messages" VALUES(5,'x/2',X'65786163746C79206F6E6365',NULL,NULL);
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
INSERT INTO "meta" VALUES('schema_version','2');
CREATE TABLE outbound (
    seq INTEGER PRIMARY KEY,
    client_id TEXT NOT NULL,
    message_id INTEGER NOT NULL,
    qos INTEGER NOT NULL,
    retain INTEGER NOT NULL,
    subscription_ids TEXT,
    packet_id INTEGER,
    state INTEGER NOT NULL
);
INSERT INTO "outbound" VALUES(1,'away',1,1,0,'5',NULL,0);
INSERT INTO "outbound" VALUES(3,'away',2,1,0,'5',NULL,0);
INSERT INTO "outbound" VALUES(4,'busy',2,1,0,NULL,2,1);
INSERT INTO "outbound" VALUES(5,'away',3,1,0,'5',NULL,0);
INSERT INTO "outbound" VALUES(6,'busy',3,1,0,NULL,3,1);
INSERT INTO "outbound" VALUES(7,'away',4,1,0,'5',NULL,0);
INSERT INTO "outbound" VALUES(8,'busy',4,1,0,NULL,4,1);
INSERT INTO "outbound" VALUES(9,'away',5,2,0,NULL,NULL,0);
INSERT INTO "outbound" VALUES(10,'busy',5,2,0,NULL,5,2);
CREATE TABLE retained (
    topic TEXT PRIMARY KEY,
    payload BLOB NOT NULL,
    qos INTEGER NOT NULL,
    properties BLOB,
    expires_at REAL
) WITHOUT ROWID;
INSERT INTO "retained" VALUES('kept/state',X'6F6E',1,X'7B22636F6E74656E745F74797065223A22746578742F706C61696E227D',NULL);
CREATE TABLE sessions (
    client_id TEXT PRIMARY KEY,
    protocol_level INTEGER NOT NULL,
    expiry_interval INTEGER NOT NULL,
    username TEXT,
    disconnected_at REAL,
    will_topic TEXT,
    will_payload BLOB,
    will_qos INTEGER,
    will_retain INTEGER,
    will_properties BLOB,
    will_delay_interval INTEGER
) WITHOUT ROWID;
INSERT INTO "sessions" VALUES('away',5,3600,NULL,1700000000.0,NULL,NULL,NULL,NULL,NULL,NULL);
INSERT INTO "sessions" VALUES('busy',4,4294967295,NULL,NULL,'status/busy',X'6F66666C696E65',1,1,NULL,0);
INSERT INTO "sessions" VALUES('publisher',5,3600,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL);
CREATE TABLE subscriptions (
    client_id TEXT NOT NULL,
    topic_filter TEXT NOT NULL,
    qos INTEGER NOT NULL,
    no_local INTEGER NOT NULL,
    retain_as_published INTEGER NOT NULL,
    retain_handling INTEGER NOT NULL,
    subscription_identifier INTEGER,
    PRIMARY KEY (client_id, topic_filter)
) WITHOUT ROWID;
INSERT INTO "subscriptions" VALUES('away','q/#',1,0,0,0,5);
INSERT INTO "subscriptions" VALUES('away','x/#',2,0,0,0,NULL);
INSERT INTO "subscriptions" VALUES('busy','q/#',1,0,0,0,NULL);
INSERT INTO "subscriptions" VALUES('busy','x/#',2,0,0,0,NULL);
CREATE INDEX outbound_by_client ON outbound (client_id, seq);
CREATE INDEX outbound_by_message ON outbound (message_id);
CREATE TRIGGER outbound_release_message AFTER DELETE ON outbound
BEGIN
    DELETE FROM messages WHERE id = OLD.message_id
        AND NOT EXISTS (SELECT 1 FROM outbound WHERE message_id = OLD.message_id);
END;
COMMIT;
