-- Read-your-writes for the admin console's replica reads (FITORDER_READ_DATABASE_URL): the WAL
-- position each staff viewer's last mutation had reached once it committed. A read of that
-- viewer goes to the replica only when the replica has replayed at least this far; otherwise it
-- reads the primary. Kept in the primary so that every `serve` process sees every other's
-- writes; one row per staff viewer (members never read the replica).
CREATE TABLE read_your_writes (
    viewer text PRIMARY KEY,
    lsn pg_lsn NOT NULL,
    written_at timestamptz NOT NULL DEFAULT now()
);
